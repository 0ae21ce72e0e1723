"""Length-prefixed JSON frames: the one wire format of execd (daemon.py inside the sandbox,
client.py on the host) and of the judge's in-sandbox harness (sandgym.judge).

A frame is a 4-byte big-endian length, that many bytes of UTF-8 JSON (the header, an
object), then raw payloads whose lengths the header lists in "blobs". Bytes (stdin, stdout,
file contents, tar archives) therefore never pass through base64 or JSON.

Standard library only, Python >= 3.9: it runs inside sandboxes, where daemon.py loads it
from its own folder and the judge sends it as text. Nothing here does I/O of its own: a
reader is any `read(n)` (a file's read, a socket's recv), a writer takes the pieces.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

LEN = struct.Struct(">I")
MAX_HEADER = 16 << 20
ONE_WRITE = 1 << 20  # frames up to this size go out as one piece (one syscall)

Frame = Tuple[Dict[str, Any], List[bytes]]


class FrameError(ValueError):
    """Bytes that are not a frame: a header over MAX_HEADER, or not a JSON object."""


def encode(header: Dict[str, Any], blobs: Sequence[bytes] = ()) -> List[bytes]:
    """The frame as the pieces to send in order: one piece for a small frame, else the
    length and header, then each payload (no copy of a large one). Sets header["blobs"]."""
    header["blobs"] = [len(b) for b in blobs]
    h = json.dumps(header, separators=(",", ":")).encode()
    if len(h) + sum(len(b) for b in blobs) <= ONE_WRITE:
        return [b"".join([LEN.pack(len(h)), h, *blobs])]
    return [LEN.pack(len(h)) + h, *(b for b in blobs if b)]


def header_size(prefix: bytes) -> int:
    """The header length a frame's first LEN.size bytes announce."""
    (n,) = LEN.unpack(prefix)
    if n > MAX_HEADER:
        raise FrameError("header of %d bytes is over the limit" % n)
    return int(n)


def decode_header(data: bytes) -> Dict[str, Any]:
    header = json.loads(data)
    if not isinstance(header, dict):
        raise FrameError("header must be a JSON object")
    return header


def blob_sizes(header: Dict[str, Any]) -> List[int]:
    return [int(k) for k in (header.get("blobs") or [])]


def _exactly(read: Callable[[int], bytes], n: int, first: bytes = b"") -> bytes:
    data = first
    while len(data) < n:
        chunk = read(n - len(data))
        if not chunk:
            raise EOFError("connection closed mid-frame")
        data += chunk
    return data


def read_frame(read: Callable[[int], bytes]) -> Optional[Frame]:
    """The next frame from `read(n)` (up to n bytes, b"" at the end of the stream), or None
    on a clean end of stream between frames. EOFError when the stream ends mid-frame."""
    first = read(LEN.size)
    if not first:
        return None
    n = header_size(_exactly(read, LEN.size, first))
    header = decode_header(_exactly(read, n))
    return header, [_exactly(read, k) if k else b"" for k in blob_sizes(header)]


def recv_frame(rfile: Any) -> Optional[Frame]:
    """`read_frame` from a binary file (a socket's makefile("rb"))."""
    return read_frame(rfile.read)


def recv_frame_fds(sock: socket.socket, max_fds: int) -> Tuple[Optional[Frame], List[int]]:
    """`read_frame` from a unix socket, with the descriptors that came with the frame's
    bytes (SCM_RIGHTS, at most `max_fds` per read); the fork servers' one way to read a job
    (sandgym.judge's zygote, execd's warm interpreter). Raises as read_frame does."""
    fds: List[int] = []

    def read(n: int) -> bytes:
        msg, got, _, _ = socket.recv_fds(sock, n, max_fds)
        fds.extend(got)
        return msg

    return read_frame(read), fds


def send_frame(sock: socket.socket, header: Dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
    for piece in encode(header, blobs):
        sock.sendall(piece)


class FrameReader:
    """Frames parsed from bytes as they arrive in any split (for a socket watched by
    select(), where a buffered file would hide bytes it has already read)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> List[Frame]:
        self.buf += data
        frames = []
        while len(self.buf) >= LEN.size:
            n = header_size(bytes(self.buf[: LEN.size]))
            if len(self.buf) < LEN.size + n:
                break
            header = decode_header(bytes(self.buf[LEN.size : LEN.size + n]))
            sizes = blob_sizes(header)
            end = LEN.size + n + sum(sizes)
            if len(self.buf) < end:
                break
            pos, blobs = LEN.size + n, []
            for k in sizes:
                blobs.append(bytes(self.buf[pos : pos + k]))
                pos += k
            del self.buf[:end]
            frames.append((header, blobs))
        return frames
