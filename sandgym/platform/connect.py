"""The Connect protocol, as much of it as the prime-sandboxes SDK speaks.

Written by hand (not connectrpc's ASGI server) so that gateway auth, sandbox lookup and the
`connect-timeout-ms` deadline live in one place. Wire facts, from connectrpc 0.11's client:
- server streams: request `application/connect+proto` (or `+json`), body is 5-byte envelopes
  (flags, big-endian length); the response is HTTP 200 with envelopes, ending with one whose
  flag 0x02 marks a JSON end-stream message `{}` or `{"error": {"code", "message"}}`;
- unary: request `application/proto` (or `json`), raw message body; errors answer a non-200
  status with an `application/json` body `{"code", "message"}`.
"""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Iterator
from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02

# Connect code -> HTTP status for unary errors (connect protocol spec).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class ConnectFault(Exception):
    """An RPC answered with a Connect error code (lowercase snake, as on the wire)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


class UnsupportedMediaType(Exception):
    """The request's content type is not one this endpoint speaks: HTTP 415."""

    def __init__(self, content_type: str, accepted: str) -> None:
        super().__init__(f"content-type {content_type!r} is not supported here; use {accepted}")
        self.accepted = accepted


class Codec:
    """proto or json, picked from the request's content type."""

    def __init__(self, name: str) -> None:
        if name not in ("proto", "json"):
            raise ConnectFault("unimplemented", f"unsupported codec {name!r}; use proto or json")
        self.name = name

    @classmethod
    def from_content_type(cls, content_type: str, *, stream: bool) -> Codec:
        ct = content_type.partition(";")[0].strip().lower()
        prefix = "application/connect+" if stream else "application/"
        if not ct.startswith(prefix) or ct[len(prefix):] not in ("proto", "json"):
            raise UnsupportedMediaType(ct, f"{prefix}proto or {prefix}json")
        return cls(ct[len(prefix):])

    def decode(self, data: bytes, cls: type[M]) -> M:
        msg = cls()
        try:
            if self.name == "proto":
                msg.ParseFromString(data)
            else:
                json_format.Parse(data.decode() or "{}", msg)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as e:
            raise ConnectFault("invalid_argument", f"cannot decode {cls.__name__}: {e}") from e
        return msg

    def encode(self, msg: Message) -> bytes:
        if self.name == "proto":
            return msg.SerializeToString()
        return json_format.MessageToJson(msg, indent=None).encode()

    def stream_content_type(self) -> str:
        return f"application/connect+{self.name}"

    def unary_content_type(self) -> str:
        return f"application/{self.name}"


def iter_envelopes(body: bytes, compression: str | None = None) -> Iterator[bytes]:
    """Messages of an enveloped request body (connect streaming framing)."""
    pos = 0
    while pos < len(body):
        if len(body) - pos < 5:
            raise ConnectFault("invalid_argument", "truncated envelope header")
        flags, size = struct.unpack(">BI", body[pos : pos + 5])
        pos += 5
        data = body[pos : pos + size]
        if len(data) != size:
            raise ConnectFault("invalid_argument", "truncated envelope body")
        pos += size
        if flags & FLAG_COMPRESSED:
            if compression != "gzip":
                raise ConnectFault("internal", f"compressed message with encoding {compression!r}")
            data = gzip.decompress(data)
        if flags & FLAG_END_STREAM:
            return
        yield data


def envelope(data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: ConnectFault | None = None) -> bytes:
    body = {"error": error.to_dict()} if error else {}
    return envelope(json.dumps(body).encode(), FLAG_END_STREAM)


def parse_timeout_ms(value: str | None) -> float | None:
    """Seconds from a `connect-timeout-ms` header (None when absent)."""
    if not value:
        return None
    if len(value) > 10 or not value.isdigit():
        raise ConnectFault("invalid_argument", f"invalid connect-timeout-ms {value!r}")
    return int(value) / 1000.0
