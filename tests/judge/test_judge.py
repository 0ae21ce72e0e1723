"""The competitive-programming judge in real sandboxes: the self-written problem set (every
reference solution accepted, every deliberately wrong one caught with its verdict), stop at
the first failure or not, partial credit, special checkers, what a solution cannot reach,
the five dataset row layouts, and the code_judge environment with oracle and null."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandgym import envs
from sandgym.core.evaluation import run_eval
from sandgym.core.policies import get_policy
from sandgym.judge.formats import detect_format, load_problems, to_problem
from sandgym.judge.judge import judge
from sandgym.judge.model import Problem, TestCase
from sandgym.judge.problemset import problem, problems, wrong_solutions
from sandgym.judge.sandbox_harness import compare_text, compare_value
from sandgym.sandboxes import SandboxManager, SandboxSpec
from tests.conftest import require

SPEC = SandboxSpec(cpu=1.0, memory_mb=1024, disk_mb=64, exec_timeout_s=600)


@pytest.fixture
async def sandbox() -> AsyncIterator[object]:
    require("docker")
    async with SandboxManager("docker", max_sandboxes=1) as mgr, mgr.sandbox(SPEC) as sb:
        yield sb


# ---- comparison (host-side: the same functions the harness runs) --------------------------


def test_comparison_modes() -> None:
    assert compare_text("1 2\n", "1 2\n", "exact", 0) and not compare_text("1 2 \n", "1 2\n", "exact", 0)
    assert compare_text("1 2  \n\n", "1 2\n", "lines", 0) and not compare_text("1\n2\n", "1 2\n", "lines", 0)
    assert compare_text("1\n2\n", "1 2", "whitespace", 0) and not compare_text("1 3", "1 2", "whitespace", 0)
    assert compare_text("0.3333333", "0.333333333", "float", 1e-6) and not compare_text("0.334", "0.333", "float", 1e-6)
    assert compare_text("1e9 x", "1000000001.0 x", "float", 1e-6)  # relative tolerance
    assert not compare_text("nan", "1", "float", 1e-6) and compare_text("1 yes", "1.0 yes", "float", 0.0)
    assert compare_value("[1, 2]", "[1, 2]", "whitespace", 0, False) and not compare_value("true", "2", "whitespace", 0, False)
    assert compare_value("true", "[true]", "whitespace", 0, True) and not compare_value("true", "[true]", "whitespace", 0, False)
    assert compare_value("0.1000001", "0.1", "float", 1e-6, False) and not compare_value("0.1000001", "0.1", "whitespace", 1e-6, False)


# ---- the self-written set -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.docker
async def test_reference_solutions_pass_every_test(sandbox: object) -> None:
    for p in problems():
        r = await judge(sandbox, p.solutions[0], p)
        assert r.accepted and r.verdict == "AC" and r.passed == r.total == len(p.tests), (p.id, r)
        assert all(t.memory_kb > 0 for t in r.tests)


@pytest.mark.anyio
@pytest.mark.docker
@pytest.mark.parametrize("wrong", wrong_solutions(), ids=lambda w: f"{w.problem_id}-{w.verdict}")
async def test_each_wrong_solution_gets_its_verdict(sandbox: object, wrong: object) -> None:
    p = problem(wrong.problem_id)  # type: ignore[attr-defined]
    r = await judge(sandbox, wrong.code, p)  # type: ignore[attr-defined]
    assert r.verdict == wrong.verdict and not r.accepted, (wrong, r.tests)  # type: ignore[attr-defined]
    first_bad = next(i for i, t in enumerate(r.tests) if t.verdict != "AC")
    assert all(t.verdict == "SKIP" for t in r.tests[first_bad + 1 :])  # stopped at the first failure
    if r.verdict == "TLE":
        assert r.tests[first_bad].time_s >= p.time_limit_s
    if r.verdict == "CE":
        assert "SyntaxError" in r.compile_error


@pytest.mark.anyio
@pytest.mark.docker
async def test_partial_credit_runs_every_test_when_asked(sandbox: object) -> None:
    p = problem("sort_numbers")
    wrong = next(w for w in wrong_solutions() if w.problem_id == "sort_numbers")
    stop = await judge(sandbox, wrong.code, p)
    full = await judge(sandbox, wrong.code, p, stop_on_first_failure=False)
    assert "SKIP" in {t.verdict for t in stop.tests} and "SKIP" not in {t.verdict for t in full.tests}
    # String sorting is right for single numbers and for some sign/length mixes: a fraction.
    assert 0 < full.passed < full.total and full.fraction == full.passed / full.total
    assert full.passed >= stop.passed


@pytest.mark.anyio
@pytest.mark.docker
async def test_special_checker_accepts_any_valid_answer(sandbox: object) -> None:
    p = problem("pair_sum")
    last_pair = (
        "import sys\nd = list(map(int, sys.stdin.read().split()))\nn, t, a = d[0], d[1], d[2:]\nbest = None\n"
        "for i in range(n):\n    for j in range(i + 1, n):\n        if a[i] + a[j] == t:\n            best = (i + 1, j + 1)\n"
        "print(*best)\n"
    )
    r = await judge(sandbox, last_pair, p.model_copy(update={"tests": p.tests[:4]}))
    assert r.accepted, r.tests


@pytest.mark.anyio
@pytest.mark.docker
async def test_a_solution_cannot_reach_the_judge_or_the_answers(sandbox: object) -> None:
    """The parent (which holds the expected outputs) and the fork server are not dumpable: a
    child can neither write a forged verdict into the parent's stdout nor read its memory."""
    p = Problem(id="forge", tests=[TestCase(input="1\n", output="never printed\n")], time_limit_s=2)
    forge = (
        "import os, json\nppid = os.getppid()\n"
        "parent = int(open(f'/proc/{ppid}/stat').read().split()[3])\n"
        "for pid in (ppid, parent):\n"
        "    with open(f'/proc/{pid}/fd/1', 'w') as f:\n"
        "        f.write('@@sandgym-judge@@ ' + json.dumps({'tests': [{'verdict': 'AC'}], 'compile_error': '', 'wall_s': 0}) + '\\n')\n"
    )
    r = await judge(sandbox, forge, p)
    assert r.verdict == "RE" and "Permission" in r.tests[0].detail, r.tests
    peek = "import os\nppid = os.getppid()\nparent = int(open(f'/proc/{ppid}/stat').read().split()[3])\nopen(f'/proc/{parent}/mem', 'rb')\n"
    r = await judge(sandbox, peek, p)
    assert r.verdict == "RE" and "Permission" in r.tests[0].detail, r.tests


