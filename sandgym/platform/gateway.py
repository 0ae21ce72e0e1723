"""The per-sandbox gateway: `{gateway_url}/{user_ns}/{job_id}/...` with the sandbox's own
bearer token (from POST /sandbox/{id}/auth). Commands speak Connect (`command_session.
CommandSession`), files plain HTTP (upload, download, read-file), as prime-sandboxes 0.5.1 does.

Gateway answers the SDK understands: 410 `{"error": "sandbox_terminated"}` (and Connect
`not_found`) for a deleted sandbox; 409 while it is not running yet (the SDK then asks
error-context); 404 for a missing file; 413 for a read-file too large without a window.
"""

from __future__ import annotations

import asyncio
import logging
import uuid as uuidlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, File, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from google.protobuf.message import Message
from prime_sandboxes._proto.command_session import command_session_pb2 as pb

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxGoneError, SandboxInterruptedError

from .connect import Codec, ConnectFault, UnsupportedMediaType, end_stream, envelope, iter_envelopes, parse_timeout_ms
from .models import ReadFileOut, UploadOut
from .service import Service
from .sessions import Session
from .store import Record

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
DATA_CHUNK = 256 * 1024
MAX_READ_BYTES = 32 << 20  # read-file without a window; larger files answer 413
SERVICE = "command_session.CommandSession"
EXEC_TIMEOUT_HEADER = "x-sandgym-exec-timeout-ms"
# A client that reads truncation from the end event's status (sandgym's prime provider) sends
# this; plain SDK clients, whose CommandResponse has no such flag, get a note on stderr.
TRUNCATION_HEADER = "x-sandgym-truncation"


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class GatewayRefusal(Exception):
    def __init__(self, status: int, body: dict[str, str], connect_code: str) -> None:
        super().__init__(body.get("message", body.get("error", "")))
        self.status = status
        self.body = body
        self.connect_code = connect_code

    def http(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status)

    def connect(self) -> ConnectFault:
        return ConnectFault(self.connect_code, self.body.get("message") or self.body["error"])


def _resolve(service: Service, request: Request, user_ns: str, job_id: str) -> tuple[Record, Sandbox]:
    rec = service.store.get_any(job_id)
    if rec is None or rec.tenant != user_ns:
        raise GatewayRefusal(502, {"error": "sandbox_not_found", "message": f"no sandbox {job_id}"}, "not_found")
    if service.gateway_record(user_ns, job_id, _bearer(request)) is None:
        raise GatewayRefusal(401, {"error": "unauthenticated", "message": "invalid or expired gateway token"}, "unauthenticated")
    if rec.ended:
        raise GatewayRefusal(410, {"error": "sandbox_terminated", "message": f"sandbox {job_id} is {rec.status}"}, "not_found")
    sb = rec.sandbox
    if rec.status != "RUNNING" or sb is None:
        raise GatewayRefusal(409, {"error": "sandbox_not_running", "message": f"sandbox {job_id} is {rec.status}"}, "unavailable")
    rec.touch()
    return rec, sb


def _event(**kw: object) -> pb.StartResponse:
    return pb.StartResponse(event=pb.CommandSessionEvent(**kw))


def truncation_note(limit: int) -> str:
    return f"output truncated: a stream passed this server's limit of {limit} bytes; the rest was dropped"


def _end(code: int, error: str | None = None, note: str | None = None) -> pb.StartResponse:
    status = f"exit status {code}" + (f"; {note}" if note else "")
    end = pb.CommandSessionEvent.EndEvent(exit_code=code, exited=error is None, status=status)
    if error:
        end.error = error
    return _event(end=end)


def _data(kind: str, data: bytes) -> list[pb.StartResponse]:
    return [
        _event(data=pb.CommandSessionEvent.DataEvent(**{kind: data[i : i + DATA_CHUNK]}))
        for i in range(0, len(data), DATA_CHUNK)
    ]


