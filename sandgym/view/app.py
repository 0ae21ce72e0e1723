"""The viewer's web app: a JSON API over the run folders (runs.py) and the static front-end.

Safe by default, since trajectories are hostile input and run folders private:
- requests name runs by id and files by a path checked to stay inside the run folder;
- with a token, every request must carry it (the page gets it once as `?token=` and keeps
  it in an HttpOnly, SameSite=Strict cookie);
- the Host header must be one the server was started for (a DNS-rebinding page cannot
  reach a server on 127.0.0.1 under its own name);
- the page's Content-Security-Policy allows only the viewer's own scripts (no inline
  script, no eval), so text that slipped into markup still could not run; the front-end
  itself only ever inserts text (Preact escapes it).
"""

from __future__ import annotations

import hmac
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from .paths import OutsideRunError
from .runs import BFCLRun, EvalRun, RecordsFile, Registry, Run, SWERun, TrainRun, compare, query, record_view, text_at

STATIC = Path(__file__).parent / "static"
COOKIE = "sandgym_view_token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
TEXT_CHUNK = 1 << 20
RECORD_CACHE = 8


class Viewer:
    """What the routes share: the run registry and a few parsed records."""

    def __init__(self, roots: list[Path]) -> None:
        self.registry = Registry(roots)
        self._views: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()

    def run(self, run_id: str) -> Run:
        try:
            return self.registry.get(run_id)
        except KeyError:
            raise HTTPException(404, f"no run {run_id!r}") from None

    def records(self, run_id: str) -> RecordsFile:
        recs = self.run(run_id).records
        if recs is None:
            raise HTTPException(404, f"run {run_id!r} has no rollout records")
        recs.rows()
        return recs

    def record(self, run_id: str, n: int) -> dict[str, Any]:
        recs = self.records(run_id)
        try:
            path, start, end = recs.raw_span(n)
        except KeyError:
            raise HTTPException(404, f"run {run_id!r} has no record {n}") from None
        key = (run_id, n, start)
        if key not in self._views:
            view = record_view(recs.record(n))
            view["n"], view["bytes"] = n, end - start
            self._views[key] = view
            while len(self._views) > RECORD_CACHE:
                self._views.popitem(last=False)
        self._views.move_to_end(key)
        return self._views[key]


def _allowed_host(request: Request, hosts: set[str] | None) -> bool:
    if hosts is None:
        return True
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.strip("[]").lower() in hosts


def create_app(roots: list[Path], *, token: str | None = None, hosts: set[str] | None = None) -> FastAPI:
    """The app over `roots`. `hosts`: the Host names it answers to (None: any, for a server
    bound to every interface, where the token is required)."""
    viewer = Viewer(roots)
    app = FastAPI(title="sandgym view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.viewer = viewer

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not _allowed_host(request, hosts):
            return _secure(JSONResponse({"detail": "unexpected Host header"}, status_code=421))
        if token is not None:
            given = request.query_params.get("token")
            if given is not None and request.url.path == "/" and hmac.compare_digest(given, token):
                resp = RedirectResponse("/", status_code=303)
                resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return _secure(resp)
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            offered = request.cookies.get(COOKIE) or bearer or ""
            if not hmac.compare_digest(offered.encode(), token.encode()):
                return _secure(JSONResponse({"detail": "a token is required: open the URL `sandgym view` printed"}, status_code=401))
        return _secure(await call_next(request))

    @app.exception_handler(OutsideRunError)
    async def outside(_: Request, exc: OutsideRunError) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(FileNotFoundError)
    async def missing(_: Request, exc: FileNotFoundError) -> Response:
        return JSONResponse({"detail": f"no such file in the run: {exc}"}, status_code=404)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        found = viewer.registry.scan()
        return {"roots": viewer.registry.names, "runs": [r.card() for r in sorted(found, key=lambda r: r.id)]}

    @app.get("/api/run")
    def run(id: str) -> dict[str, Any]:
        return viewer.run(id).detail()

    @app.get("/api/rollouts")
    def rollouts(
        run: str, offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=500), sort: str = "n", desc: bool = False,
        error_kind: str | None = None, example_id: int | None = None, truncated: bool | None = None,
        min_reward: float | None = None, max_reward: float | None = None, step: int | None = None, category: str | None = None,
        min_turns: int | None = None,
    ) -> dict[str, Any]:
        recs = viewer.records(run)
        try:
            out = query(recs.rows(), offset=offset, limit=limit, sort=sort, desc=desc, error_kind=error_kind or None,
                        example_id=example_id, truncated=truncated, min_reward=min_reward, max_reward=max_reward,
                        step=step, category=category or None, min_turns=min_turns)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return {**out, "indexing": recs.index.progress(), "index_error": recs.index.error}

    @app.get("/api/record")
    def record(run: str, n: int) -> dict[str, Any]:
        view = viewer.record(run, n)
        extra: dict[str, Any] = {}
        r = viewer.run(run)
        if isinstance(r, BFCLRun):
            extra["bfcl"] = BFCLRun.entry(view)
        return {**view, **extra, "run_kind": r.kind}

    @app.get("/api/text")
    def text(run: str, n: int, path: str, start: int = Query(0, ge=0), length: int = Query(TEXT_CHUNK, ge=1, le=16 * TEXT_CHUNK)) -> dict[str, Any]:
        recs = viewer.records(run)
        try:
            keys = json.loads(path)
            if not isinstance(keys, list):
                raise ValueError
            return text_at(recs.record(n), keys, start, length)
        except (ValueError, KeyError, IndexError):
            raise HTTPException(404, f"no text at {path} in record {n}") from None

    @app.get("/api/raw")
    def raw(run: str, n: int) -> StreamingResponse:
        recs = viewer.records(run)
        try:
            path, start, end = recs.raw_span(n)
        except KeyError:
            raise HTTPException(404, f"run {run!r} has no record {n}") from None

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    data = f.read(min(TEXT_CHUNK, left))
                    if not data:
                        break
                    left -= len(data)
                    yield data

        return StreamingResponse(chunks(), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="record-{n}.json"', "Content-Length": str(end - start)})

    @app.get("/api/compare")
    def compare_runs(a: str, b: str) -> dict[str, Any]:
        ra, rb = viewer.run(a), viewer.run(b)
        if not isinstance(ra, EvalRun) or not isinstance(rb, EvalRun):
            raise HTTPException(400, "compare takes two eval runs")
        return compare(ra, rb)

    @app.get("/api/instance")
    def instance(run: str, key: str) -> dict[str, Any]:
        r = viewer.run(run)
        if not isinstance(r, SWERun):
            raise HTTPException(400, f"run {run!r} is not a SWE run")
        try:
            return r.instance(key)
        except KeyError:
            raise HTTPException(404, f"no instance {key!r} in run {run!r}") from None

    @app.get("/api/file")
    def file(run: str, path: str, start: int = Query(0, ge=0), length: int = Query(TEXT_CHUNK, ge=1, le=16 * TEXT_CHUNK)) -> dict[str, Any]:
        r = viewer.run(run)
        if not isinstance(r, SWERun):
            raise HTTPException(400, f"run {run!r} has no files to show")
        return r.file(path, start, length)

    @app.get("/api/metrics")
    def metrics(run: str, since: int = Query(0, ge=0)) -> dict[str, Any]:
        r = viewer.run(run)
        if not isinstance(r, TrainRun):
            raise HTTPException(400, f"run {run!r} is not a training run")
        return r.metrics_since(since)

    return app


def _secure(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["Cache-Control"] = "no-store"
    return resp
