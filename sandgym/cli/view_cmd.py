"""`sandgym view [RUN_DIR ...]`: a local web viewer for eval, SWE, BFCL and training runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("view")
    def view(
        runs: Annotated[Optional[list[Path]], typer.Argument(metavar="RUN_DIR", help="Run folders, or folders holding runs (default: runs).")] = None,
        host: Annotated[str, typer.Option(help="Address to listen on. Not a loopback address: --token is required.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8765,
        token: Annotated[Optional[str], typer.Option(help="Require this token on every request (`auto`: make one). The printed URL carries it.")] = None,
        no_open: Annotated[bool, typer.Option("--no-open", help="Do not open a browser.")] = False,
        log_level: Annotated[str, typer.Option("--log-level")] = "warning",
    ) -> None:
        """Browse runs in a web page: runs and comparisons, rollouts and trajectories, SWE
        instances, BFCL entries, training plots; runs still being written update live."""
        import uvicorn

        from sandgym.view.app import create_app
        from sandgym.view.server import check_bind, check_roots, open_socket, resolve_token, url_for

        roots = check_roots(runs or [Path("runs")])
        secret = resolve_token(token)
        hosts = check_bind(host, secret)
        sock = open_socket(host, port)
        url = url_for(host, sock.getsockname()[1], secret)
        # The URL goes to stdout (scripts read it); everything else to stderr.
        print(f"sandgym view: {', '.join(str(r) for r in roots)} at {url}", flush=True)
        if not no_open:
            import webbrowser

            webbrowser.open(url)
        config = uvicorn.Config(create_app(roots, token=secret, hosts=hosts), log_level=log_level, access_log=False)
        try:
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            sock.close()
            sys.stdout.flush()
