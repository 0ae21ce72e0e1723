"""A small self-written problem set: stdin and call problems, every comparison mode and a
special checker, each with a reference solution and deliberately wrong solutions whose
verdict is known (wrong answer, time limit, memory limit, runtime error, endless output,
compile error). Tests are generated from fixed seeds."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from .model import Problem, TestCase, Verdict


@dataclass(frozen=True)
class WrongSolution:
    problem_id: str
    verdict: Verdict  # what the judge must say (the verdict of the first failing test)
    code: str
    why: str


def _a_plus_b() -> Problem:
    rng = random.Random(1)
    pairs = [(1, 2), (-5, 5), (0, 0), (10**18, 10**18)] + [(rng.randint(-10**9, 10**9), rng.randint(-10**9, 10**9)) for _ in range(8)]
    return Problem(
        id="a_plus_b",
        statement="Read two integers a and b (|a|, |b| <= 10^18) on one line. Print a + b.",
        tests=[TestCase(input=f"{a} {b}\n", output=f"{a + b}\n") for a, b in pairs],
        time_limit_s=2.0,
        compare="whitespace",
        solutions=["a, b = map(int, input().split())\nprint(a + b)\n"],
    )


def _sort_numbers() -> Problem:
    rng = random.Random(2)
    tests = []
    for n in (1, 2, 5, 10, 100, 1000, 20000, 20000):
        xs = [rng.randint(-10**6, 10**6) for _ in range(n)]
        tests.append(TestCase(input=f"{n}\n{' '.join(map(str, xs))}\n", output=" ".join(map(str, sorted(xs))) + "\n"))
    return Problem(
        id="sort_numbers",
        statement="Read n (1 <= n <= 20000) and n integers. Print them in non-decreasing order on one line, separated by spaces.",
        tests=tests,
        time_limit_s=2.0,
        compare="lines",
        solutions=["import sys\nd = sys.stdin.read().split()\nn = int(d[0])\nprint(' '.join(map(str, sorted(map(int, d[1:n + 1])))))\n"],
    )


def _average() -> Problem:
    rng = random.Random(3)
    tests = []
    for n in (1, 2, 3, 7, 50, 1000):
        xs = [rng.randint(-1000, 1000) for _ in range(n)]
        tests.append(TestCase(input=f"{n}\n{' '.join(map(str, xs))}\n", output=f"{sum(xs) / n:.9f}\n"))
    return Problem(
        id="average",
        statement="Read n and n integers. Print their mean; an absolute or relative error up to 1e-6 is accepted.",
        tests=tests,
        time_limit_s=2.0,
        compare="float",
        float_tol=1e-6,
        solutions=["n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n)\n"],
    )


PAIR_SUM_CHECKER = """
def check(input, output, expected):
    lines = input.split()
    n, target = int(lines[0]), int(lines[1])
    a = [int(x) for x in lines[2:2 + n]]
    got = output.split()
    if len(got) != 2:
        return False
    try:
        i, j = int(got[0]), int(got[1])
    except ValueError:
        return False
    return 1 <= i < j <= n and a[i - 1] + a[j - 1] == target
