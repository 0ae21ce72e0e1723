"""The per-class and per-function caches behind `marked` and `wanted_kwargs` answer as a
fresh look would: overrides, several classes and instances, bound and plain callables."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.core.calls import call_with_named, wanted_kwargs
from sandgym.core.decorators import CLEANUP, STOP, cleanup, marked, stop


class Base:
    @stop
    def done(self, state: dict) -> bool:
        return False

    @cleanup
    def tidy(self, state: dict) -> None: ...


class Child(Base):
    def done(self, state: dict) -> bool:  # overridden without the mark: no longer a stop
        return True

    @stop
    def limit(self, state: dict) -> bool:
        return True


def test_marked_per_class_and_instance() -> None:
    a, b, c = Base(), Base(), Child()
    for _ in range(2):  # the second answer comes from the cache
        assert [m.__name__ for m in marked(a, STOP)] == ["done"]
        assert [m.__name__ for m in marked(c, STOP)] == ["limit"]
        assert [m.__name__ for m in marked(c, CLEANUP)] == ["tidy"]
    # Bound to the instance asked about, not to the first one cached.
    assert marked(b, STOP)[0].__self__ is b and marked(a, STOP)[0].__self__ is a


class Scorer:
    def __init__(self, k: int) -> None:
        self.k = k

    def score(self, completion: str, answer: str) -> float:
        return self.k * float(completion == answer)


@pytest.mark.anyio
async def test_wanted_kwargs_bound_plain_and_var_keyword() -> None:
    avail: dict[str, Any] = {"completion": "x", "answer": "x", "state": {}}
    one, two = Scorer(1), Scorer(2)
    for _ in range(2):
        assert wanted_kwargs(one.score, avail) == {"completion": "x", "answer": "x"}
        assert await call_with_named(one.score, avail) == 1.0
        assert await call_with_named(two.score, avail) == 2.0  # its own instance

    def plain(state: dict, *, answer: str) -> str:
        return answer

    def everything(**kw: Any) -> int:
        return len(kw)

    assert wanted_kwargs(plain, avail) == {"state": {}, "answer": "x"}
    assert await call_with_named(everything, avail) == 3
    assert await call_with_named(lambda completion: completion * 2, avail) == "xx"