def build_router(service: Service) -> APIRouter:
    router = APIRouter(
        prefix="/gateway/{user_ns}/{job_id}",
        tags=["gateway"],
        responses={
            401: {"description": "Missing, wrong or expired gateway token (POST /sandbox/{id}/auth for one)"},
            409: {"description": "The sandbox is not running yet"},
            410: {"description": '`{"error": "sandbox_terminated"}`: the sandbox was deleted'},
            502: {"description": '`{"error": "sandbox_not_found"}`: no such sandbox (the SDK\'s contract)'},
        },
    )

    # ---- Connect: command_session.CommandSession ---------------------------------------

    @router.post(
        f"/{SERVICE}/{{method}}",
        summary="Connect RPC (command_session.CommandSession)",
        responses={
            400: {"description": "Unary call: invalid_argument / failed_precondition (Connect error JSON)"},
            404: {"description": "Unary call: not_found (no such session)"},
            429: {"description": "Unary call: resource_exhausted"},
            501: {"description": "Unary call: unimplemented method"},
            503: {"description": "Unary call: unavailable (sandbox not running yet)"},
            504: {"description": "Unary call: deadline_exceeded"},
        },
    )
    async def rpc(user_ns: str, job_id: str, method: str, request: Request) -> Response:
        spec = RPCS.get(method)
        stream = spec is not None and spec.streaming
        try:
            codec = Codec.from_content_type(request.headers.get("content-type", ""), stream=stream)
        except UnsupportedMediaType as exc:
            return JSONResponse(
                {"code": "invalid_argument", "message": str(exc)}, status_code=415, headers={"Accept-Post": exc.accepted}
            )
        try:
            deadline = parse_timeout_ms(request.headers.get("connect-timeout-ms"))
            body = await request.body()
            if stream:
                msgs = list(iter_envelopes(body, request.headers.get("connect-content-encoding")))
                if len(msgs) != 1:
                    raise ConnectFault("invalid_argument", f"expected one request message, got {len(msgs)}")
                raw = msgs[0]
            else:
                raw = body
            rec, sb = _resolve(service, request, user_ns, job_id)
        except GatewayRefusal as refusal:
            fault = refusal.connect()
            return _stream_error(codec, fault) if stream else _unary_error(fault)
        except ConnectFault as fault:
            return _stream_error(codec, fault) if stream else _unary_error(fault)

        try:
            if spec is None:
                raise ConnectFault("unimplemented", f"{SERVICE}/{method} is not supported by this server")
            return await spec.handler(RpcCall(service, rec, sb, codec, raw, deadline, request.headers))
        except ConnectFault as fault:
            return _stream_error(codec, fault) if stream else _unary_error(fault)
        except SandboxGoneError as exc:
            service.sandbox_died(rec, exc)
            gone = ConnectFault("not_found", str(exc))
            return _stream_error(codec, gone) if stream else _unary_error(gone)
        except SandboxInterruptedError as exc:  # the sandbox lives on: a transient failure
            cut = ConnectFault("unavailable", str(exc))
            return _stream_error(codec, cut) if stream else _unary_error(cut)
        except Exception as exc:
            log.exception("gateway %s failed", method)
            internal = ConnectFault("internal", f"{type(exc).__name__}: {exc}")
            return _stream_error(codec, internal) if stream else _unary_error(internal)

    # ---- files -------------------------------------------------------------------------

    def file_call_failed(rec: Record, exc: SandboxError, error: str) -> JSONResponse:
        """A file call's failure as the answer: a sandbox that is gone is 410 (and its record
        learns that it died); one cut short by a fault the sandbox survived is 503; anything
        else the sandbox could not do is 400 `error`."""
        if isinstance(exc, SandboxGoneError):
            service.sandbox_died(rec, exc)
            return JSONResponse({"error": "sandbox_terminated", "message": str(exc)}, status_code=410)
        if isinstance(exc, SandboxInterruptedError):  # the sandbox lives on: try again
            return JSONResponse({"error": "sandbox_interrupted", "message": str(exc)}, status_code=503)
        return JSONResponse({"error": error, "message": f"{type(exc).__name__}: {exc}"}, status_code=400)

    @router.post(
        "/upload",
        response_model=UploadOut,
        summary="Upload a file (multipart field `file`)",
        responses={400: {"description": "The file could not be written"}},
    )
    async def upload(
        user_ns: str,
        job_id: str,
        request: Request,
        path: str = Query(min_length=1, max_length=4096),
        file: UploadFile = File(...),
        sandbox_id: str | None = Query(None),
    ) -> Response:
        try:
            rec, sb = _resolve(service, request, user_ns, job_id)
        except GatewayRefusal as refusal:
            return refusal.http()
        if "\x00" in path:
            return JSONResponse({"error": "invalid_path", "message": "path contains NUL"}, status_code=400)
        data = await file.read()
        rec.active_ops += 1
        try:
            await sb.write_file(path, data)
        except SandboxError as exc:  # what write_file raises (base.Sandbox); anything else is a bug: 500
            return file_call_failed(rec, exc, "upload_failed")
        finally:
            rec.active_ops -= 1
        rec.log(f"upload {path} ({len(data)} bytes)")
        out = UploadOut(success=True, path=sb.resolve(path), size=len(data), timestamp=datetime.now(UTC))
        return JSONResponse(out.model_dump(mode="json"))

    async def _read(request: Request, user_ns: str, job_id: str, path: str) -> bytes | Response:
        try:
            rec, sb = _resolve(service, request, user_ns, job_id)
        except GatewayRefusal as refusal:
            return refusal.http()
        rec.active_ops += 1
        try:
            return await sb.read_file(path)
        except SandboxFileNotFound:
            return JSONResponse({"error": "file_not_found", "message": f"File not found: {path}"}, status_code=404)
        except SandboxError as exc:  # what read_file raises (base.Sandbox); anything else is a bug: 500
            return file_call_failed(rec, exc, "read_failed")
        finally:
            rec.active_ops -= 1

    @router.get(
        "/download",
        summary="Download a file (raw bytes)",
        responses={400: {"description": "Not readable (e.g. a directory)"}, 404: {"description": "No such file"}},
    )
    async def download(
        user_ns: str,
        job_id: str,
        request: Request,
        path: str = Query(min_length=1, max_length=4096),
        sandbox_id: str | None = Query(None),
    ) -> Response:
        data = await _read(request, user_ns, job_id, path)
        if isinstance(data, Response):
            return data
        return Response(data, media_type="application/octet-stream")

    @router.get(
        "/read-file",
        response_model=ReadFileOut,
        summary="Read a file as text, optionally a byte window",
        responses={
            400: {"description": "Not readable (e.g. a directory)"},
            404: {"description": "No such file"},
            413: {"description": "Too large to read whole: give offset/length"},
        },
    )
    async def read_file(
        user_ns: str,
        job_id: str,
        request: Request,
        path: str = Query(min_length=1, max_length=4096),
        offset: int | None = Query(None, ge=-(1 << 40), le=1 << 40, description="negative: from the end"),
        length: int | None = Query(None, ge=0, le=1 << 40),
    ) -> Response:
        data = await _read(request, user_ns, job_id, path)
        if isinstance(data, Response):
            return data
        total = len(data)
        if offset is None and length is None:
            if total > MAX_READ_BYTES:
                return JSONResponse(
                    {"error": "file_too_large", "message": f"{total} bytes > {MAX_READ_BYTES}; read a window"},
                    status_code=413,
                )
            out = ReadFileOut(content=data.decode("utf-8", errors="replace"), size=total, total_size=total, offset=0, truncated=False)
        else:
            start = offset or 0
            start = max(0, total + start) if start < 0 else min(start, total)
            end = total if length is None else min(total, start + min(length, MAX_READ_BYTES))
            window = data[start:end]
            out = ReadFileOut(
                content=window.decode("utf-8", errors="replace"),
                size=len(window),
                total_size=total,
                offset=start,
                truncated=start > 0 or end < total,
            )
        return JSONResponse(out.model_dump(mode="json"))

    return router


