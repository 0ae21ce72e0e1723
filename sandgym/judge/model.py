"""Problems, tests and verdicts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# AC accepted, WA wrong answer, TLE time limit, MLE memory limit, RE runtime error, OLE output
# limit (endless output), CE the code does not compile, SKIP not run (an earlier test failed),
# JE the judge itself failed.
Verdict = Literal["AC", "WA", "TLE", "MLE", "RE", "OLE", "CE", "SKIP", "JE"]
CompareMode = Literal["exact", "lines", "whitespace", "float"]


class TestCase(BaseModel):
    """stdin tests: `input` is fed on stdin and stdout is compared with `output`. Call tests:
    `input` is a JSON list of arguments and `output` the JSON of the return value."""

    model_config = ConfigDict(frozen=True)
    __test__ = False  # not a pytest class

    input: str
    output: str


class Problem(BaseModel):
    id: str
    statement: str = ""
    kind: Literal["stdin", "call"] = "stdin"
    fn_name: str | None = None  # call tests: a method of class Solution, or a top-level function
    starter_code: str = ""
    tests: list[TestCase]
    time_limit_s: float = Field(2.0, gt=0)
    memory_mb: int = Field(256, ge=16)
    compare: CompareMode = "whitespace"
    float_tol: float = 1e-6  # absolute or relative, for compare="float"
    # Call tests: also accept the return value equal to the first element of a list answer
    # (APPS/TACO store call answers wrapped in a list, and their own harness accepts both).
    unwrap_list_answer: bool = False
    checker: str | None = None  # Python source defining check(input, output, expected) -> bool
    solutions: list[str] = Field(default_factory=list)  # reference solutions (for the oracle)
    source: str = ""


class TestResult(BaseModel):
    verdict: Verdict
    time_s: float = 0.0
    cpu_s: float = 0.0
    memory_kb: int = 0
    detail: str = ""


class JudgeResult(BaseModel):
    verdict: Verdict  # of the first test that did not pass (AC when all did)
    passed: int
    total: int
    tests: list[TestResult]
    compile_error: str = ""
    wall_s: float = 0.0

    @property
    def fraction(self) -> float:
        """Partial credit: tests passed over all tests (exact only when every test ran)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def accepted(self) -> bool:
        return self.total > 0 and self.passed == self.total
