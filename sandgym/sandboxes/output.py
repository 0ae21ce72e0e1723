"""Capped output buffers shared by every transport."""

from __future__ import annotations


class CappedBuffer:
    """Keeps the first `limit` bytes written and remembers whether more arrived."""

    __slots__ = ("limit", "_chunks", "_size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.truncated = False

    def write(self, data: bytes) -> None:
        room = self.limit - self._size
        if room <= 0:
            if data:
                self.truncated = True
            return
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        self._chunks.append(data)
        self._size += len(data)

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)
