"""Docker's attach stream: the hijacked connection of one `exec start`, and the one parser of
its multiplexed frames. The exec transport (exec.py) reads commands' output through these.

A frame is an 8-byte header (stream id: 1 stdout, 2 stderr; 3 zero bytes; big-endian
payload length) followed by the payload. Waiting for data uses poll(2), never select(2),
which fails for file descriptors >= 1024 (a busy driver holds more than that).
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 1 << 16
_HEADER = struct.Struct(">BxxxL")


class Demux:
    """Incremental parser of the multiplexed stream. `feed` takes bytes as they arrive, cut
    anywhere, and returns the payload they complete, in order, as ("stdout" | "stderr",
    bytes) pieces (consecutive pieces of one stream joined). Nothing is held back but a
    partial header, so memory stays bounded however long a frame is."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._left = 0  # payload bytes of the current frame still to come
        self._kind = "stdout"

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        view = memoryview(data)
        while view:
            if self._left == 0:
                need = _HEADER.size - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < _HEADER.size:
                    break
                stream_id, self._left = _HEADER.unpack(self._header)
                self._header.clear()
                # stdin (0) never comes back; anything but stdout counts as stderr.
                self._kind = "stdout" if stream_id == 1 else "stderr"
                continue
            take = view[: self._left]
            view = view[len(take) :]
            self._left -= len(take)
            if out and out[-1][0] == self._kind:
                out[-1] = (self._kind, out[-1][1] + bytes(take))
            else:
                out.append((self._kind, bytes(take)))
        return out


class AttachStream:
    """The hijacked connection of one `exec start`: read with a deadline, write stdin."""

    def __init__(self, raw: Any) -> None:
        self._io = raw  # socket.SocketIO for unix/tcp sockets
        self.sock: socket.socket = getattr(raw, "_sock", raw)
        self.sock.settimeout(None)  # we wait with poll; stdin writes may take long
        resp = getattr(raw, "_response", None)
        # http.client read the 101 headers through a buffered reader which may already hold
        # the first output frames of a fast command: take those before reading the socket.
        self._buffered = getattr(getattr(getattr(resp, "raw", None), "_fp", None), "fp", None)
        self._response = resp
        self._writer: threading.Thread | None = None
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)

    def take_buffered(self) -> bytes:
        """What http.client read ahead. Call it before any stdin is written: it makes the
        socket non-blocking for a moment, which would break a concurrent sendall."""
        if self._buffered is None:
            return b""
        self.sock.setblocking(False)
        try:
            return self._buffered.read1(CHUNK) or b""
        except (BlockingIOError, OSError, ValueError):
            return b""
        finally:
            self.sock.setblocking(True)

    def recv(self, wait: float) -> bytes | None:
        """Next bytes; b"" at end of stream; None when nothing came within `wait` seconds."""
        if not self._poll.poll(max(wait, 0.0) * 1000):
            return None
        try:
            return self.sock.recv(CHUNK)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_stdin(self, data: bytes) -> None:
        """Write all of stdin in a thread (a command may print while it reads), then
        half-close so the command sees end of file."""

        def pump() -> None:
            try:
                if data:
                    self.sock.sendall(data)
            except OSError as e:  # the command ended or was killed before reading it all
                log.debug("stdin write stopped: %s", e)
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        self._writer = threading.Thread(target=pump, name="sandgym-stdin", daemon=True)
        self._writer.start()

    def close(self) -> None:
        for closer in (self.sock.close, getattr(self._io, "close", None),
                       getattr(self._response, "close", None)):
            if closer is not None:
                try:
                    closer()
                except Exception:  # closing twice or a half-dead connection
                    pass
        if self._writer is not None:
            self._writer.join(timeout=1.0)
