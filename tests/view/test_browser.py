"""The viewer in a real headless Chromium, on run folders made by the real commands
(conftest.py): runs -> rollouts -> trajectory, filters, sorting, comparison, SWE instances
(diff, logs, FAIL_TO_PASS / PASS_TO_PASS, flaky tests), BFCL entries, training plots and
samples, a run that grows while its page is open, a record too big to send whole, and
hostile text that must stay text.

SANDGYM_VIEW_SCREENSHOTS=DIR saves a screenshot of each page the tests visit into DIR
(that is how docs/view/*.png are made)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from sandgym.core.testing import MockOpenAIServer, Reply

from .conftest import (
    ENV,
    REPO,
    XSS_ERR,
    XSS_ID,
    XSS_MODEL,
    XSS_OUT,
    XSS_PY,
    XSS_TEST,
    XSS_TOOL,
    Runs,
    Viewer,
    css,
    page_text,
    wait_file,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]  # the first test makes the run folders (minutes on a busy machine)
SHOTS = os.environ.get("SANDGYM_VIEW_SCREENSHOTS")


def shot(browser: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def run_url(viewer: Viewer, run: str, *rest: Any, query: str = "") -> str:
    parts = "/".join(quote(str(p), safe="") for p in ("run", f"0/{run}", *rest))
    return f"{viewer.base}/#/{parts}" + (f"?{query}" if query else "")


def example_row(viewer: Viewer, run: str, example_id: int) -> int:
    """The line number of an example's first rollout (rollouts finish in any order)."""
    with urllib.request.urlopen(f"{viewer.base}/api/rollouts?run=0/{run}&example_id={example_id}", timeout=30) as resp:
        return int(json.load(resp)["rows"][0]["n"])


def rows(browser: Any) -> list[Any]:
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, "table.rollouts-table tbody tr")


def assert_inert(browser: Any) -> None:
    """Nothing hostile ran or became markup: no payload set window.__xss, no element carries
    an event handler attribute, every link is the viewer's own."""
    assert browser.execute_script("return window.__xss === undefined"), browser.execute_script("return window.__xss")
    assert browser.execute_script("return document.querySelectorAll('[onerror],[onload],[onclick],iframe,object,embed').length") == 0
    hrefs = browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
    assert all(h.startswith("#/") or h.startswith("/api/raw?") for h in hrefs), hrefs
    scripts = browser.execute_script("return [...document.scripts].map(s => s.getAttribute('src'))")
    assert scripts == ["/static/vendor/chart.min.js", "/static/js/main.js"], scripts
    # Nothing was blocked by the Content-Security-Policy and no script of ours failed.
    problems = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"] or "Uncaught" in e["message"]]
    assert not problems, problems


def test_runs_list_then_rollout_then_trajectory(browser: Any, viewer: Viewer, runs: Runs) -> None:
    browser.get(viewer.url)
    css(browser, "tr[data-run='0/agent']")
    text = page_text(browser)
    for name in ("he-oracle", "he-null", "agent", "swe-debug", "swe-validate", "bfcl", "train", "sft"):
        assert f"0/{name}" in text
    assert "pass@1 1.000" in text  # he-oracle's summary
    shot(browser, "runs")
    browser.find_element("css selector", "tr[data-run='0/agent'] a.runlink").click()
    css(browser, "table.rollouts-table tbody tr")
    assert len(rows(browser)) == 4
    shot(browser, "rollouts")
    # example 0 is the long one: three tool-calling turns
    browser.find_element("css selector", "#f-example").send_keys("0\n")
    wait_for(browser, lambda d: len(rows(d)) == 1)
    rows(browser)[0].find_element("css selector", "a.open").click()
    css(browser, ".turn[data-turn='3']")
    text = page_text(browser)
    assert "exit code 3" in text and "stderr" in text and "timed out after 2" in text
    assert XSS_OUT in text and XSS_ERR in text and XSS_MODEL.split(" ")[0] in text and XSS_PY in text
    assert browser.find_elements("css selector", "canvas.heatstrip"), "token logprobs drawn as a heat strip"
    assert "prompt" in text and "completion" in text and "token ids" in text
    assert browser.find_element("css selector", "#reward").text == "0.000"
    assert_inert(browser)
    shot(browser, "trajectory")