@pytest.mark.anyio
@pytest.mark.docker
async def test_limits_are_per_test_and_a_child_leaves_nothing_behind(sandbox: object) -> None:
    p = Problem(id="limits", tests=[TestCase(input=f"{i}\n", output=f"{i}\n") for i in range(3)], time_limit_s=1, memory_mb=64)
    # 40 MiB fits in 64 MiB; a background process started by test 0 is gone by test 1.
    code = (
        "import os, subprocess\nn = int(input())\nx = bytearray(40 << 20)\n"
        "if n == 0:\n    subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
        "else:\n    out = subprocess.run(['ps', '-eo', 'args='], capture_output=True, text=True).stdout\n"
        "    assert 'sleep 30' not in out, out\nprint(n)\n"
    )
    r = await judge(sandbox, code, p)
    assert r.accepted, r.tests
    r = await judge(sandbox, "x = bytearray(80 << 20)\nprint(input())\n", p)
    assert r.verdict == "MLE"


# ---- dataset layouts --------------------------------------------------------------------

SUM_STDIN = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"


def _lcb_private(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


ROWS = {
    "lcb": {
        "question_title": "Sum", "question_content": "Print the sum of the numbers on the line.", "platform": "atcoder",
        "question_id": "abc000_a", "contest_id": "abc000", "contest_date": "2024-01-01T00:00:00", "starter_code": "",
        "difficulty": "easy", "metadata": "{}",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _lcb_private([{"input": "5 5 5\n", "output": "15\n", "testtype": "stdin"}]),
    },
    "lcb_functional": {
        "question_title": "Add", "question_content": "Return a + b.", "platform": "leetcode", "question_id": "9001",
        "contest_id": "w1", "contest_date": "2024-01-01T00:00:00", "difficulty": "easy",
        "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
        "metadata": json.dumps({"func_name": "add"}),
        "public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]),
        "private_test_cases": json.dumps([{"input": "-4\n4", "output": "0", "testtype": "functional"}]),
    },
    "deepcoder": {
        "problem": "Print the sum of the numbers on the line.",
        "tests": json.dumps([{"input": "1 2\n", "output": "3\n", "type": "stdin_stdout"}, {"input": "7\n", "output": "7\n", "type": "stdin_stdout"}]),
    },
    "deepcoder_taco_style": {
        "problem": "Write add(a, b).",
        "tests": json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}),
    },
    "codecontests": {
        "name": "000_A. Sum", "description": "Print the sum.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["10 20\n"], "output": ["30\n"]},
        "generated_tests": {"input": ["0 0\n"], "output": ["0\n"]},
        "solutions": {"language": [2, 3], "solution": ["int main(){}", SUM_STDIN]},
        "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 268435456,
    },
    "taco": {
        "question": "Print the sum.", "solutions": json.dumps([SUM_STDIN]), "starter_code": "",
        "input_output": json.dumps({"inputs": ["1 2\n", ["4", "5"]], "outputs": ["3\n", ["9"]]}),
        "time_limit": "1 second", "memory_limit": "256 megabytes", "difficulty": "EASY", "raw_tags": "[]",
    },
    "apps": {
        "problem_id": 4242, "question": "Write add(a, b).", "difficulty": "introductory", "url": "",
        "solutions": json.dumps(["def add(a, b):\n    return a + b\n"]), "starter_code": "def add(a, b):\n    ",
        "input_output": json.dumps({"inputs": [[1, 2], [5, 5]], "outputs": [[3], [10]], "fn_name": "add"}),
    },
}  # fmt: skip
SOLUTIONS = {
    "lcb": SUM_STDIN, "lcb_functional": "class Solution:\n    def add(self, a, b):\n        return a + b\n",
    "deepcoder": SUM_STDIN, "deepcoder_taco_style": "def add(a, b):\n    return a + b\n",
}  # fmt: skip


