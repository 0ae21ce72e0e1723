"""`sandgym serve`: the platform service (prime-sandboxes REST contract over our sandboxes)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated, Optional

import typer

from sandgym.cli.consoles import LazyConsole

err = LazyConsole(stderr=True)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "sandgym" / "serve"


def parse_aliases(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, target = item.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise typer.BadParameter(f"--image-alias wants NAME=LOCAL_IMAGE, got {item!r}")
        out[name.strip()] = target.strip()
    return out


def parse_egress_default(value: str | None) -> list[str] | None:
    """'none' (no network), '*' (unrestricted) or a comma-separated allow-list."""
    if value is None or value.strip().lower() in ("", "none"):
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        host: Annotated[str, typer.Option(help="Address to bind; keep 127.0.0.1 unless a proxy fronts it.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port.")] = 8000,
        token: Annotated[Optional[list[str]], typer.Option("--token", help="API token (repeatable); each token is a tenant.")] = None,
        tokens_file: Annotated[Optional[Path], typer.Option("--tokens-file", help="File with one token per line (# comments).")] = None,
        max_sandboxes: Annotated[int, typer.Option("--max-sandboxes", help="Live sandboxes on this host, all tenants.")] = 8,
        quota: Annotated[Optional[int], typer.Option(help="Live sandboxes per token (429 past it); default --max-sandboxes with one token, half of it with more. `quota=N` in the tokens file sets one token's.")] = None,
        provider: Annotated[str, typer.Option("--provider", "-p", help="docker, local, prime, ray, or a provider by dotted path (pkg.module:ClassName).")] = "docker",
        ray: Annotated[Optional[str], typer.Option("--ray", help="Front the sandgym nodes of this Ray cluster (HOST:PORT) instead: one endpoint for a fleet; --max-sandboxes is then cluster-wide.")] = None,
        max_ttl: Annotated[float, typer.Option("--max-ttl", help="Longest sandbox lifetime, seconds (timeout_minutes=-1 gets this).")] = 24 * 3600.0,
        idle_timeout: Annotated[float, typer.Option("--idle-timeout", help="Reap sandboxes idle this long, seconds (0: never).")] = 3600.0,
        public_url: Annotated[Optional[str], typer.Option("--public-url", help="Base URL clients reach this server at (behind a proxy).")] = None,
        state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="Where the server keeps its SQLite state; a restart re-adopts the sandboxes of this state. Default: $XDG_STATE_HOME/sandgym/serve.")] = None,
        ephemeral: Annotated[bool, typer.Option("--ephemeral", help="Keep no state: every sandbox is destroyed when the server stops.")] = False,
        shutdown_sandboxes: Annotated[bool, typer.Option("--shutdown-sandboxes", help="Destroy the sandboxes when the server stops (default: they keep running for the next server on this state).")] = False,
        profile: Annotated[Optional[str], typer.Option("--profile", help="Isolation profile of every sandbox: strict (read-only root, non-root user) or vm (writable root with a disk quota, root allowed, gVisor).")] = None,
        egress_default: Annotated[Optional[str], typer.Option("--egress-default", help="Network of a create that names none: 'none' (default), '*' (unrestricted) or an allow-list 'pypi.org,*.pythonhosted.org'.")] = None,
        image_alias: Annotated[Optional[list[str]], typer.Option("--image-alias", help="NAME=LOCAL_IMAGE: serve NAME (e.g. python:3.11-slim) from a local image (repeatable).")] = None,
        image_pull: Annotated[Optional[str], typer.Option("--image-pull", help="missing (pull images not here), never, always.")] = None,
        egress_host_port: Annotated[Optional[list[int]], typer.Option("--egress-host-port", help="A loopback port on this host that sandboxes whose egress names host.sandgym.internal may reach (repeatable), e.g. an interception server.")] = None,
        max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="Largest request body, MiB (413 past it); uploads have --max-upload-mb.")] = 16.0,
        max_upload_mb: Annotated[float, typer.Option("--max-upload-mb", help="Largest file upload, MiB.")] = 256.0,
        output_limit_mb: Annotated[float, typer.Option("--output-limit-mb", help="A command's stdout and stderr are each cut past this, MiB (and flagged truncated).")] = 16.0,
        drain_timeout: Annotated[Optional[float], typer.Option("--drain-timeout", help="On SIGTERM/SIGINT (stop) or SIGHUP (re-exec in place, keeping the socket): let in-flight requests, then the sandboxes' egress transfers, finish this long, seconds (default 20); new connections wait in the backlog meanwhile.")] = None,
        log_level: Annotated[str, typer.Option("--log-level")] = "info",
    ) -> None:
        """Serve sandboxes to the unmodified prime-sandboxes SDK: clients set
        PRIME_API_BASE_URL=http://HOST:PORT and PRIME_API_KEY=<token>.

        Restarts: SIGTERM drains and exits 0 (the sandboxes keep running for the next server
        on the same --state-dir); SIGHUP re-executes the server in place, handing its
        listening socket to the new process. A socket passed by systemd socket activation
        (LISTEN_FDS) is used instead of --host/--port."""
        from sandgym.platform import runner, sockets

        held = runner.hold_signals()  # a stop asked for during start-up is obeyed once serving
        from sandgym.platform.app import create_app
        from sandgym.platform.auth import read_token_quotas, read_tokens_file
        from sandgym.platform.egress import WirePolicy
        from sandgym.platform.service import ServerConfig

        if provider not in ("docker", "local"):
            err.print(f"[red]--provider must be docker or local, got {provider!r}[/]")
            raise typer.Exit(2)
        if profile is not None and profile not in ("strict", "vm"):
            err.print(f"[red]--profile must be strict or vm, got {profile!r}[/]")
            raise typer.Exit(2)
        if image_pull is not None and image_pull not in ("missing", "never", "always"):
            err.print(f"[red]--image-pull must be missing, never or always, got {image_pull!r}[/]")
            raise typer.Exit(2)
        egress = parse_egress_default(egress_default)
        try:
            WirePolicy.parse(egress, None, where="--egress-default ")
        except ValueError as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from None
        if ephemeral and (state_dir is not None or shutdown_sandboxes):
            err.print("[red]--ephemeral keeps no state: drop --state-dir / --shutdown-sandboxes[/]")
            raise typer.Exit(2)
        tokens = list(token or [])
        quotas: dict[str, int] = {}
        if tokens_file is not None:
            try:
                tokens += read_tokens_file(tokens_file)
                quotas = read_token_quotas(tokens_file)
            except (OSError, ValueError) as exc:
                err.print(f"[red]--tokens-file: {exc}[/]")
                raise typer.Exit(2) from None
        if env_tokens := os.environ.get("SANDGYM_SERVE_TOKENS"):
            tokens += [t for t in env_tokens.split(",") if t]
        if not tokens:
            tokens = [secrets.token_urlsafe(24)]
            err.print(f"[yellow]no --token given; this run's token:[/] {tokens[0]}")
        if provider == "local":
            err.print("[yellow]provider local: sandboxes are processes with rlimits, not containers; weak isolation[/]")
        provider_options: dict[str, object] = {}
        if image_alias:
            provider_options["image_aliases"] = parse_aliases(image_alias)
        if egress_host_port:
            bad = [p for p in egress_host_port if not 1 <= p <= 65535]
            if bad:
                err.print(f"[red]--egress-host-port: {bad[0]} is not a port; allowed range: [1, 65535][/]")
                raise typer.Exit(2)
            provider_options["egress_host_ports"] = list(egress_host_port)
        if provider_options and provider != "docker":
            err.print(f"[red]--image-alias and --egress-host-port need --provider docker, not {provider}[/]")
            raise typer.Exit(2)
        if ray is not None:
            if provider_options:
                err.print("[red]--image-alias and --egress-host-port configure one engine; with --ray set them on each node[/]")
                raise typer.Exit(2)
            # Each node's agent keeps its own hard cap; this server caps the whole fleet.
            provider_options = {"address": ray, "max_sandboxes": max_sandboxes, "agent_provider": provider}
            provider = "ray"
        if drain_timeout is None:
            drain_timeout = runner.DEFAULT_DRAIN_S
        if drain_timeout < 0:
            err.print(f"[red]--drain-timeout must be >= 0 seconds, got {drain_timeout}[/]")
            raise typer.Exit(2)
        config = ServerConfig(
            tokens=tokens,
            provider=provider,
            max_sandboxes=max_sandboxes,
            quota=quota,
            quotas=quotas,
            max_ttl_s=max_ttl,
            idle_timeout_s=idle_timeout or None,
            public_url=public_url,
            state_dir=None if ephemeral else str(state_dir or default_state_dir()),
            shutdown_sandboxes=shutdown_sandboxes,
            profile=profile,  # type: ignore[arg-type]  # checked against the Literal's values above
            egress_default=egress,
            image_pull=image_pull,  # type: ignore[arg-type]  # checked above, as profile
            max_body_bytes=int(max_body_mb * (1 << 20)),
            max_upload_bytes=int(max_upload_mb * (1 << 20)),
            output_limit_bytes=max(1024, int(output_limit_mb * (1 << 20))),
            provider_options=provider_options,
            drain_s=drain_timeout,
        )
        try:
            sock, connections = sockets.inherited_sockets()
        except sockets.ActivationError as exc:
            err.print(f"[red]sandgym serve: socket activation: {exc}[/]")
            raise typer.Exit(2) from None
        activated = sock is not None
        try:
            app = create_app(config)
        except Exception as exc:  # a locked state dir, bad provider options
            err.print(f"[red]sandgym serve: {exc}[/]")
            raise typer.Exit(2) from None
        if sock is None:
            try:
                sock = sockets.bind_socket(host, port)
            except OSError as exc:
                err.print(f"[red]sandgym serve: cannot listen on {host}:{port}: {exc}[/]")
                raise typer.Exit(2) from None
        state = config.state_dir or "none (ephemeral)"
        err.print(
            f"sandgym serve: {sockets.describe(sock)}{' (socket passed by LISTEN_FDS)' if activated else ''}  "
            f"provider={provider}  max_sandboxes={max_sandboxes}  quota/token={config.default_quota()}  "
            f"state={state}  pid={os.getpid()}  docs: /docs"
        )
        runner.serve(app, sock, drain_s=drain_timeout, log_level=log_level, on_drain=app.state.service.begin_drain, held=held,
                     connections=connections)