def test_filter_by_error_kind_and_truncated(browser: Any, viewer: Viewer) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(run_url(viewer, "agent"))
    css(browser, "#f-error-kind option[value='model']")
    Select(browser.find_element("css selector", "#f-error-kind")).select_by_value("model")
    wait_for(browser, lambda d: len(rows(d)) == 1 and "model" in rows(d)[0].text)
    assert "error_kind=model" in browser.current_url
    Select(browser.find_element("css selector", "#f-error-kind")).select_by_value("none")
    wait_for(browser, lambda d: len(rows(d)) == 3)
    browser.get(run_url(viewer, "agent", query="truncated=true"))
    wait_for(browser, lambda d: len(rows(d)) == 1 and "truncated" in rows(d)[0].text)
    browser.get(run_url(viewer, "agent"))
    css(browser, "#f-turns").send_keys("3\n")  # only example 0 called tools for several turns
    wait_for(browser, lambda d: "min_turns=3" in d.current_url and len(rows(d)) == 1 and rows(d)[0].find_elements("css selector", "td")[1].text == "0")


def test_sort_by_reward(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "bfcl"))
    css(browser, "table.rollouts-table tbody tr")
    first = lambda d: rows(d)[0].find_element("css selector", "td.reward").text  # noqa: E731
    browser.find_element("css selector", "th[data-sort='reward']").click()  # highest first
    wait_for(browser, lambda d: "desc=true" in d.current_url and first(d) == "1.000")
    browser.find_element("css selector", "th[data-sort='reward']").click()
    wait_for(browser, lambda d: "desc=false" in d.current_url and first(d) == "0.000")


def test_compare_two_runs(browser: Any, viewer: Viewer) -> None:
    browser.get(viewer.url)
    css(browser, "tr[data-run='0/he-oracle'] input.pick").click()
    browser.find_element("css selector", "tr[data-run='0/he-null'] input.pick").click()
    browser.find_element("css selector", "#compare").click()
    css(browser, "#flips")
    wait_for(browser, lambda d: "4 lost" in d.find_element("css selector", "#flips").text)
    assert "0 gained" in browser.find_element("css selector", "#flips").text
    assert len(browser.find_elements("css selector", "table.examples tr.lost")) == 4
    assert "-1.000" in page_text(browser)
    shot(browser, "compare")


def test_swe_debug_instance(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "swe-debug"))
    css(browser, "a.instlink")
    text = page_text(browser)
    assert "resolved" in text and "unresolved" in text and "1/2" in browser.find_element("css selector", "#resolved").text
    shot(browser, "swe-run")
    browser.get(run_url(viewer, "swe-debug", "instance", "romanize__subtractive-broken-gold"))
    css(browser, "table.tests tbody tr")
    cells = {r.find_elements("css selector", "td")[0].text: r.find_elements("css selector", "td")[2].text
             for r in browser.find_elements("css selector", "table.tests tbody tr")}
    assert cells["tests/test_roman.py::test_subtractive_tens"] == "failed"
    assert cells["tests/test_roman.py::test_subtractive_ones"] == "passed"
    css(browser, "pre.diff .dl.add")  # the applied patch, as a diff
    log = next(s for s in browser.find_elements("css selector", "details summary") if s.text.startswith("tests.log"))
    log.click()
    wait_for(browser, lambda d: "test_subtractive_tens" in d.find_element("css selector", "details[open] pre.log").text)
    shot(browser, "swe-instance")


