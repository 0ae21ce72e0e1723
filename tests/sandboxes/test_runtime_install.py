"""The runtime installer's daemon.json merge (what bootstrap runs): keeps every other key,
is idempotent, refuses a file that is not JSON; and the installed wrapper is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandgym.sandboxes.providers.docker import runtime as rt


def test_merge_keeps_other_keys_and_is_idempotent(tmp_path: Path) -> None:
    p = tmp_path / "daemon.json"
    p.write_text(json.dumps({"log-driver": "json-file", "runtimes": {"nvidia": {"path": "/x"}}}))
    assert rt.merge_daemon_json(p) is True
    conf = json.loads(p.read_text())
    assert conf["log-driver"] == "json-file" and conf["runtimes"]["nvidia"] == {"path": "/x"}
    assert conf["runtimes"]["runsc"] == {"path": str(rt.WRAPPER_PATH)}
    assert conf["runtimes"]["runc-sandgym"] == {"path": str(rt.RUNC_LINK)}
    assert conf["live-restore"] is True  # an engine restart keeps the sandboxes
    before = p.read_text()
    assert rt.merge_daemon_json(p) is False and p.read_text() == before


def test_merge_keeps_the_operators_live_restore(tmp_path: Path) -> None:
    p = tmp_path / "daemon.json"
    p.write_text(json.dumps({"live-restore": False}))
    assert rt.merge_daemon_json(p) is True
    assert json.loads(p.read_text())["live-restore"] is False


def test_merge_creates_a_missing_file_and_refuses_broken_json(tmp_path: Path) -> None:
    p = tmp_path / "docker" / "daemon.json"
    assert rt.merge_daemon_json(p) is True and set(json.loads(p.read_text())["runtimes"]) == set(rt.RUNTIMES)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        rt.merge_daemon_json(bad)
    assert bad.read_text() == "{not json"  # untouched


def test_wrapper_carries_its_version() -> None:
    assert rt.WANTED_VERSION is not None and rt.WANTED_VERSION >= 1
    if rt.WRAPPER_PATH.exists():  # bootstrap ran here: it must be the current one
        assert rt.wrapper_version(rt.WRAPPER_PATH) == rt.WANTED_VERSION, "re-run scripts/bootstrap.sh"
