"""The command line as a user runs it (subprocesses): a user's mistake is one line on stderr
and exit status 2, with the traceback only under -v; a bug keeps its traceback (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.cli.errors import user_error_message
from sandgym.errors import UnknownNameError
from sandgym.sandboxes.errors import SandboxFileNotFound, SpecError

ROOT = Path(__file__).resolve().parents[2]
BOX = {chr(c) for c in range(0x2500, 0x2580)}  # rich's panels and traceback frames


def sandgym(*args: str, tmp_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(ROOT)] + ([str(tmp_path)] if tmp_path else [])
    return subprocess.run(
        [sys.executable, "-m", "sandgym", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path), "COLUMNS": "100"},
    )


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    (tmp_path / "bad.toml").write_text("[optim]\nsteps = \n")
    (tmp_path / "unknown_key.toml").write_text((ROOT / "examples" / "toy.toml").read_text() + "\n[rollout_extra]\nx = 1\n")
    (tmp_path / "bad_value.toml").write_text('[optim]\nlr = "fast"\n')
    (tmp_path / "crashing_env.py").write_text("def load_environment(**kw):\n    raise RuntimeError('a bug in an environment')\n")
    return tmp_path


# (argv with {tmp} for the fixture's directory, what the one line must say)
CASES = [
    (["eval", "no_such_env", "--policy", "oracle"], "unknown environment 'no_such_env'"),
    (["eval", "tool_use", "--policy", "nope"], "unknown policy 'nope'"),
    (["eval", "tool_use", "--policy", "oracle", "--provider", "nope"], "unknown provider 'nope'"),
    (["eval", "tool_use", "--policy", "oracle", "-a", "garbage"], "--env-arg wants KEY=VALUE"),
    (["eval", "tool_use", "--policy", "oracle", "-a", "{not json"], "is not a JSON object"),
    (["eval", "tool_use", "--policy", "oracle", "-a", "no_such_option=1"], "unexpected keyword argument 'no_such_option'"),
    (["train", "{tmp}/bad.toml"], "bad.toml: malformed TOML"),
    (["train", "{tmp}/unknown_key.toml"], "rollout_extra: Extra inputs are not permitted"),
    (["train", "{tmp}/bad_value.toml"], "optim.lr: Input should be a valid number"),
    (["train", "examples/toy.toml", "--set", "optim.nope=3"], "optim.nope: Extra inputs are not permitted"),
    (["train", "{tmp}/missing.toml"], "missing.toml' does not exist"),
    (
        ["train", "examples/toy.toml", "--nproc", "2", "--set", "optim.async_level=1", "--set", "backend.share_weights=true"],
        "toy.toml: backend.share_weights = true cannot be combined with optim.async_level = 1",
    ),
    (["swe", "debug", "{tmp}/missing.jsonl"], "cannot load tasks"),
    (["swe", "debug", "bundled", "--step", "bogus"], "unknown step 'bogus'"),
    (["swe", "debug", "bundled", "--provider", "nope"], "unknown provider 'nope'"),
    (["sandbox", "run", "--profile", "bogus", "--", "true"], "profile: Input should be 'strict' or 'vm'"),
    (["sandbox", "run", "--egress-allow", "pypi.org,http://x", "--", "true"], "egress entry 'http://x' is not a host"),
    (["sandbox", "run", "--pull", "sometimes", "--", "true"], "image_pull: Input should be 'missing', 'never' or 'always'"),
    (["sandbox", "run", "--image-alias", "foo", "--", "true"], "--image-alias wants NAME=LOCAL_IMAGE"),
]
# Refusals that need the engine to decide (still before anything is made).
DOCKER_CASES = [
    (["sandbox", "run", "--disk-mb", "1048576", "--", "true"], "disk_mb=1048576 is more than this host can still promise"),
    (["sandbox", "run", "--pull", "never", "--image", "sandgym/no-such:1", "--", "true"], "image_pull='never'"),
    (["sandbox", "run", "--image", "sandgym/no-such:1", "--", "true"], "pulling it failed"),
]


@pytest.mark.parametrize(("argv", "says"), CASES, ids=[" ".join(a[:2] + a[-1:]) for a, _ in CASES])
def test_user_error_is_one_line_and_exit_2(configs: Path, argv: list[str], says: str) -> None:
    args = [a.replace("{tmp}", str(configs)) for a in argv]
    proc = sandgym(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not BOX & set(proc.stderr), proc.stderr

    verbose = sandgym("-v", *args)
    assert verbose.returncode == 2
    assert "Traceback (most recent call last)" in verbose.stderr and not BOX & set(verbose.stderr)
    assert verbose.stderr.splitlines()[-1] == lines[0]


@pytest.mark.docker
@pytest.mark.parametrize(("argv", "says"), DOCKER_CASES, ids=[" ".join(a[2:4]) for a, _ in DOCKER_CASES])
def test_sandbox_refusals_are_one_line(argv: list[str], says: str) -> None:
    from tests.conftest import require

    require("docker")
    proc = sandgym(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr


def test_a_commands_own_verbose_flag_shows_the_traceback_too(configs: Path) -> None:
    proc = sandgym("eval", "no_such_env", "--policy", "oracle", "-v")
    assert proc.returncode == 2 and "Traceback (most recent call last)" in proc.stderr
    proc = sandgym("train", str(configs / "bad.toml"), "-v")
    assert proc.returncode == 2 and "TOMLDecodeError" in proc.stderr


def test_a_bad_training_config_is_refused_before_torch_is_imported(configs: Path) -> None:
    """Reading and checking the config (and SFT's records) needs no torch (seconds to import):
    the refusal is at once."""
    code = "import atexit, sys\natexit.register(lambda: print('torch' in sys.modules))\nfrom sandgym.cli import main\nmain()"
    (configs / "sft_no_records.toml").write_text('[data]\npaths = ["missing.jsonl"]\n')
    for bad in (["train", str(configs / "bad_value.toml")], ["train", "examples/toy.toml", "--set", "optim.nope=3"],
                ["sft", str(configs / "bad_value.toml")], ["sft", str(configs / "sft_no_records.toml")]):
        proc = subprocess.run([sys.executable, "-c", code, *bad], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr
        assert proc.stdout.strip() == "False", proc.stdout


def test_a_bug_keeps_its_traceback_and_exit_1(configs: Path) -> None:
    proc = sandgym("eval", "crashing_env", "--policy", "oracle", tmp_path=configs)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "RuntimeError: a bug in an environment" in proc.stderr


def test_help_and_no_command_are_unchanged() -> None:
    proc = sandgym()
    assert proc.returncode == 2 and "Usage:" in proc.stdout and "eval" in proc.stdout and "Traceback" not in proc.stderr
    proc = sandgym("swe")
    assert proc.returncode == 2 and "debug" in proc.stdout
    proc = sandgym("--help")
    assert proc.returncode == 0 and "--verbose" in proc.stdout and proc.stderr == ""


def test_which_errors_are_the_users() -> None:
    spec = SpecError("cpu=64 is more than the engine host has; allowed range: (0, 2]")
    assert user_error_message(spec) == f"invalid sandbox spec: {spec}"
    # anyio task groups wrap what a task raised
    assert user_error_message(ExceptionGroup("tasks", [ExceptionGroup("inner", [spec])])) == f"invalid sandbox spec: {spec}"
    assert user_error_message(UnknownNameError("unknown environment 'x'")) == "unknown environment 'x'"
    missing = FileNotFoundError(2, "No such file or directory", "/no/such/file")
    assert user_error_message(missing) == "No such file or directory: /no/such/file"
    # Not the user's: a file missing inside a sandbox, a bug, several failures at once.
    assert user_error_message(SandboxFileNotFound("/workspace/x")) is None
    assert user_error_message(RuntimeError("boom")) is None
    assert user_error_message(ExceptionGroup("two", [spec, RuntimeError("boom")])) is None


@pytest.mark.parametrize("command", [("eval",), ("sandbox", "check"), ("sandbox", "run")])
def test_provider_help_names_every_provider(command: tuple[str, ...]) -> None:
    from sandgym.sandboxes.registry import PROVIDERS

    proc = sandgym(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    # The option's help is the sentence after --provider (rich's table wraps it; split folds that).
    help_text = said[said.index("--provider") :][:200]
    assert all(name in help_text for name in PROVIDERS), help_text