def test_swe_validation_flaky_tests(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "swe-validate"))
    css(browser, "table.validation tr.flaky .flakytest")
    flaky = [e.text for e in browser.find_elements("css selector", "table.validation .flakytest")]
    assert flaky and all(t.startswith("tests/test_coin.py::test_coin[") for t in flaky)
    assert XSS_ID in page_text(browser) and "invalid" in page_text(browser)
    assert_inert(browser)
    shot(browser, "swe-validate")
    browser.find_element("css selector", "a.instlink").click()
    css(browser, "table.tests tr.flaky")
    text = page_text(browser)
    assert XSS_ID in text and f"tests/test_coin.py::test_coin[{XSS_TEST}]" in text
    headers = [h.text for h in browser.find_elements("css selector", "table.tests th")]
    assert {"gold_patch-1", "gold_patch-2", "none-1", "none-2"} <= set(headers)  # each run's outcome, side by side
    assert_inert(browser)


def test_bfcl_categories_and_entry(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "bfcl"))
    css(browser, "table.bfcl-categories tbody tr")
    table = {r.find_elements("css selector", "td")[0].text: r.find_elements("css selector", "td")[3].text
             for r in browser.find_elements("css selector", "table.bfcl-categories tbody tr")}
    assert table == {"irrelevance": "1.000", "simple_python": "0.000"}
    shot(browser, "bfcl-run")
    browser.find_element("css selector", "table.bfcl-categories a").click()  # irrelevance: filters the table
    wait_for(browser, lambda d: "category=irrelevance" in d.current_url and len(rows(d)) == 1)
    browser.get(run_url(viewer, "bfcl", query="category=simple_python"))  # the same page: its table is redrawn
    wait_for(browser, lambda d: len(rows(d)) == 1 and "simple_python" in rows(d)[0].text)
    rows(browser)[0].find_element("css selector", "a.open").click()
    css(browser, ".bfcl-entry")
    entry = browser.find_element("css selector", ".bfcl-entry").text
    assert "invalid" in entry and "calls made" in entry and "possible answers" in entry
    assert browser.find_element("css selector", ".error-type").text.startswith("ast_decoder")
    assert "Failed to decode AST" in browser.find_element("css selector", ".checker-reason").text
    shot(browser, "bfcl-entry")


def test_training_plots_and_samples(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "train"))
    for title in ("reward", "loss", "entropy", "clip fraction", "step time (s)", "infra failures"):
        css(browser, f".plot[data-plot='{title}'][data-points='3'] canvas")
    assert browser.find_element("css selector", "#steps").text == "3"
    css(browser, "table.rollouts-table tbody tr")
    shot(browser, "train")
    browser.find_element("css selector", "#f-step").send_keys("2\n")
    wait_for(browser, lambda d: len(rows(d)) == 4 and all(r.find_elements("css selector", "td")[1].text == "2" for r in rows(d)))
    rows(browser)[0].find_element("css selector", "a.open").click()
    css(browser, "canvas.heatstrip")
    assert "step 2" in page_text(browser)


def test_sft_run(browser: Any, viewer: Viewer) -> None:
    browser.get(run_url(viewer, "sft"))
    css(browser, ".plot[data-plot='loss'][data-points='3'] canvas")
    text = page_text(browser)
    assert "SFT" in text and "reward (last step)" not in text
    assert not browser.find_elements("css selector", ".plot[data-plot='reward']")


def test_live_run_grows_without_reload(browser: Any, viewer: Viewer, runs: Runs) -> None:
    """An eval still being written: its page shows each record as it lands."""
    gate = threading.Event()
    calls = []

    def model(body: dict[str, Any]) -> Reply:
        calls.append(1)
        if len(calls) > 2:
            gate.wait(120)
        return Reply(content="<answer>0</answer>")

    out = runs.path("live")
    shutil.rmtree(out, ignore_errors=True)
    with MockOpenAIServer(model) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "sandgym", "eval", "tool_use", "-n", "5", "-c", "1", "--base-url", srv.base_url,
                                 "--model", "mock", "--max-retries", "0", "-o", str(out)], cwd=REPO, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_file(out / "meta.json")
            browser.get(run_url(viewer, "live"))
            css(browser, "#count")
            browser.execute_script("window.__same_page = true")
            wait_for(browser, lambda d: d.find_element("css selector", "#count").text == "2" and len(rows(d)) == 2, 60)
            assert "running" in page_text(browser)
            gate.set()
            wait_for(browser, lambda d: d.find_element("css selector", "#count").text == "5" and len(rows(d)) == 5, 60)
            assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
            wait_for(browser, lambda d: "finished" in page_text(d))
            assert browser.execute_script("return window.__same_page === true"), "the page was reloaded"
        finally:
            gate.set()
            if proc.poll() is None:
                proc.kill()


