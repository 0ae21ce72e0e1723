"""SandboxManager: a hard cap on live sandboxes, warm pools, hooks, retries, TTL reaping,
and reaping of this host's sandboxes whose owner process is gone.

    async with SandboxManager("docker", max_sandboxes=8) as mgr:
        async with mgr.sandbox(SandboxSpec()) as sb:
            print((await sb.exec("echo hi")).stdout)

Invariants:
- At most `max_sandboxes` sandboxes exist at once (leased + warm + being created or
  destroyed). A slot is taken before `create` and given back only after `close` finished.
- Creation and destruction are shielded from cancellation, so a cancelled caller can never
  orphan a half-made sandbox; a sandbox made for a caller that was cancelled meanwhile is
  destroyed at once.
- Leaving `async with mgr` (or `await mgr.close()`) destroys every sandbox it made. Sandboxes
  of a manager whose process died carry its labels; they stop themselves (their lifeline,
  ownership.py), and inside `async with` every manager removes those of its provider in the
  background (at start, then every `orphan_reap_interval_s`), never blocking start-up.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .base import Command, ExecJob, Provider, Sandbox
from .errors import HookError, SandboxCreateError, SpecError
from .hooks import Hook, Hooks
from .live import LiveHandle, LiveProcess
from .ownership import OWNER_PROCESS, PruneReport, new_run_id, owner_labels, prune
from .registry import get_provider
from .result import EgressLogEntry, ExecResult, SandboxInfo
from .spec import EgressPolicy, SandboxSpec

log = logging.getLogger(__name__)

ORPHAN_PASS_WAIT_S = 10.0  # how long close() lets an orphan-reaping pass under way finish
# How long close() keeps retrying removals that failed (the engine restarting, say) before it
# leaves them to the next process's host reaper.
UNREMOVED_WAIT_S = 60.0


class ManagedSandbox(Sandbox):
    """A provider's sandbox as handed out by the manager: exec runs the exec hooks and
    `close()` gives the sandbox back to the manager instead of destroying it directly."""

    def __init__(self, inner: Sandbox, manager: SandboxManager) -> None:
        self.inner = inner
        self.id = inner.id
        self.spec = inner.spec
        self.provider = inner.provider
        self.created_at = time.monotonic()
        self.failed = False  # a hook failed or the caller marked it bad: never reuse
        self.leased = False
        self.destroying = False
        self._manager = manager

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        hooks = self._manager.hooks
        if hooks.has("before_exec"):
            await self._guard(hooks.run("before_exec", self, cmd))
        result = await self.inner.exec(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin)
        if hooks.has("after_exec"):
            await self._guard(hooks.run("after_exec", self, cmd, result))
        return result

    async def exec_python(
        self,
        source: bytes | str,
        *,
        cpu_limit_s: int | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        hooks = self._manager.hooks
        if hooks.has("before_exec") or hooks.has("after_exec"):  # as the exec it stands for, through exec's hooks
            return await super().exec_python(source, cpu_limit_s=cpu_limit_s, timeout=timeout, env=env, cwd=cwd)
        return await self.inner.exec_python(source, cpu_limit_s=cpu_limit_s, timeout=timeout, env=env, cwd=cwd)

    async def exec_many(self, jobs: Sequence[ExecJob], *, parallel: int | None = None) -> list[ExecResult]:
        hooks = self._manager.hooks
        if hooks.has("before_exec") or hooks.has("after_exec"):
            return await super().exec_many(jobs, parallel=parallel)  # each job through exec's hooks
        return await self.inner.exec_many(jobs, parallel=parallel)

    async def reset(self) -> bool:
        return await self.inner.reset()

    async def start_live(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        # The provider's own kind (docker streams); the exec hooks see only plain execs.
        return await self.inner.start_live(argv, env=env, cwd=cwd)

    async def attach_live(self, handle: LiveHandle, argv: Sequence[str]) -> LiveProcess:
        return await self.inner.attach_live(handle, argv)

    async def _guard(self, call: Any) -> None:
        try:
            await call
        except HookError:
            self.failed = True
            raise

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self.inner.put_archive(dest_dir, tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        return await self.inner.get_archive(path)

    async def alive(self) -> bool:
        return await self.inner.alive()

    async def set_egress(self, policy: EgressPolicy | None) -> None:
        await self.inner.set_egress(policy)

    async def egress_log(self) -> list[EgressLogEntry]:
        return await self.inner.egress_log()

    async def info(self) -> SandboxInfo:
        return await self.inner.info()

    async def close(self) -> None:
        await self._manager.release(self)

    async def detach(self) -> None:
        await self.inner.detach()

    def __repr__(self) -> str:
        return f"<ManagedSandbox {self.provider}:{self.id[:12]} {self.spec.image}>"


class SandboxManager:
    """Provisions sandboxes from one provider under a hard concurrency cap."""

    def __init__(
        self,
        provider: Provider | str = "docker",
        *,
        max_sandboxes: int = 8,
        hooks: Hooks | Mapping[str, Hook | list[Hook]] | None = None,
        create_retries: int = 2,
        retry_backoff_s: float = 0.5,
        reap_interval_s: float = 5.0,
        run_id: str | None = None,
        provider_options: Mapping[str, Any] | None = None,
        background_recycle: bool = False,
        owner_kind: str = OWNER_PROCESS,
        orphan_grace_s: float | None = None,
        reap_orphans: bool = True,
        orphan_reap_interval_s: float = 60.0,
    ) -> None:
        """`background_recycle`: a released sandbox that is not pooled is destroyed in the
        background (inside `async with`), so `release` returns at once; its slot is freed
        once it is gone. Off by default: then `release` returns after the destroy.

        Ownership (ownership.py has the contract): `owner_kind="process"` (default) ties
        every sandbox to this process; one stops by itself `orphan_grace_s` (default
        $SANDGYM_ORPHAN_GRACE_S or 0) after this process is gone. `owner_kind="platform"`:
        sandboxes meant to outlive this process (the platform server); no lifeline, never
        reaped. `reap_orphans`: inside `async with`, remove this host's sandboxes (of this
        provider) whose owner process is gone, in the background."""
        if max_sandboxes < 1:
            raise ValueError(f"max_sandboxes must be >= 1, got {max_sandboxes}")
        self.provider: Provider = (
            get_provider(provider, **dict(provider_options or {})) if isinstance(provider, str) else provider
        )
        self.max_sandboxes = max_sandboxes
        self.hooks = hooks if isinstance(hooks, Hooks) else Hooks(hooks)
        self.create_retries = create_retries
        self.retry_backoff_s = retry_backoff_s
        self.reap_interval_s = reap_interval_s
        self.background_recycle = background_recycle
        self.run_id = run_id or new_run_id()
        self.labels = owner_labels(self.run_id, owner_kind=owner_kind, orphan_grace_s=orphan_grace_s)
        self.reap_orphans = reap_orphans
        self.orphan_reap_interval_s = orphan_reap_interval_s
        self.last_orphan_reap: PruneReport | None = None
        self._orphan_scope: anyio.CancelScope | None = None
        self._orphan_done = anyio.Event()
        self._orphan_pass = False  # a reaping pass is under way
        self._slots = anyio.Semaphore(max_sandboxes)
        self._live: dict[str, ManagedSandbox] = {}
        self._idle: dict[str, deque[ManagedSandbox]] = defaultdict(deque)  # spec key -> warm
        self._checked: set[str] = set()  # spec keys that passed provider.check
        self._pool_target: dict[str, tuple[SandboxSpec, int]] = {}
        self._tg: TaskGroup | None = None
        self._closed = False
        self._recycling: set[str] = set()  # ids being destroyed in the background
        # Sandboxes whose removal failed (id -> the error): retried on every reaper tick and at close.
        self._unremoved: dict[str, str] = {}
        self._retrying = anyio.Lock()
        self._wakeup = anyio.Event()  # set (and replaced) when a slot or an idle sandbox frees up
        self.stats = {"created": 0, "destroyed": 0, "create_failures": 0, "pool_hits": 0, "reused": 0}

    # ---- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> SandboxManager:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._reaper)
        if self.reap_orphans:
            self._tg.start_soon(self._orphan_reaper)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
                await self._tg.__aexit__(None, None, None)
                self._tg = None

    async def close(self) -> None:
        """Destroy every sandbox this manager made. Safe to call twice."""
        self._closed = True
        self._pool_target.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for sb in list(self._live.values()):
                    tg.start_soon(self._destroy, sb)
            while self._recycling:  # background destroys still talking to the provider
                await anyio.sleep(0.01)
            with anyio.move_on_after(UNREMOVED_WAIT_S):
                while await self._retry_removals():
                    await anyio.sleep(1.0)
            for sid, why in self._unremoved.items():
                log.error("sandbox %s may be leaked: it could not be removed (%s); the host reaper of the next "
                          "sandgym process removes it, or `sandgym sandbox prune`", sid, why)
            if self._orphan_scope is not None:  # stop reaping before the provider closes
                # A short-lived process (`sandbox run`) still finishes its one pass.
                with anyio.move_on_after(ORPHAN_PASS_WAIT_S):
                    while self._orphan_pass:
                        await anyio.sleep(0.02)
                self._orphan_scope.cancel()
                await self._orphan_done.wait()
            await self.provider.aclose()

    @property
    def live(self) -> int:
        """Sandboxes that exist right now (leased + warm)."""
        return len(self._live)

    @property
    def idle(self) -> int:
        return sum(len(q) for q in self._idle.values())

    # ---- acquire / release -----------------------------------------------------------

    @asynccontextmanager
    async def sandbox(
        self, spec: SandboxSpec | None = None, *, reuse: bool = False
    ) -> AsyncIterator[ManagedSandbox]:
        """A sandbox for the block; always released (destroyed, or with `reuse` reset and
        pooled when the block ended without an error), on error and cancellation."""
        sb = await self.acquire(spec)
        ok = False
        try:
            yield sb
            ok = True
        finally:
            await self.release(sb, reuse=reuse and ok)

    async def acquire(self, spec: SandboxSpec | None = None) -> ManagedSandbox:
        """Hand out a ready sandbox: a warm one for this spec if any, else a new one (waiting
        for a free slot when the cap is reached)."""
        if self._closed:
            raise RuntimeError("SandboxManager is closed")
        spec = spec or SandboxSpec()
        key = spec.key()
        if key not in self._checked and not self._idle[key]:
            # Bad specs fail here, before any container is made; once per spec. Checking
            # again per lease cost blocking engine calls in the event loop each (HumanEval:
            # 164 image inspections, 0.85 s of a 3.5 s eval; the learning gate's GRPO waits
            # for a free sandbox on most of its 128 rollouts a step). What changes later (an
            # image removed, the engine gone) fails the create, with its own error.
            self.provider.check(spec)
            self._checked.add(key)
        while True:
            while self._idle[key]:
                sb = self._idle[key].popleft()
                self.stats["pool_hits"] += 1
                self._refill_soon(key)
                try:
                    return await self._hand_out(sb)
                except HookError as exc:  # that warm one is gone; try the next or make one
                    log.warning("%s; destroyed %s", exc, sb.id)
            if await self._take_slot(key):
                break
            # else a sandbox of this spec came back to the pool (reuse) or got warm: take it
        try:
            sb = await self._create(spec)
        except BaseException as exc:
            if not isinstance(exc, SpecError):
                self._checked.discard(key)  # the engine may be gone: the next lease asks at once
            self._slots.release()
            self._notify()
            raise
        # From here the slot belongs to `sb` and is freed by _destroy.
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._destroy(sb)
            raise
        self._refill_soon(key)
        return await self._hand_out(sb)

    async def release(self, sb: ManagedSandbox, *, reuse: bool = False) -> None:
        """Give a sandbox back. With `reuse`, a healthy sandbox that a warm pool for its spec
        wants is reset (`Sandbox.reset`: no processes of its users, empty workdir and /tmp)
        and pooled; otherwise, or when the provider cannot reset, it is destroyed -- in the
        background inside `async with` when `reuse` was asked or `background_recycle` is set
        (its slot is freed once it is gone), so the caller goes on at once."""
        if sb.id not in self._live or not sb.leased:
            return  # already released
        sb.leased = False
        with anyio.CancelScope(shield=True):
            try:
                await self.hooks.run("on_release", sb)
            except HookError as exc:
                log.warning("%s", exc)
                sb.failed = True
            target = self._pool_target.get(sb.spec.key())
            want = target is not None and len(self._idle[sb.spec.key()]) < target[1]
            if reuse and want and not sb.failed and not self._expired(sb) and not self._closed:
                try:
                    clean = await sb.inner.reset()
                except Exception as exc:
                    log.warning("reset of %s failed: %r", sb.id, exc)
                    clean = False
                if clean and not self._closed:
                    self.stats["reused"] += 1
                    self._idle[sb.spec.key()].append(sb)
                    self._notify()
                    return
            if self._tg is not None and not self._closed and (reuse or self.background_recycle):
                self._recycling.add(sb.id)
                self._tg.start_soon(self._recycle, sb)
                return
            await self._destroy(sb)

    async def destroy(self, sb: ManagedSandbox) -> None:
        """Destroy a handed-out sandbox now: never pooled, not in the background (its slot
        is free when this returns)."""
        if sb.id not in self._live:
            return
        sb.leased = False
        sb.failed = True
        with anyio.CancelScope(shield=True):
            await self._destroy(sb)

    async def _recycle(self, sb: ManagedSandbox) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self._destroy(sb)
        finally:
            self._recycling.discard(sb.id)

    async def _hand_out(self, sb: ManagedSandbox) -> ManagedSandbox:
        """Run on_ready and lease it; on failure (or cancellation) destroy it and re-raise."""
        try:
            await self.hooks.run("on_ready", sb)
        except BaseException:
            sb.failed = True
            with anyio.CancelScope(shield=True):
                await self._destroy(sb)
            raise
        sb.leased = True
        return sb

    def _notify(self) -> None:
        """A slot was freed or a sandbox became idle: wake the callers waiting in acquire."""
        self._wakeup.set()
        self._wakeup = anyio.Event()

    async def _take_slot(self, key: str | None = None) -> bool:
        """Wait for a slot (True), or until an idle sandbox of `key` is there to take
        (False: pooled ones hold slots, so a reused sandbox must wake the waiters too); if
        every slot is held and some are idle warm sandboxes of other specs, evict one rather
        than wait forever."""
        while True:
            if key is not None and self._idle[key]:
                return False
            try:
                self._slots.acquire_nowait()
                return True
            except anyio.WouldBlock:
                pass
            victim = next((q[0] for k, q in self._idle.items() if q and k != key), None)
            if victim is None:
                await self._wakeup.wait()
                continue
            self._idle[victim.spec.key()].popleft()
            with anyio.CancelScope(shield=True):
                await self._destroy(victim)

    async def _create(self, spec: SandboxSpec) -> ManagedSandbox:
        """Create with retries and backoff. Holds a slot (taken by the caller)."""
        last: BaseException | None = None
        for attempt in range(self.create_retries + 1):
            if attempt:
                await anyio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            # Shielded: a caller cancelled mid-create must not orphan the container.
            with anyio.CancelScope(shield=True):
                try:
                    inner = await self.provider.create(spec, self.labels)
                except SpecError:
                    raise
                except Exception as exc:
                    if getattr(exc, "retryable", True) is False:  # e.g. ImagePullError
                        raise
                    self.stats["create_failures"] += 1
                    log.warning("create attempt %d/%d failed: %r", attempt + 1, self.create_retries + 1, exc)
                    last = exc
                    continue
                sb = ManagedSandbox(inner, self)
                self._live[sb.id] = sb
                self.stats["created"] += 1
                try:
                    await self.hooks.run("on_create", sb)
                except HookError:
                    sb.failed = True
                    await self._destroy(sb, slot_already_counted=True)
                    raise
            return sb
        raise SandboxCreateError(f"could not create a sandbox after {self.create_retries + 1} attempts: {last!r}") from last

    async def _destroy(self, sb: ManagedSandbox, *, slot_already_counted: bool = False) -> None:
        """Destroy and free its slot. Never raises; shielded by callers."""
        if sb.id not in self._live or sb.destroying:
            return
        sb.destroying = True
        for q in self._idle.values():
            if sb in q:
                q.remove(sb)
        try:
            await self.hooks.run_quietly("on_destroy", sb)
            await sb.inner.close()
        except Exception as exc:
            log.warning("destroying sandbox %s failed: %r; trying provider.remove", sb.id, exc)
            try:
                await self.provider.remove(sb.id)
            except Exception as exc2:
                self._unremoved[sb.id] = repr(exc2)
                log.warning("sandbox %s could not be removed (%r); trying again later", sb.id, exc2)
        finally:
            # Counted live until really gone, so the cap covers sandboxes being torn down.
            self._live.pop(sb.id, None)
            self.stats["destroyed"] += 1
            # A hook failure inside _create destroys before the caller releases the slot.
            if not slot_already_counted:
                self._slots.release()
                self._notify()

    # ---- adopt / detach (a server that outlives its process: sandgym serve) ---------------

    def adopt(self, inner: Sandbox, *, age_s: float = 0.0) -> ManagedSandbox:
        """Take over a running sandbox made earlier (`provider.adopt`), leased, holding a
        slot; `age_s` is how long it has existed (its TTL counts from its creation). Raises
        RuntimeError when every slot is taken."""
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            raise RuntimeError(f"cannot adopt {inner.id}: all {self.max_sandboxes} slots are taken") from None
        sb = ManagedSandbox(inner, self)
        sb.created_at = time.monotonic() - max(0.0, age_s)
        sb.leased = True
        self._live[sb.id] = sb
        return sb

    async def detach(self, sb: ManagedSandbox) -> None:
        """Let go of a leased sandbox without destroying it (another process may adopt it):
        it leaves this manager and frees its slot; `close()` will not touch it."""
        if self._live.pop(sb.id, None) is None:
            return
        sb.leased = False
        try:
            with anyio.CancelScope(shield=True):
                await sb.inner.detach()
        finally:
            self._slots.release()
            self._notify()

    # ---- warm pools ------------------------------------------------------------------

    async def warm(self, spec: SandboxSpec | None = None, n: int = 1, *, wait: bool = True) -> None:
        """Keep `n` ready sandboxes of `spec` (capped at max_sandboxes); waits until made
        (with `wait=False` inside `async with`, they are made in the background, so work can
        start with the first). Handed-out warm sandboxes are replaced in the background while
        inside `async with`."""
        spec = spec or SandboxSpec()
        key = spec.key()
        n = max(0, min(n, self.max_sandboxes))
        current = self._pool_target.get(key)
        if current is None or n > current[1]:
            # Checked before sandboxes of it are made. Lowering a pool makes none, and must
            # not fail for an engine that is away: an eval lowers its pool near the end, and a
            # Docker restart then ended the whole eval with the check's error.
            self.provider.check(spec)
            self._checked.add(key)
        self._pool_target[key] = (spec, n)
        if not wait and self._tg is not None:
            self._tg.start_soon(self._fill, key)
            return
        await self._fill(key)

    async def _fill(self, key: str) -> None:
        target = self._pool_target.get(key)
        if target is None:
            return
        spec, n = target
        missing = n - len(self._idle[key])
        if missing <= 0:
            return

        async def one() -> None:
            # Only use a free slot; warming must never starve callers or evict.
            try:
                self._slots.acquire_nowait()
            except anyio.WouldBlock:
                return
            try:
                sb = await self._create(spec)
            except BaseException as exc:
                self._slots.release()
                self._notify()
                if not isinstance(exc, Exception):
                    raise
                log.warning("warm pool create failed: %r", exc)
                return
            wanted = self._pool_target.get(key)
            if self._closed or wanted is None or len(self._idle[key]) >= wanted[1]:
                # Made while closing (the task group may be cancelled now), or for a pool
                # that was lowered (`cool`) meanwhile.
                with anyio.CancelScope(shield=True):
                    await self._destroy(sb)
            else:
                self._idle[key].append(sb)
                self._notify()

        async with anyio.create_task_group() as tg:
            for _ in range(missing):
                tg.start_soon(one)

    async def cool(self, spec: SandboxSpec, n: int = 0) -> int:
        """Lower the warm pool of `spec` to `n` (0: no pool) and destroy the idle sandboxes
        past it; returns how many were destroyed."""
        key = spec.key()
        if n > 0:
            self._pool_target[key] = (spec, min(n, self.max_sandboxes))
        else:
            self._pool_target.pop(key, None)
        extra = []
        while len(self._idle[key]) > max(0, n):
            extra.append(self._idle[key].pop())
        with anyio.CancelScope(shield=True):
            for sb in extra:
                await self._destroy(sb)
        return len(extra)

    def _refill_soon(self, key: str) -> None:
        if self._tg is not None and key in self._pool_target and not self._closed:
            self._tg.start_soon(self._fill, key)

    # ---- reaping ---------------------------------------------------------------------

    def _expired(self, sb: ManagedSandbox) -> bool:
        ttl = sb.spec.ttl_s
        return ttl is not None and time.monotonic() - sb.created_at > ttl

    async def reap(self) -> int:
        """Destroy sandboxes past their TTL (leased ones too: their lease has expired)."""
        expired = [sb for sb in list(self._live.values()) if self._expired(sb)]
        with anyio.CancelScope(shield=True):
            for sb in expired:
                log.warning("sandbox %s exceeded ttl_s=%s; destroying", sb.id, sb.spec.ttl_s)
                sb.leased = False
                await self._destroy(sb)
        return len(expired)

    async def _reaper(self) -> None:
        while True:
            await anyio.sleep(self.reap_interval_s)
            try:
                await self.reap()
                await self._retry_removals()
            except Exception as exc:  # the reaper must outlive a bad tick
                log.warning("reaper tick failed: %r", exc)

    async def _retry_removals(self) -> int:
        """Try again to remove the sandboxes whose removal failed; how many are left. One
        pass at a time (the reaper's tick and close() may both ask)."""
        async with self._retrying:
            for sid in list(self._unremoved):
                try:
                    await self.provider.remove(sid)
                except Exception as exc:
                    self._unremoved[sid] = repr(exc)
                else:
                    self._unremoved.pop(sid, None)
                    log.info("sandbox %s removed on a later try", sid)
            return len(self._unremoved)

    async def _orphan_reaper(self) -> None:
        try:
            with anyio.CancelScope() as scope:
                self._orphan_scope = scope
                while not self._closed:
                    try:
                        self._orphan_pass = True
                        try:
                            report = await prune(self.provider)
                        finally:
                            self._orphan_pass = False
                        self.last_orphan_reap = report
                        if report.removed:
                            log.info("removed %d sandboxes whose owner process is gone", len(report.removed))
                        for sid, why in report.failed.items():
                            log.warning("could not remove orphaned sandbox %s: %s", sid, why)
                    except Exception as exc:  # an engine hiccup must not end the run
                        log.warning("orphan reaping failed: %r", exc)
                    await anyio.sleep(self.orphan_reap_interval_s)
        finally:
            self._orphan_done.set()

    async def prune(self, *, everything: bool = False) -> PruneReport:
        """Remove this provider's sandboxes whose owner process is dead."""
        return await prune(self.provider, everything=everything)
