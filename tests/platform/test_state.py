"""The SQLite state on its own: what a restart reads back, one server per directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.platform.db import StateDB, StateLocked
from sandgym.platform.egress import WirePolicy
from sandgym.platform.models import CreateSandboxBody
from sandgym.platform.store import Egress, QuotaExceeded, Record, Store, token_hash
from sandgym.sandboxes.spec import EgressPolicy, SandboxSpec


def _record(store: Store, tenant: str = "u1") -> Record:
    body = CreateSandboxBody(name="n", docker_image="img", environment_vars={"A": "1"}, network_allowlist=["pypi.org"])
    spec = SandboxSpec(memory_mb=64, egress=EgressPolicy(allow=("pypi.org",)), labels={"platform.id": "x"})
    return Record(id=store.new_id(), tenant=tenant, body=body, spec=spec, ttl_s=60.0, idle_s=None,
                  egress=Egress(policy=WirePolicy(allowlist=["pypi.org"])))


def test_records_survive_a_reopen(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    iid = db.instance_id
    store = Store(db, quota=2)
    rec = _record(store)
    store.add(rec, "key-1")
    rec.gw_hash, rec.gw_expires = token_hash("tok"), 4e9
    rec.set_status("RUNNING", container_id="c0ffee")
    rec.egress.generation = 2
    rec.save()
    rec.touch()
    gone = _record(store)
    store.add(gone, None)
    gone.set_status("TERMINATED", termination_reason="deleted")
    store.add(_record(store), None)  # the second live one: quota 2 counts live records only
    with pytest.raises(QuotaExceeded):
        store.add(_record(store), None)
    store.flush()
    db.close()

    db2 = StateDB(tmp_path)
    assert db2.instance_id == iid
    again = Store(db2, quota=2)
    loaded = {r.id: r for r in again.load()}
    back = loaded[rec.id]
    assert back.status == "RUNNING" and back.container_id == "c0ffee" and back.started_at == rec.started_at
    assert back.body.environment_vars == {"A": "1"} and back.spec == rec.spec
    assert back.egress.policy.allowlist == ["pypi.org"] and back.egress.generation == 2
    assert back.gateway_token_ok("tok") and not back.gateway_token_ok("other")
    assert abs(back.last_active - rec.last_active) < 1e-6
    assert any("status RUNNING" in line for line in back.logs)
    assert again.by_idempotency("u1", "key-1") is back
    assert loaded[gone.id].status == "TERMINATED" and loaded[gone.id].terminated_at is not None
    db2.close()


def test_one_server_per_state_directory(tmp_path: Path) -> None:
    first = StateDB(tmp_path)
    with pytest.raises(StateLocked, match="another `sandgym serve`"):
        StateDB(tmp_path)
    first.close()
    StateDB(tmp_path).close()  # free again once the first is closed


def test_old_records_are_forgotten(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    store = Store(db, quota=4, retain_s=0.0)
    rec = _record(store)
    store.add(rec, "k")
    rec.set_status("TERMINATED")
    store.forget_old()
    assert store.get_any(rec.id) is None and store.by_idempotency("u1", "k") is None
    db.close()
    assert Store(StateDB(tmp_path), quota=4).load() == []


def test_event_log_is_bounded(tmp_path: Path) -> None:
    from sandgym.platform.store import LOG_LINES

    db = StateDB(tmp_path)
    store = Store(db, quota=4)
    rec = _record(store)
    store.add(rec, None)
    for i in range(3 * LOG_LINES):
        rec.log(f"line {i}")
        if i % 100 == 0:
            store.flush()
    store.flush()
    kept = db.events(rec.id, 10 * LOG_LINES)
    assert LOG_LINES <= len(kept) <= 2 * LOG_LINES and kept[-1].endswith(f"line {3 * LOG_LINES - 1}")
    db.close()
