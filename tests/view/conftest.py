"""Run folders made by the real commands, one `sandgym view` server over them and one headless
Chromium (Debian's `chromium` + `chromium-driver`, through selenium), shared by the view tests.

The runs, made side by side at the start of the session:
- he-oracle, he-null: `sandgym eval humaneval` with the oracle and null policies (compare);
- agent: humaneval with the python and bash tools against a scripted model server
  (core.testing's MockOpenAIServer): tool calls whose results carry stderr, an exit code and a
  time-out, a model error (HTTP 500), a reply cut at max tokens, token logprobs, and hostile
  text (script tags, event handlers, javascript: URLs) in model output and tool output;
- swe-debug: `sandgym swe debug` on two bundled tasks (one resolved, one broken gold patch);
- swe-validate: `sandgym swe validate -n 2` on a task whose instance id and test ids are
  hostile markup and whose PASS_TO_PASS tests are coin flips (flaky);
- bfcl: `sandgym eval bfcl_v4_single_turn --policy null` on one entry of two categories;
- train: `sandgym train examples/toy.toml --steps 3`; sft: `sandgym sft` on he-oracle's records.

Making them takes a minute or more. While working on the viewer, SANDGYM_VIEW_RUNS=DIR makes
them in DIR once and reuses them from there on later sessions.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.core.testing import MockOpenAIServer, Reply, last_user

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

# Hostile text: each payload sets window.__xss if it ever runs.
XSS_OUT = "<script>window.__xss='stdout'</script>"
XSS_ERR = "<img src=x onerror=\"window.__xss='stderr'\">"
XSS_PY = "<a href=\"javascript:window.__xss='py'\">click</a>"
XSS_TOOL = "<svg onload=\"window.__xss='toolname'\">"
XSS_MODEL = "<script>window.__xss='model'</script> [x](javascript:window.__xss='md') <img src=x onerror=\"window.__xss='img'\">"
XSS_ID = "xss<img/src=x/onerror=window.__xss=7>"
XSS_TEST = "<script>window.__xss=8</script>"


def sandgym(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandgym", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def agent_responder(body: dict[str, Any]) -> Reply:
    """A scripted model for humaneval with tools, by example (the function in the prompt)
    and by how many times it has answered in this conversation."""
    prompt = last_user(body)
    turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
    if "has_close_elements" in prompt:
        if turn == 0:
            cmd = f"echo {json.dumps(XSS_OUT)}; echo {json.dumps(XSS_ERR)} 1>&2; exit 3"
            return Reply(content="Let me look.", tool_calls=[{"name": "bash", "arguments": {"command": cmd}}])
        if turn == 1:
            return Reply(content=None, tool_calls=[{"name": "bash", "arguments": {"command": "sleep 30"}}])
        if turn == 2:
            return Reply(content=XSS_MODEL, tool_calls=[
                {"name": "python", "arguments": {"code": f"print({XSS_PY!r})"}},
                {"name": XSS_TOOL, "arguments": {"x": XSS_TOOL}}])
        return Reply(content=XSS_MODEL + "\n```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    if "separate_paren_groups" in prompt:
        return Reply(status=500)
    if "truncate_number" in prompt:
        return Reply(content="def truncate_number(number", finish_reason="length")
    return Reply(content="```python\ndef below_zero(operations):\n    return False\n```")


FLAKY_TEST = f'''import os

import pytest


@pytest.mark.parametrize("case", ["{XSS_TEST}"] + ["c%d" % i for i in range(15)])
def test_coin(case):
    assert os.urandom(1)[0] % 2
'''


def flaky_task(bundled: Path) -> dict[str, Any]:
    """slugger's bundled task (same repository, so the same image) under a hostile instance
    id, with 16 coin-flip tests listed in PASS_TO_PASS: two runs of a step disagree on some
    of them (all 16 agreeing in both steps: 2^-32)."""
    rows = [json.loads(line) for line in (bundled / "tasks.jsonl").read_text().splitlines()]
    task = next(r for r in rows if r["instance_id"] == "slugger__collapse-runs")
    lines = FLAKY_TEST.splitlines()
    patch = ("diff --git a/tests/test_coin.py b/tests/test_coin.py\nnew file mode 100644\nindex 0000000..1111111\n"
             f"--- /dev/null\n+++ b/tests/test_coin.py\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    coins = [f"tests/test_coin.py::test_coin[{XSS_TEST}]"] + [f"tests/test_coin.py::test_coin[c{i}]" for i in range(15)]
    return {**task, "instance_id": XSS_ID, "test_patch": task["test_patch"] + patch, "PASS_TO_PASS": task["PASS_TO_PASS"] + coins}


class Runs:
    """The run folders under one root (relative: to the repository), made by real commands."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.failures: list[str] = []

    def path(self, name: str) -> Path:
        return REPO / self.root / name

    def arg(self, name: str) -> str:
        """The folder as the commands (run in the repository) are told it."""
        return str(self.root / name)

    def chain(self, *steps: tuple[str, ...]) -> None:
        for args in steps:
            p = sandgym(*args)
            if p.returncode not in (0, 1):  # 1: a run with unresolved or failed instances, as intended
                self.failures.append(f"sandgym {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
                return


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    from tests.conftest import require

    require("docker")
    keep = os.environ.get("SANDGYM_VIEW_RUNS")  # relative: to the repository (screenshots show no machine paths)
    root = Path(keep) if keep else _session_dir(tmp_path_factory) / "view-runs"
    (REPO / root).mkdir(parents=True, exist_ok=True)
    # Made once per session: under pytest-xdist the first worker to get here makes them while
    # the others wait on the lock, then all read the same folders.
    with open(REPO / root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (REPO / root / "done").exists():
            if not keep:  # what another worker's failed attempt left
                shutil.rmtree(REPO / root)
                (REPO / root).mkdir()
            _make_runs(root)
    yield Runs(root)


def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this pytest session that its xdist workers share (their own base
    temporary folders sit side by side in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _make_runs(root: Path) -> None:
    from sandgym.swe.bundled import load_bundled

    r = Runs(root)
    bundled = root.parent / f"{root.name}-tasks"
    shutil.rmtree(REPO / bundled, ignore_errors=True)
    load_bundled(REPO / bundled)
    (REPO / bundled / "flaky.jsonl").write_text(json.dumps(flaky_task(REPO / bundled)) + "\n")
    with MockOpenAIServer(agent_responder) as srv:
        chains = [
            [("eval", "humaneval", "--policy", "oracle", "-n", "4", "-r", "2", "-o", r.arg("he-oracle")),
             ("sft", "examples/pycalc_sft.toml", "--steps", "3", "--output", r.arg("sft"),
              "--set", f'data.paths=["{r.path("he-oracle") / "results.jsonl"}"]')],
            [("eval", "humaneval", "--policy", "null", "-n", "4", "-r", "2", "-o", r.arg("he-null"))],
            [("eval", "humaneval", "-a", "tools=true", "-a", "with_bash=true", "-a", "command_timeout_s=2", "-n", "4",
              "--base-url", srv.base_url, "--model", "mock", "--max-retries", "0", "--max-infra-failure-rate", "1",
              "-o", r.arg("agent"))],  # its model error (1 of 4) is the point: not a reason to exit 3
            [("swe", "debug", str(bundled / "tasks.jsonl"), "-i", "slugger__collapse-runs", "-i", "romanize__subtractive-broken-gold",
              "-o", r.arg("swe-debug")),
             ("swe", "validate", str(bundled / "flaky.jsonl"), "-n", "2", "-o", r.arg("swe-validate"))],
            [("eval", "bfcl_v4_single_turn", "--policy", "null", "-a", "per_category=1", "-a", "categories=simple_python,irrelevance",
              "-o", r.arg("bfcl"))],
            [("train", "examples/toy.toml", "--steps", "3", "--output", r.arg("train"))],
        ]
        threads = [threading.Thread(target=r.chain, args=tuple(c)) for c in chains]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if r.failures:
        pytest.fail("making the run folders failed:\n" + "\n".join(r.failures))
    (REPO / root / "done").touch()


class Viewer:
    """`sandgym view ROOT` in a subprocess, on a free port."""

    def __init__(self, *roots: Path, extra: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "sandgym", "view", *map(str, roots), "--port", "0", "--no-open", *extra],
                                     cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"no URL from sandgym view: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url = m.group(1)
        self.base = self.url.split("?")[0].rstrip("/")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def viewer(runs: Runs) -> Iterator[Viewer]:
    v = Viewer(runs.root)
    yield v
    v.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("the view tests need Debian's chromium and chromium-driver (scripts/bootstrap.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(browser: Any, condition: Any, timeout: float = 20.0) -> Any:
    """Until `condition(browser)` holds; an element redrawn while it was read is read again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def css(browser: Any, selector: str, timeout: float = 20.0) -> Any:
    """The first element matching `selector`, once there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return wait_for(browser, ec.presence_of_element_located((By.CSS_SELECTOR, selector)), timeout)


def page_text(browser: Any) -> str:
    return str(browser.execute_script("return document.body.innerText"))


def text_appears(browser: Any, text: str, timeout: float = 20.0) -> None:
    wait_for(browser, lambda d: text in page_text(d), timeout)


def wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.1)