# ---- Connect methods: one handler each ---------------------------------------------------


@dataclass(frozen=True)
class RpcCall:
    """One Connect call, decoded as far as every method needs: the sandbox is resolved (and
    its token checked), `raw` is the one request message, `deadline` the Connect timeout."""

    service: Service
    rec: Record
    sb: Sandbox
    codec: Codec
    raw: bytes
    deadline: float | None
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Rpc:
    handler: Callable[[RpcCall], Awaitable[Response]]
    streaming: bool  # server-streaming (enveloped request and response) or unary


async def _rpc_start(call: RpcCall) -> Response:
    deadline = call.deadline
    # sandgym's prime provider also sends the command's own timeout, shorter than the Connect
    # deadline, so the server's deadline_exceeded (sent after the kill finished) reaches it
    # before its client-side timer fires.
    exec_timeout = parse_timeout_ms(call.headers.get(EXEC_TIMEOUT_HEADER))
    if exec_timeout is None or (deadline is not None and exec_timeout > deadline):
        # Plain SDK clients time out at the deadline themselves: kill a little earlier (exec
        # start-up inside the sandbox delays its timer), so the command is gone by the time
        # the client sees DEADLINE_EXCEEDED.
        exec_timeout = deadline - min(1.0, 0.25 * deadline) if deadline is not None else None
    req = call.codec.decode(call.raw, pb.StartRequest)
    note_in_status = call.headers.get(TRUNCATION_HEADER) == "status"
    return await _start(call.service, call.rec, call.sb, req, call.codec, exec_timeout, note_in_status)


