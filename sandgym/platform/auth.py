"""Bearer tokens: each token is a tenant that sees only its own sandboxes."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path

from fastapi import HTTPException, Request


def tenant_of(token: str) -> str:
    """A stable, non-secret name for a token (shown as `userId`)."""
    return "u" + hashlib.sha256(token.encode()).hexdigest()[:16]


def read_tokens_file(path: str | Path) -> list[str]:
    """One token per line; blank lines and `#` comments are skipped; anything after the
    first whitespace on a line is a free-form note (`quota=N` in it sets that token's quota,
    see read_token_quotas)."""
    return list(read_token_quotas(path, all_tokens=True))


def read_token_quotas(path: str | Path, *, all_tokens: bool = False) -> dict[str, int]:
    """token -> its `quota=N` from a tokens file (every token with `all_tokens`, -1 = none).
    ValueError naming the line for a bad quota."""
    out: dict[str, int] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        token, *note = line.split()
        quota = -1
        for word in note:
            if word.startswith("quota="):
                value = word.removeprefix("quota=")
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{path}:{n}: quota must be a whole number >= 1, got {value!r}")
                quota = int(value)
        if quota > 0 or all_tokens:
            out[token] = quota
    return out


class TokenAuth:
    def __init__(self, tokens: Iterable[str]) -> None:
        self._tenants = {t: tenant_of(t) for t in tokens if t}
        if not self._tenants:
            raise ValueError("at least one API token is required")

    def tenant(self, token: str) -> str | None:
        for known, tenant in self._tenants.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return tenant
        return None

    def __call__(self, request: Request) -> str:
        """FastAPI dependency: the caller's tenant, or 401."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        tenant = self.tenant(token.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise HTTPException(
                status_code=401,
                detail="missing or invalid API token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return tenant