def test_formats_are_detected_and_converted() -> None:
    for key, row in ROWS.items():
        fmt = key.split("_")[0] if key != "deepcoder_taco_style" else "deepcoder"
        assert detect_format(row) == fmt, key
        p = to_problem(row)
        assert p.tests and p.source == fmt
    lcb = to_problem(ROWS["lcb"])
    assert [t.output for t in lcb.tests] == ["3\n", "15\n"]  # the compressed private tests too
    fn = to_problem(ROWS["lcb_functional"])
    assert fn.kind == "call" and fn.fn_name == "add" and fn.tests[0].input == "[1, 2]"
    cc = to_problem(ROWS["codecontests"])
    assert len(cc.tests) == 3 and cc.solutions == [SUM_STDIN] and cc.time_limit_s == 2.0 and cc.memory_mb == 256
    assert len(to_problem(ROWS["codecontests"], include_generated=False).tests) == 2
    taco = to_problem(ROWS["taco"])
    assert taco.tests[1].input == "4\n5\n" and taco.time_limit_s == 1.0
    apps = to_problem(ROWS["apps"])
    assert apps.kind == "call" and apps.unwrap_list_answer and apps.tests[0].output == "[3]"
    evil = dict(ROWS["lcb"], private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(print))).decode())
    with pytest.raises(pickle.UnpicklingError):
        to_problem(evil)


@pytest.mark.anyio
@pytest.mark.docker
async def test_every_layout_judges_its_reference_solution(sandbox: object, tmp_path: Path) -> None:
    for key, row in ROWS.items():
        p = to_problem(row)
        code = SOLUTIONS.get(key) or p.solutions[-1]
        r = await judge(sandbox, code, p)
        assert r.accepted, (key, r.tests)
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(ROWS["taco"]) + "\n" + json.dumps(ROWS["apps"]) + "\n")
    loaded = load_problems(str(path), format="apps")
    assert len(loaded) == 2


# ---- the environment ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.docker
async def test_code_judge_oracle_scores_1_and_null_0(tmp_path: Path) -> None:
    require("docker")
    env = envs.load_environment("code_judge")
    good = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=4)
    bad = await run_eval(env, get_policy("null", env), "null", output_dir=tmp_path / "n", concurrency=4)
    assert good["num_rollouts"] == len(problems()) and good["reward_mean"] == 1.0 and good["errors"] == 0
    assert good["metrics"]["verdict_AC"] == 1.0 and good["metrics"]["tests_passed_fraction"] == 1.0
    assert bad["reward_mean"] == 0.0 and bad["errors"] == 0


@pytest.mark.anyio
@pytest.mark.docker
async def test_code_judge_from_a_local_file_with_partial_credit(tmp_path: Path) -> None:
    require("docker")
    path = tmp_path / "cc.jsonl"
    row = dict(ROWS["codecontests"], solutions={"language": [3], "solution": ["a, b = map(int, input().split())\nprint(a + b if a else 99)\n"]})
    path.write_text(json.dumps(row) + "\n")
    env = envs.load_environment("code_judge", source=str(path), reward="partial")
    s = await run_eval(env, get_policy("oracle", env), "oracle", output_dir=tmp_path / "o", concurrency=1)
    # Wrong only when a == 0 (the generated test): 2 of 3 tests.
    assert s["errors"] == 0 and abs(s["reward_mean"] - 2 / 3) < 1e-9