def _refuse_while_draining(service: Service) -> None:
    """A live-process stream would hold a draining server to its bound: `unavailable`, which
    the SDK answers by re-attaching (to the next server, once this one is gone)."""
    if service.draining:
        raise ConnectFault("unavailable", "the server is restarting; re-attach to the process")


async def _rpc_connect(call: RpcCall) -> Response:
    _refuse_while_draining(call.service)
    req = call.codec.decode(call.raw, pb.ConnectRequest)
    sess = _session(call.rec, req.session)
    return _stream(call.codec, _follow(sess), call.deadline, call.rec, call.service.sandbox_died)


async def _rpc_send_input(call: RpcCall) -> Response:
    req = call.codec.decode(call.raw, pb.SendInputRequest)
    sess = _session(call.rec, req.session)
    key = f"in:{req.input_uuid}" if req.HasField("input_uuid") else None
    if key is None or key not in sess.seen:
        if sess.ended_at is not None:
            raise ConnectFault("failed_precondition", "process has exited")
        data = req.input.stdin if req.input.HasField("stdin") else req.input.pty
        await sess.process.write_stdin(bytes(data))
        if key:
            sess.seen.add(key)
    return _unary(call.codec, pb.SendInputResponse())


async def _rpc_send_signal(call: RpcCall) -> Response:
    req = call.codec.decode(call.raw, pb.SendSignalRequest)
    sess = _session(call.rec, req.session)
    if req.signal not in (9, 15):
        raise ConnectFault("invalid_argument", f"unsupported signal {req.signal}; use SIGTERM or SIGKILL")
    key = f"sig:{req.signal_uuid}" if req.HasField("signal_uuid") else None
    if (key is None or key not in sess.seen) and sess.ended_at is None:
        await sess.process.signal(req.signal)
        if key:
            sess.seen.add(key)
    return _unary(call.codec, pb.SendSignalResponse())


async def _rpc_list(call: RpcCall) -> Response:
    call.codec.decode(call.raw, pb.ListRequest)
    assert call.rec.sessions is not None
    infos = [
        pb.CommandSessionInfo(
            command=pb.CommandSpec(cmd=s.argv[0], args=s.argv[1:]),
            pid=s.process.pid,
            session_uuid=s.uuid,
        )
        for s in call.rec.sessions.running()
    ]
    return _unary(call.codec, pb.ListResponse(sessions=infos))


