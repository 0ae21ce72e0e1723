"""Request-body limits: 413 before an oversized body is read whole.

A declared `content-length` past the limit is refused at once; a body without one (chunked)
is counted as it streams and refused when it passes the limit, before the endpoint sees it.
Gateway uploads have their own, larger limit.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _too_large(limit: int) -> bytes:
    return json.dumps({"detail": f"request body is larger than this server's limit of {limit} bytes"}).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, *, default: int, uploads: int) -> None:
        self.app = app
        self.default = default
        self.uploads = uploads

    def limit_for(self, path: str) -> int:
        return self.uploads if path.startswith("/gateway/") and path.endswith("/upload") else self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                await self._refuse(send, 400, b'{"detail": "invalid content-length"}')
                return
            if size > limit:
                await self._refuse(send, 413, _too_large(limit))
                return
        seen = 0
        over = False  # the body passed the limit: whatever the app answers becomes a 413
        replied = False

        async def counted_receive() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True  # the app sees a client that went away, never the rest
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal replied
            if over:
                if not replied:
                    replied = True
                    await self._refuse(send, 413, _too_large(limit))
                return
            replied = replied or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not replied:
            await self._refuse(send, 413, _too_large(limit))

    @staticmethod
    async def _refuse(send: Send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