"""


def _pair_sum() -> Problem:
    rng = random.Random(4)
    tests = []
    for n in (2, 3, 10, 100, 5000):
        a = [rng.randint(1, 10**6) for _ in range(n)]
        i, j = sorted(rng.sample(range(n), 2))
        target = a[i] + a[j]
        tests.append(TestCase(input=f"{n} {target}\n{' '.join(map(str, a))}\n", output=f"{i + 1} {j + 1}\n"))
    return Problem(
        id="pair_sum",
        statement="Read n, a target t and n integers a_1..a_n. Print any i < j with a_i + a_j = t (one exists).",
        tests=tests,
        time_limit_s=2.0,
        checker=PAIR_SUM_CHECKER,
        solutions=[
            ("import sys\nd = list(map(int, sys.stdin.read().split()))\nn, t, a = d[0], d[1], d[2:]\nseen = {}\n"
             "for j, x in enumerate(a):\n    if t - x in seen:\n        print(seen[t - x] + 1, j + 1)\n        break\n"
             "    seen.setdefault(x, j)\n")
        ],
    )


def _count_primes() -> Problem:
    def count(n: int) -> int:
        if n < 2:
            return 0
        sieve = bytearray([1]) * (n + 1)
        sieve[0:2] = b"\x00\x00"
        for p in range(2, int(n**0.5) + 1):
            if sieve[p]:
                sieve[p * p :: p] = bytearray(len(range(p * p, n + 1, p)))
        return sum(sieve)

    ns = [1, 2, 10, 100, 1000, 100000, 1000000]
    return Problem(
        id="count_primes",
        statement="Read N (1 <= N <= 10^6). Print the number of primes <= N.",
        tests=[TestCase(input=f"{n}\n", output=f"{count(n)}\n") for n in ns],
        time_limit_s=3.0,
        memory_mb=256,
        compare="exact",
        solutions=[
            ("n = int(input())\nif n < 2:\n    print(0)\nelse:\n    s = bytearray([1]) * (n + 1)\n    s[0:2] = b'\\x00\\x00'\n"
             "    for p in range(2, int(n ** 0.5) + 1):\n        if s[p]:\n            s[p * p::p] = bytearray(len(range(p * p, n + 1, p)))\n"
             "    print(sum(s))\n")
        ],
    )


def _max_subarray() -> Problem:
    rng = random.Random(6)
    cases = [[1], [-3], [-2, 1, -3, 4, -1, 2, 1, -5, 4], [5, 4, -1, 7, 8]]
    cases += [[rng.randint(-100, 100) for _ in range(n)] for n in (10, 100, 3000)]

    def best(xs: list[int]) -> int:
        cur, top = 0, xs[0]
        for x in xs:
            cur = max(x, cur + x)
            top = max(top, cur)
        return top

    return Problem(
        id="max_subarray",
        statement="LeetCode style: implement Solution.maxSubArray(nums) returning the largest sum of a non-empty contiguous subarray.",
        kind="call",
        fn_name="maxSubArray",
        starter_code="class Solution:\n    def maxSubArray(self, nums: list[int]) -> int:\n        ",
        tests=[TestCase(input=json.dumps([xs]), output=json.dumps(best(xs))) for xs in cases],
        time_limit_s=2.0,
        solutions=[
            ("class Solution:\n    def maxSubArray(self, nums):\n        cur, top = 0, nums[0]\n        for x in nums:\n"
             "            cur = max(x, cur + x)\n            top = max(top, cur)\n        return top\n")
        ],
    )


def _is_palindrome() -> Problem:
    words = ["racecar", "Level", "abc", "", "a", "Never odd or even", "palindrome", "No lemon, no melon"]

    def pal(s: str) -> bool:
        t = [c.lower() for c in s if c.isalnum()]
        return t == t[::-1]

    return Problem(
        id="is_palindrome",
        statement="APPS style: write a function is_palindrome(s) -> bool, ignoring case and non-alphanumeric characters.",
        kind="call",
        fn_name="is_palindrome",
        tests=[TestCase(input=json.dumps([w]), output=json.dumps([pal(w)])) for w in words],
        unwrap_list_answer=True,  # answers wrapped in a list, as APPS stores them
        time_limit_s=2.0,
        solutions=["def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n"],
    )


def problems() -> list[Problem]:
    return [_a_plus_b(), _sort_numbers(), _average(), _pair_sum(), _count_primes(), _max_subarray(), _is_palindrome()]


def wrong_solutions() -> list[WrongSolution]:
    W = WrongSolution
    return [
        W("a_plus_b", "WA", "a, b = map(int, input().split())\nprint(a - b)\n", "subtracts"),
        W("a_plus_b", "RE", "a = int(input())\nprint(a)\n", "reads both numbers as one int: ValueError"),
        W("a_plus_b", "OLE", "while True:\n    print('1' * 100)\n", "prints forever"),
        W("a_plus_b", "CE", "a, b = map(int, input().split()\nprint(a + b)\n", "a syntax error"),
        W("a_plus_b", "TLE", "a, b = map(int, input().split())\nwhile True:\n    pass\n", "never ends"),
        W("sort_numbers", "WA", "input()\nprint(' '.join(sorted(input().split())))\n", "sorts as strings"),
        W("average", "WA", "n = int(input())\nprint(sum(map(int, input().split())) // n)\n", "integer division"),
        W("pair_sum", "WA", "print(1, 2)\n", "always the first two"),
        W("count_primes", "TLE",
          "n = int(input())\nprint(sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, k))))\n",
          "trial division by every smaller number"),  # fmt: skip
        W("count_primes", "MLE", "n = int(input())\nmarks = [0] * (n * 1000 + 10**9)\nprint(len(marks))\n", "allocates gigabytes"),
        W("max_subarray", "WA", "class Solution:\n    def maxSubArray(self, nums):\n        return sum(x for x in nums if x > 0)\n",
          "sums the positives"),  # fmt: skip
        W("max_subarray", "RE", "class Solution:\n    def maxSubArray(self, nums):\n        return nums[len(nums)]\n", "IndexError"),
        W("is_palindrome", "WA", "def is_palindrome(s):\n    return s == s[::-1]\n", "case- and punctuation-sensitive"),
    ]


def problem(problem_id: str) -> Problem:
    for p in problems():
        if p.id == problem_id:
            return p
    raise KeyError(problem_id)