# command_session.CommandSession's methods; anything else answers `unimplemented`.
RPCS: dict[str, Rpc] = {
    "Start": Rpc(_rpc_start, streaming=True),
    "Connect": Rpc(_rpc_connect, streaming=True),
    "SendInput": Rpc(_rpc_send_input, streaming=False),
    "SendSignal": Rpc(_rpc_send_signal, streaming=False),
    "List": Rpc(_rpc_list, streaming=False),
}


# ---- Connect plumbing ------------------------------------------------------------------


def _unary(codec: Codec, msg: Message) -> Response:
    return Response(codec.encode(msg), media_type=codec.unary_content_type())


def _unary_error(fault: ConnectFault) -> Response:
    return JSONResponse(fault.to_dict(), status_code=fault.http_status)


def _stream_error(codec: Codec, fault: ConnectFault) -> Response:
    return Response(end_stream(fault), media_type=codec.stream_content_type())


def _session(rec: Record, selector: pb.CommandSessionSelector) -> Session:
    assert rec.sessions is not None
    uuid = selector.session_uuid if selector.HasField("session_uuid") else None
    pid = selector.pid if selector.HasField("pid") else None
    sess = rec.sessions.get(uuid, pid)
    if sess is None:
        raise ConnectFault("not_found", "no such command session (it exited and expired, or never existed)")
    return sess


def _stream(
    codec: Codec,
    events: AsyncIterator[pb.StartResponse],
    deadline: float | None,
    rec: Record,
    on_gone: Callable[[Record, BaseException], None] | None = None,
) -> StreamingResponse:
    """Envelopes from `events`, keepalives while quiet, `deadline_exceeded` at the deadline."""

    async def body() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + deadline if deadline is not None else None
        it = events.__aiter__()
        pending: asyncio.Task[pb.StartResponse] | None = None
        rec.active_ops += 1
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(it.__anext__())
                wait = KEEPALIVE_S if stop_at is None else max(0.0, min(KEEPALIVE_S, stop_at - loop.time()))
                done, _ = await asyncio.wait({pending}, timeout=wait)
                if not done:
                    if stop_at is not None and loop.time() >= stop_at:
                        yield end_stream(ConnectFault("deadline_exceeded", "command deadline exceeded"))
                        return
                    yield envelope(codec.encode(_event(keepalive=pb.CommandSessionEvent.KeepAlive())))
                    continue
                task, pending = pending, None
                try:
                    msg = task.result()
                except StopAsyncIteration:
                    yield end_stream()
                    return
                except ConnectFault as fault:
                    yield end_stream(fault)
                    return
                except SandboxGoneError as exc:
                    if on_gone is not None:
                        on_gone(rec, exc)
                    yield end_stream(ConnectFault("not_found", str(exc)))
                    return
                except SandboxInterruptedError as exc:  # the sandbox lives on: a transient failure
                    yield end_stream(ConnectFault("unavailable", str(exc)))
                    return
                except Exception as exc:
                    log.exception("command stream failed")
                    yield end_stream(ConnectFault("internal", f"{type(exc).__name__}: {exc}"))
                    return
                yield envelope(codec.encode(msg))
        finally:
            rec.active_ops -= 1
            rec.touch()
            if pending is not None:
                pending.cancel()
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    pass

    return StreamingResponse(body(), media_type=codec.stream_content_type())


async def _start(
    service: Service,
    rec: Record,
    sb: Sandbox,
    req: pb.StartRequest,
    codec: Codec,
    deadline: float | None,
    note_in_status: bool = False,
) -> Response:
    spec = req.command
    argv = [spec.cmd, *spec.args] if spec.cmd else list(spec.args)
    if not argv:
        raise ConnectFault("invalid_argument", "command.cmd is empty")
    # Commands run as the sandbox's one user (strict: the non-root `sandbox`; vm: root unless
    # the spec names another); naming it is fine, another is not.
    own = sb.spec.user or ("root" if sb.spec.profile == "vm" else "sandbox")
    aliases = {own, "0"} if own == "root" else {own}
    if spec.HasField("user") and spec.user and spec.user not in aliases:
        raise ConnectFault(
            "invalid_argument",
            f"running as user {spec.user!r} is not supported here; this sandbox runs commands as {own!r}",
        )
    env = dict(spec.envs)
    cwd = spec.cwd if spec.HasField("cwd") and spec.cwd else None
    service.counters["execs"] += 1
    if req.HasField("stdin") and req.stdin:
        return await _start_live(service, rec, sb, req, argv, env, cwd, codec, deadline)

    async def run() -> AsyncIterator[pb.StartResponse]:
        yield _event(start=pb.CommandSessionEvent.StartEvent(pid=0))
        # exec's timeout kills the command and its children at the deadline; the stream's
        # own deadline is a few seconds later, a backstop for an exec that hangs.
        call = sb.exec(argv, timeout=deadline, env=env, cwd=cwd)
        # With a deadline, a client that hangs up does not cancel the exec: it ends by its
        # own timeout, whose kill is complete when it returns (a cancelled exec is killed
        # asynchronously, racing the client's next command).
        res = await _detached(call) if deadline is not None else await call
        rec.log(f"exec exit={res.exit_code} timed_out={res.timed_out} {argv[-1][:200]!r}")
        if res.timed_out:
            raise ConnectFault("deadline_exceeded", f"command timed out after {deadline}s")
        note = truncation_note(res.output_limit or sb.spec.output_limit_bytes) if res.truncated else None
        stderr = res.stderr_bytes
        if note is not None:
            rec.log(f"exec {note}")
            if not note_in_status:
                stderr += f"\nsandgym: {note}\n".encode()  # no [brackets]: rich (the CLI) reads them as markup
        for m in _data("stdout", res.stdout_bytes) + _data("stderr", stderr):
            yield m
        yield _end(res.exit_code, note=note)

    return _stream(codec, run(), deadline + 5.0 if deadline is not None else None, rec, service.sandbox_died)


_DETACHED: set[asyncio.Task[object]] = set()


async def _detached(coro: Any) -> Any:
    task = asyncio.ensure_future(coro)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    return await asyncio.shield(task)


async def _start_live(
    service: Service,
    rec: Record,
    sb: Sandbox,
    req: pb.StartRequest,
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    codec: Codec,
    deadline: float | None,
) -> Response:
    assert rec.sessions is not None
    _refuse_while_draining(service)
    uuid = req.session_uuid if req.HasField("session_uuid") and req.session_uuid else None
    sess = rec.sessions.get(uuid) if uuid else None
    if sess is None:
        proc = await sb.start_live(argv, env=env, cwd=cwd)
        sess = Session(uuid=uuid or str(uuidlib.uuid4()), argv=argv, cwd=cwd, process=proc)
        events = _follow(sess)  # subscribed before the pump starts: no output is missed
        service.start_session(rec, sess)
        rec.log(f"live process {sess.uuid} pid={proc.pid} {argv[-1][:200]!r}")
    else:
        events = _follow(sess)
    return _stream(codec, events, deadline, rec, service.sandbox_died)


def _follow(sess: Session) -> AsyncIterator[pb.StartResponse]:
    send, recv = sess.subscribe()

    async def gen() -> AsyncIterator[pb.StartResponse]:
        try:
            yield _event(start=pb.CommandSessionEvent.StartEvent(pid=sess.process.pid))
            async for kind, value in recv:
                if kind == "exit":
                    yield _end(int(value))
                    return
                if isinstance(value, bytes):  # ("stdout" | "stderr", bytes)
                    yield from_data(kind, value)
            if sess.error:
                raise ConnectFault("internal", f"live process failed: {sess.error}")
        finally:
            sess.unsubscribe(send)

    return gen()


def from_data(kind: str, value: bytes) -> pb.StartResponse:
    return _event(data=pb.CommandSessionEvent.DataEvent(**{kind: value}))

