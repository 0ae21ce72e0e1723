"""Why a container stopped, from the engine's event stream.

The watcher removes a container this provider made or adopted as soon as it ends (what
`--rm` would do; sandgym does not use `--rm`, which Docker before 24.0.8 honours by removing
running containers when the engine restarts, moby/moby#46308), so `inspect` afterwards finds
nothing; and under gVisor an OOM kills the whole sandbox at once. The engine's events are the one record that
survives: `oom` and `die` (exitCode 137), in either order, is OOM_KILLED. A `die` after the sandbox's ttl_s is
TIMEOUT; a `die` we caused (remove) is not an error; a kill by anyone else (exit 137 with no
oom: docker kill/rm, or execd's init, the main process, killed from the host, or from inside
a gVisor sandbox) is REMOVED; any other `die` is EXITED with its exit code. One daemon thread per
provider follows the stream from the first create on, and subscribes again when it ends
(the engine restarted) until the provider closes; verdicts are kept for the last
MAX_VERDICTS containers.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker
from docker.types import CancellableStream

from ...spec import LABEL_OWNER

log = logging.getLogger(__name__)

MAX_VERDICTS = 10_000
KILLED = 137
RESUBSCRIBE_S = (0.2, 5.0)  # first and largest wait between attempts to subscribe again
# A kill with no oom event yet may still be an OOM whose event comes a moment later.
OOM_GRACE_S = 1.0
_OOM_MSG = "the sandbox ran out of memory (memory_mb) and was killed"
_ENGINE_RESTART_MSG = (
    "killed while the Docker engine restarted (an engine without live-restore stops its containers; "
    "scripts/bootstrap.sh turns live-restore on)"
)


@dataclass(frozen=True)
class Verdict:
    error_type: str | None  # None: we removed it ourselves (no error)
    message: str
    exit_code: int | None
    at: float


class ExitWatcher:
    """Follows container events of sandgym's containers in a daemon thread."""

    def __init__(
        self, make_client: Callable[[], docker.APIClient], on_end: Callable[[str], None] | None = None
    ) -> None:
        self._make_client = make_client
        self._on_end = on_end  # called (in its own thread) when a container of ours ends
        self._own: set[str] = set()  # made or adopted by this provider, not detached
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._oom: set[str] = set()
        self._ours: set[str] = set()  # being removed by this provider
        self._deadlines: dict[str, float] = {}  # id -> wall-clock end of its ttl_s
        self._stream: CancellableStream[dict[str, Any]] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_seen = 0.0  # time of the last event received
        self._gaps: list[list[float]] = []  # [ended, subscribed again] of the stream (engine restarts)

    def start(self) -> None:
        """Subscribe (blocking until the engine answered), once."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._subscribe()
            self._thread = threading.Thread(target=self._follow, name="sandgym-docker-events", daemon=True)
            self._thread.start()

    def _subscribe(self) -> None:
        # Again after a gap: from the last event seen, so what the engine still holds of the
        # gap is replayed (a restarted engine holds nothing of before its restart).
        since = {"since": int(self._last_seen)} if self._last_seen else {}
        client = self._make_client()
        self._stream = client.events(
            decode=True,
            filters={"type": "container", "label": [LABEL_OWNER], "event": ["oom", "die"]},
            **since,
        )

    def _follow(self) -> None:
        wait = RESUBSCRIBE_S[0]
        while True:
            stream = self._stream
            try:
                for ev in stream or ():
                    wait = RESUBSCRIBE_S[0]
                    self._last_seen = float(ev.get("time") or time.time())
                    try:
                        self._on(ev)
                    except Exception as exc:  # one odd event must not end the watch
                        log.debug("event %r: %r", ev, exc)
                why: object = "it ended"
            except Exception as exc:
                why = exc
            # The engine went away (a restart): subscribe again. A container that ends
            # before that has no verdict; inspect reports it LOST.
            if not self._closed:
                self._gaps.append([time.time(), math.inf])
            while not self._closed:
                log.warning("docker event stream: %r; subscribing again in %.1fs", why, wait)
                time.sleep(wait)
                wait = min(RESUBSCRIBE_S[1], wait * 2)
                try:
                    with self._lock:
                        if not self._closed:
                            self._subscribe()
                            self._gaps[-1][1] = time.time()
                    break
                except Exception as exc:
                    why = exc
            if self._closed:
                return

    def _on(self, ev: dict) -> None:
        cid = ev.get("id") or (ev.get("Actor") or {}).get("ID")
        action = ev.get("Action") or ev.get("status")
        if not cid:
            return
        with self._cond:
            if action == "oom":
                self._oom.add(cid)
                v = self._verdicts.get(cid)
                if v is not None and v.error_type == "REMOVED" and v.exit_code == KILLED:
                    # the engine may report the oom just after the die (gVisor): upgrade
                    self._verdicts[cid] = Verdict("OOM_KILLED", _OOM_MSG, v.exit_code, v.at)
                    self._cond.notify_all()
                return
            if action != "die" or cid in self._verdicts:  # a container dies once (a replay repeats it)
                return
            attrs = (ev.get("Actor") or {}).get("Attributes") or {}
            code_s = str(attrs.get("exitCode", ""))
            code = int(code_s) if code_s.lstrip("-").isdigit() else None
            deadline = self._deadlines.pop(cid, None)
            if cid in self._oom and code == KILLED:
                verdict = Verdict("OOM_KILLED", _OOM_MSG, code, time.time())
            elif cid in self._ours:
                verdict = Verdict(None, "removed", code, time.time())
            elif deadline is not None and time.time() >= deadline - 1.0:
                verdict = Verdict("TIMEOUT", "its ttl_s ran out", code, time.time())
            elif code == KILLED and self._in_gap(ev):
                verdict = Verdict("REMOVED", _ENGINE_RESTART_MSG, code, time.time())
            elif code == KILLED:
                verdict = Verdict(
                    "REMOVED", "its main process (execd's init) was SIGKILLed, not by sandgym (docker kill/rm, prune, a "
                    "kill from the host, or from inside a gVisor sandbox, where code can signal init)", code, time.time(),
                )
            else:
                verdict = Verdict("EXITED", f"its main process exited with code {code}", code, time.time())
            self._oom.discard(cid)
            ours = cid in self._ours
            self._ours.discard(cid)
            if cid in self._own:
                self._own.discard(cid)
                if not ours and self._on_end is not None:
                    threading.Thread(target=self._on_end, args=(cid,), name="sandgym-docker-rm", daemon=True).start()
            self._verdicts[cid] = verdict
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
            self._cond.notify_all()

    # -- what the provider tells us / asks ------------------------------------------------

    def expect(self, cid: str, ttl_s: float | None) -> None:
        """`cid` is ours (made or adopted): remove it when it ends; `ttl_s` tells a TIMEOUT."""
        with self._lock:
            self._own.add(cid)
            if ttl_s is not None:
                self._deadlines[cid] = time.time() + ttl_s

    def forget(self, cid: str) -> None:
        """`cid` is left to another process (detached): no longer ours to remove."""
        with self._lock:
            self._own.discard(cid)
            self._deadlines.pop(cid, None)

    def _in_gap(self, ev: dict[str, Any]) -> bool:
        """Whether the event happened while the stream was down: the engine restarting."""
        t = int(ev.get("timeNano") or 0) / 1e9 or float(ev.get("time") or 0)
        return any(start <= t <= end for start, end in self._gaps)

    def engine_went_away_since(self, t: float) -> bool:
        """Whether the event stream ended (the engine stopped or restarted) after wall time `t`."""
        return any(start >= t for start, _ in self._gaps)

    def removing(self, cid: str) -> None:
        with self._lock:
            self._ours.add(cid)

    def verdict(self, cid: str, wait_s: float = 0.0) -> Verdict | None:
        """The verdict for `cid`, waiting up to `wait_s` for its `die` event to arrive."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                v = self._verdicts.get(cid)
                if v is not None and v.error_type == "REMOVED" and time.time() - v.at < OOM_GRACE_S:
                    self._cond.wait(OOM_GRACE_S - (time.time() - v.at))
                    continue
                left = deadline - time.monotonic()
                if v is not None or left <= 0 or self._thread is None:
                    return v
                self._cond.wait(left)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass
