"""A competitive-programming judge that runs every test of a problem in one sandbox exec.

- model: problems, tests, limits, verdicts (pydantic).
- sandbox_harness, zygote: the in-sandbox judge (a parent that compares, and a fork server
  that runs each test in a fresh child with its own time, memory and output limits),
  standard library only; program: how they go into a sandbox with no sandgym (as text).
- judge: `judge(sandbox, code, problem)` -> per-test verdicts, partial credit.
- formats: LiveCodeBench, DeepCoder, CodeContests, TACO and APPS rows as problems, loaded
  with `datasets` by name or from local files.
- problemset: a small self-written problem set with reference solutions and deliberately
  wrong ones (wrong answer, time limit, memory limit, runtime error, endless output).
"""
