"""`sandgym serve`: the platform service (prime-sandboxes REST contract over our sandboxes)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

err = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        host: Annotated[str, typer.Option(help="Address to bind; keep 127.0.0.1 unless a proxy fronts it.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port.")] = 8000,
        token: Annotated[Optional[list[str]], typer.Option("--token", help="API token (repeatable); each token is a tenant.")] = None,
        tokens_file: Annotated[Optional[Path], typer.Option("--tokens-file", help="File with one token per line (# comments).")] = None,
        max_sandboxes: Annotated[int, typer.Option("--max-sandboxes", help="Live sandboxes on this host, all tenants.")] = 8,
        quota: Annotated[Optional[int], typer.Option(help="Live sandboxes per token (429 past it); default --max-sandboxes.")] = None,
        provider: Annotated[str, typer.Option("--provider", "-p", help="docker or local.")] = "docker",
        ray: Annotated[Optional[str], typer.Option("--ray", help="Front the sandgym nodes of this Ray cluster (HOST:PORT) instead: one endpoint for a fleet; --max-sandboxes is then cluster-wide.")] = None,
        max_ttl: Annotated[float, typer.Option("--max-ttl", help="Longest sandbox lifetime, seconds (timeout_minutes=-1 gets this).")] = 24 * 3600.0,
        idle_timeout: Annotated[float, typer.Option("--idle-timeout", help="Reap sandboxes idle this long, seconds (0: never).")] = 3600.0,
        public_url: Annotated[Optional[str], typer.Option("--public-url", help="Base URL clients reach this server at (behind a proxy).")] = None,
        log_level: Annotated[str, typer.Option("--log-level")] = "info",
    ) -> None:
        """Serve sandboxes to the unmodified prime-sandboxes SDK: clients set
        PRIME_API_BASE_URL=http://HOST:PORT and PRIME_API_KEY=<token>."""
        import uvicorn

        from sandgym.platform.app import create_app
        from sandgym.platform.auth import read_tokens_file
        from sandgym.platform.service import ServerConfig

        if provider not in ("docker", "local"):
            err.print(f"[red]--provider must be docker or local, got {provider!r}[/]")
            raise typer.Exit(2)
        provider_options: dict[str, object] = {}
        if ray is not None:
            # Each node's agent keeps its own hard cap; this server caps the whole fleet.
            provider_options = {"address": ray, "max_sandboxes": max_sandboxes, "agent_provider": provider}
            provider = "ray"
        tokens = list(token or [])
        if tokens_file is not None:
            tokens += read_tokens_file(tokens_file)
        if env_tokens := os.environ.get("SANDGYM_SERVE_TOKENS"):
            tokens += [t for t in env_tokens.split(",") if t]
        if not tokens:
            tokens = [secrets.token_urlsafe(24)]
            err.print(f"[yellow]no --token given; this run's token:[/] {tokens[0]}")
        if provider == "local":
            err.print("[yellow]provider local: sandboxes are processes with rlimits, not containers; weak isolation[/]")
        config = ServerConfig(
            tokens=tokens,
            provider=provider,
            max_sandboxes=max_sandboxes,
            quota=quota,
            max_ttl_s=max_ttl,
            idle_timeout_s=idle_timeout or None,
            public_url=public_url,
            provider_options=provider_options,
        )
        err.print(f"sandgym serve: http://{host}:{port}  provider={provider}  max_sandboxes={max_sandboxes}  docs: /docs")
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, timeout_keep_alive=30)
