import math
from math import comb

import pytest

from sandgym.core.parsers import BoxedParser, CodeBlockParser, Parser, ThinkParser, XMLParser
from sandgym.core.stats import group_advantages, ks_for, pass_at_k


def test_code_block_parser_prefers_last_python_block() -> None:
    text = "first\n```bash\nls\n```\nthen\n```python\nx = 1\n```\nand\n```py\nx = 2\n```\n"
    assert CodeBlockParser().parse(text) == "x = 2\n"
    assert CodeBlockParser(language=None).parse("```\nplain\n```") == "plain\n"
    assert CodeBlockParser().parse("no code here") is None
    # a completion cut off inside its fence still yields the code
    assert CodeBlockParser().parse("```python\ndef f():\n    return 1") == "def f():\n    return 1"


def test_think_xml_boxed_parsers() -> None:
    assert ThinkParser().parse("<think>hmm</think> 42 ") == "42"
    assert ThinkParser().parse("<think>unfinished") is None
    assert ThinkParser().format_ok([{"role": "assistant", "content": "<think>a</think>b"}])
    xml = XMLParser(["think", ("answer", "final")])
    parsed = xml.parse("<think>x</think><final> 7 </final>")
    assert parsed == {"think": "x", "answer": "7"}
    assert xml.parse_answer([{"role": "user", "content": "<answer>no</answer>"}, {"role": "assistant", "content": "<answer>9</answer>"}]) == "9"
    assert BoxedParser().parse(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert BoxedParser().parse(r"\boxed{open") is None
    assert Parser().parse_answer([{"role": "assistant", "content": "  hi "}]) == "hi"


@pytest.mark.parametrize("n,c,k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (10, 3, 5), (20, 0, 7), (20, 19, 2), (16, 16, 16), (7, 3, 5)])
def test_pass_at_k_matches_formula(n: int, c: int, k: int) -> None:
    expected = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_bad_input_and_ks() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_group_advantages() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    adv = group_advantages(rewards)
    assert sum(adv) == pytest.approx(0.0)
    assert adv[0] == pytest.approx(1.0, rel=1e-4) and adv[1] == pytest.approx(-1.0, rel=1e-4)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([2.0, 0.0], normalize_std=False) == [1.0, -1.0]


def _ref_advantages(rewards: list[float], groups: list[int], scale: bool, eps: float) -> list[float]:
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, gg in zip(rewards, groups) if gg == g]
        mean = sum(members) / len(members)
        var = sum((x - mean) ** 2 for x in members) / len(members)
        out.append((r - mean) / (math.sqrt(var) + eps) if scale else r - mean)
    return out


@pytest.mark.parametrize("scale", [True, False])
def test_group_advantages_against_float64_reference(scale: bool) -> None:
    """The trainer's use: one call per rollout group (formerly sandgym.train.loss's copy)."""
    rewards = [0.0, 1.0, 1.0, 0.5, 3.0, 3.0, 3.0, 3.0, -1.0, 2.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    got = [
        a
        for gid in sorted(set(groups))
        for a in group_advantages([r for r, g in zip(rewards, groups) if g == gid], normalize_std=scale, eps=1e-6)
    ]
    assert got == pytest.approx(_ref_advantages(rewards, groups, scale, 1e-6), rel=1e-12, abs=1e-12)
    # A group with identical rewards carries no signal.
    assert got[4:8] == [0.0] * 4
    # Dr. GRPO (no std scaling) keeps the reward scale.
    if not scale:
        assert got[8:] == pytest.approx([-1.5, 1.5])
    # A group whose spread is below eps counts as identical rewards (float noise is no signal).
    assert group_advantages([0.1, 0.1 + 1e-9], eps=1e-6) == [0.0, 0.0]
    assert group_advantages([0.1, 0.1 + 1e-9], eps=1e-12) == pytest.approx([-1.0, 1.0], rel=1e-2)