def test_training_plots_extend_while_the_run_is_written(browser: Any, viewer: Viewer, runs: Runs) -> None:
    """The training run's steps appended one by one to a copy of it, its page open."""
    src, live = runs.path("train"), runs.path("train-live")
    shutil.rmtree(live, ignore_errors=True)
    live.mkdir()
    shutil.copy(src / "config.json", live / "config.json")
    steps = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    (live / "metrics.jsonl").write_text(steps[0])
    browser.get(run_url(viewer, "train-live"))
    css(browser, ".plot[data-plot='reward'][data-points='1']")
    browser.execute_script("window.__same_page = true")
    assert "running" in page_text(browser)
    for n, line in enumerate(steps[1:], start=2):
        with open(live / "metrics.jsonl", "a") as f:
            f.write(line)
        css(browser, f".plot[data-plot='loss'][data-points='{n}']")
        wait_for(browser, lambda d, n=n: d.find_element("css selector", "#steps").text == str(n))
    wait_for(browser, lambda d: "finished" in page_text(d))  # the config's last step was logged
    assert browser.execute_script("return window.__same_page === true"), "the page was reloaded"


def test_big_record_is_cut_with_the_rest_on_request(browser: Any, viewer: Viewer, runs: Runs) -> None:
    """A record with a 3 MB model reply: the page gets 64 KB of it, a button fetches 1 MB
    more, and a link downloads the whole record."""
    src = runs.path("he-null")
    big = runs.path("big")
    shutil.rmtree(big, ignore_errors=True)
    big.mkdir()
    shutil.copy(src / "meta.json", big / "meta.json")
    rec = json.loads((src / "results.jsonl").read_text().splitlines()[0])
    reply = ("The model rambles. " * 160_000)[:3_000_000]
    rec["turns"][0]["completion"]["content"] = rec["completion"][0]["content"] = reply
    line = json.dumps(rec) + "\n"
    (big / "results.jsonl").write_text(line)
    browser.get(run_url(viewer, "big", "rollout", 0))
    css(browser, ".cut button.more")
    cut = browser.find_element("css selector", ".turn .cut").text
    assert "showing 65,536 of 3,000,000 characters" in cut
    shot(browser, "big-record")
    browser.find_element("css selector", ".turn .cut button.more").click()
    wait_for(browser, lambda d: "showing 1,114,112 of 3,000,000" in d.find_element("css selector", ".turn .cut").text)
    href = browser.find_element("css selector", ".cutnote a[download]").get_attribute("href")
    with urllib.request.urlopen(href, timeout=30) as resp:
        assert resp.read() == line.encode()


def test_hostile_text_stays_text(browser: Any, viewer: Viewer) -> None:
    """Every page that shows the hostile corpus, checked once more as a whole."""
    n = example_row(viewer, "agent", 0)
    for url in (viewer.url, run_url(viewer, "agent"), run_url(viewer, "agent", "rollout", n),
                run_url(viewer, "swe-validate"), run_url(viewer, "swe-validate", "instance", f"{XSS_ID}/gold_patch-1")):
        browser.get(url)
        css(browser, "main section")
        wait_for(browser, lambda d: "Loading" not in page_text(d))
        assert_inert(browser)
    browser.get(run_url(viewer, "agent", "rollout", n))
    css(browser, ".callname")
    names = [e.text for e in browser.find_elements("css selector", ".callname")]
    assert XSS_TOOL in names and "bash" in names and "python" in names
