"""A capped output buffer: keeps the first `limit` bytes written and remembers whether more
arrived. Standard library only (Python >= 3.9): execd's daemon.py loads it from this folder
inside a sandbox, and every host-side transport (docker exec, local, prime) uses it too."""



class CappedBuffer:
    __slots__ = ("limit", "_chunks", "_size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.truncated = False

    def write(self, data: bytes) -> bytes:
        """Keep what fits; return the kept part."""
        room = self.limit - self._size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:
            self._chunks.append(data)
            self._size += len(data)
        return data

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)
