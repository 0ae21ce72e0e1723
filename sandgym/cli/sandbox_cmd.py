"""`sandgym sandbox`: run one command in a fresh sandbox, list, remove and prune; check a
provider against the provider contract."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from sandgym.cli.consoles import LazyConsole

if TYPE_CHECKING:  # docker's SDK is imported when a command needs it
    from rich.progress import TaskID

    from sandgym.sandboxes.ownership import PruneReport
    from sandgym.sandboxes.providers.docker.pull import PullProgress
    from sandgym.sandboxes.result import ExecResult

err = LazyConsole(stderr=True)
out = LazyConsole()

ProviderOpt = Annotated[str, typer.Option("--provider", "-p", help="docker, local, prime, ray, an installed one, or a class by dotted path (pkg.module:ClassName).")]


def _entries(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated option values as one list."""
    return [e.strip() for v in values or () for e in v.split(",") if e.strip()]


def _aliases(values: list[str] | None) -> dict[str, str]:
    from sandgym.errors import UserError

    out: dict[str, str] = {}
    for v in values or ():
        src, sep, dst = v.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise UserError(f"--image-alias wants NAME=LOCAL_IMAGE, got {v!r}")
        out[src.strip()] = dst.strip()
    return out


def _pull_progress() -> Callable[[PullProgress], None]:
    """Pull progress: a bar on a terminal, a line per finished layer otherwise."""
    if err.is_terminal:
        from rich.markup import escape
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        bar = Progress(TextColumn("pulling {task.description}"), BarColumn(), DownloadColumn(),
                       console=err.console, transient=True)
        tasks: dict[str, TaskID] = {}

        def show(ev: PullProgress) -> None:
            image, done, total = ev.image, ev.done_bytes, ev.total_bytes
            if image not in tasks:
                bar.start()
                tasks[image] = bar.add_task(image, total=None)
            bar.update(tasks[image], completed=done, total=total or None)
            if str(ev.status).startswith("Status:"):
                bar.stop()
                err.print(f"[dim]{escape(str(ev.status))}[/]")

        return show

    def log(ev: PullProgress) -> None:
        status = str(ev.status)
        if status in ("Pull complete", "Already exists") or status.startswith(("Pulling from", "Status:")):
            layer = f" {ev.layer}" if ev.layer and not status.startswith("Pulling") else ""
            print(f"pull {ev.image}: {status}{layer}", file=sys.stderr, flush=True)

    return log


def register(app: typer.Typer) -> None:
    sandbox = typer.Typer(help="Run commands in sandboxes; list, remove and prune them; check a provider.", no_args_is_help=True)
    app.add_typer(sandbox, name="sandbox")

    @sandbox.command("run", context_settings={"allow_interspersed_args": False})
    def run_cmd(
        cmd: Annotated[list[str], typer.Argument(help="Command and arguments (after --).")],
        provider: ProviderOpt = "docker",
        image: Annotated[Optional[str], typer.Option(help="Image (docker/prime).")] = None,
        profile: Annotated[Optional[str], typer.Option(help="strict (default: hardened, for scoring) or vm (root, writable root; gVisor).")] = None,
        user: Annotated[Optional[str], typer.Option(help="User to run as (e.g. root in a vm sandbox, or UID[:GID]).")] = None,
        cpu: Annotated[Optional[float], typer.Option(help="CPU cores.")] = None,
        memory_mb: Annotated[Optional[int], typer.Option("--memory-mb", help="Memory limit, MiB.")] = None,
        disk_mb: Annotated[Optional[int], typer.Option("--disk-mb", help="Writable space, MiB.")] = None,
        pids: Annotated[Optional[int], typer.Option(help="Process limit.")] = None,
        timeout: Annotated[float, typer.Option(help="Command timeout, seconds.")] = 60.0,
        network: Annotated[bool, typer.Option(help="Egress to anything public (same as --egress-allow '*').")] = False,
        egress_allow: Annotated[Optional[list[str]], typer.Option("--egress-allow", help="Allowed destinations, comma-separated, repeatable: hosts, *.domain, host:port, IPv4/CIDR, host.sandgym.internal[:PORT].")] = None,
        egress_deny: Annotated[Optional[list[str]], typer.Option("--egress-deny", help="Denied destinations (wins over allow; alone: everything else is allowed).")] = None,
        egress_host_port: Annotated[Optional[list[int]], typer.Option("--egress-host-port", help="docker: a loopback port of this host sandboxes may reach as host.sandgym.internal:PORT (repeatable).")] = None,
        pull: Annotated[Optional[str], typer.Option(help="Pull the image: missing (default), never, always.")] = None,
        image_alias: Annotated[Optional[list[str]], typer.Option("--image-alias", help="docker: NAME=LOCAL_IMAGE, used instead of NAME (repeatable).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Create a sandbox, run one command, print the result, destroy the sandbox.
        Every refusal is one line naming the field and its allowed range, before anything
        is made."""
        import anyio

        from sandgym.cli.errors import exit_for_user_error
        from sandgym.errors import UserError
        from sandgym.sandboxes import SandboxError, SandboxManager, SandboxSpec

        allow, deny = _entries(egress_allow), _entries(egress_deny)
        egress: dict[str, list[str]] | None = None
        if allow or deny:
            egress = {"allow": allow or ["*"], "deny": deny}
        fields = dict(image=image, profile=profile, user=user, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb,
                      pids=pids, exec_timeout_s=timeout, egress=egress, image_pull=pull,
                      network=True if network and egress is None else None)
        spec = SandboxSpec(**{k: v for k, v in fields.items() if v is not None})  # ValidationError: one line
        options: dict[str, object] = {}
        if provider == "docker":
            options = dict(image_aliases=_aliases(image_alias), egress_host_ports=egress_host_port or (),
                           pull_progress=_pull_progress())
        elif image_alias or egress_host_port:
            raise UserError("--image-alias and --egress-host-port are options of the docker provider")

        async def go() -> ExecResult:
            async with SandboxManager(provider, max_sandboxes=1, provider_options=options, create_retries=0) as mgr:
                async with mgr.sandbox(spec) as sb:
                    argv = cmd[0] if len(cmd) == 1 else cmd
                    return await sb.exec(argv, timeout=timeout)

        try:
            result = anyio.run(go)
        except SandboxError as exc:  # could not make or use the sandbox: say why, one line
            exit_for_user_error(exc, f"sandbox: {exc}")
        if as_json:
            print(result.model_dump_json())
        else:
            sys.stdout.buffer.write(result.stdout_bytes)
            sys.stderr.buffer.write(result.stderr_bytes)
            flags = [k for k in ("timed_out", "oom_killed", "truncated") if getattr(result, k)]
            err.print(f"[dim]exit {result.exit_code} in {result.duration_s:.3f}s {' '.join(flags)}[/]")
        raise typer.Exit(0 if result.exit_code == 0 else 1)

    @sandbox.command("ls")
    def ls_cmd(
        provider: ProviderOpt = "docker",
        as_json: Annotated[bool, typer.Option("--json", help="Print as a JSON list.")] = False,
        reap: Annotated[bool, typer.Option(help="Then remove this host's sandboxes whose owner process is gone.")] = True,
    ) -> None:
        """List sandboxes made by sandgym (any run) on a provider, as they were; then, like
        every sandgym command that uses sandboxes, remove this host's sandboxes whose owner
        process is gone (listed with `reaped`)."""
        import anyio

        from sandgym.sandboxes import get_provider, prune
        from sandgym.sandboxes.ownership import owner_alive

        async def go() -> tuple[list, set[str]]:
            p = get_provider(provider)
            try:
                infos = await p.list()
                report = await prune(p) if reap else None
            finally:
                await p.aclose()
            if report is not None:
                for sid, why in report.failed.items():
                    err.print(f"[red]could not remove[/] {sid[:12]} (owner gone): {why}")
            return infos, set(report.removed) if report else set()

        infos, reaped = anyio.run(go)
        if as_json:
            print(json.dumps([i.model_dump() | {"owner_alive": owner_alive(i.labels), "reaped": i.id in reaped}
                              for i in infos]))
            return
        from rich.table import Table

        table = Table(title=f"{provider} sandboxes")
        for col in ("id", "image", "status", "owner", "pid", "owner alive"):
            table.add_column(col)
        for i in infos:
            alive = "yes" if owner_alive(i.labels) else "[red]no[/]" + (" (reaped)" if i.id in reaped else "")
            table.add_row(i.id[:12], i.image, i.status, i.owner or "", str(i.pid or ""), alive)
        out.print(table)
        if reaped:
            err.print(f"removed {len(reaped)} sandboxes whose owner process is gone")

    @sandbox.command("rm")
    def rm_cmd(ids: Annotated[list[str], typer.Argument(help="Sandbox ids.")], provider: ProviderOpt = "docker") -> None:
        """Remove sandboxes by id (whoever made them)."""
        import anyio

        from sandgym.sandboxes import get_provider

        async def go() -> None:
            p = get_provider(provider)
            try:
                known = {i.id: i for i in await p.list()}
                for sid in ids:
                    full = next((k for k in known if k.startswith(sid)), sid)
                    await p.remove(full)
                    err.print(f"removed {full[:12]}")
            finally:
                await p.aclose()

        anyio.run(go)

    @sandbox.command("prune")
    def prune_cmd(
        provider: ProviderOpt = "docker",
        everything: Annotated[bool, typer.Option("--all", help="Remove every sandgym sandbox, live owners too.")] = False,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Remove this host's sandboxes whose owning process is dead (crash leftovers; any
        sandgym command that uses sandboxes does this too). Platform sandboxes (`sandgym
        serve`'s) are kept unless --all."""
        import anyio

        from sandgym.sandboxes import get_provider, prune

        async def go() -> PruneReport:
            p = get_provider(provider)
            try:
                return await prune(p, everything=everything)
            finally:
                await p.aclose()

        report = anyio.run(go)
        if as_json:
            print(json.dumps({"removed": report.removed, "kept": report.kept, "failed": report.failed}))
        else:
            err.print(f"removed {len(report.removed)}, kept {len(report.kept)} (owner alive), failed {len(report.failed)}")
            for sid, why in report.failed.items():
                err.print(f"[red]failed[/] {sid[:12]}: {why}")
        if report.failed:
            raise typer.Exit(1)

    @sandbox.command("check")
    def check_cmd(
        provider: ProviderOpt = "docker",
        image: Annotated[Optional[str], typer.Option(help="Image (docker/prime); needs bash, python3, coreutils.")] = None,
        only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only this check (repeatable).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
        concurrency: Annotated[
            int, typer.Option("--concurrency", "-c", min=1, help="Checks run at once (each has its own sandboxes).")
        ] = 4,
    ) -> None:
        """Run the provider contract (sandgym.sandboxes.contract) against a provider: each
        check creates and destroys its own sandboxes. Exit status 1 when a check fails."""
        import anyio
        from rich.markup import escape

        from sandgym.sandboxes import get_provider
        from sandgym.sandboxes.contract import CHECKS, DEFAULT_SPEC, ContractReport, run_contract

        spec = DEFAULT_SPEC if image is None else DEFAULT_SPEC.model_copy(update={"image": image})
        known = {c.name for c in CHECKS}
        for name in only or ():
            if name not in known:
                err.print(f"[red]unknown check {name!r}[/]; known: {', '.join(sorted(known))}")
                raise typer.Exit(2)
        try:
            p = get_provider(provider)
        except ValueError as exc:  # an unknown name, or options it does not take
            err.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None

        async def go() -> ContractReport:
            try:
                return await run_contract(p, spec, only=only or None, concurrency=concurrency)
            finally:
                await p.aclose()

        with err.status(f"checking the {provider} provider..."):
            report = anyio.run(go)
        if as_json:
            print(json.dumps({"provider": report.provider, "ok": report.ok,
                              "results": [r.__dict__ for r in report.results]}))
        else:
            from rich.table import Table

            table = Table(title=f"provider contract: {provider}")
            table.add_column("check", no_wrap=True)
            table.add_column("result", no_wrap=True)
            table.add_column("time", no_wrap=True, justify="right")
            table.add_column("message", overflow="fold")
            descriptions = {c.name: c.description for c in CHECKS}
            for r in report.results:
                verdict = "[yellow]n/a[/]" if not r.applicable else "[green]pass[/]" if r.ok else "[red]FAIL[/]"
                table.add_row(r.name, verdict, f"{r.duration_s:.2f}s",
                              escape(r.message) if r.message else f"[dim]{escape(descriptions[r.name])}[/]")
            out.print(table)
            err.print(report.summary())
        if not report.ok:
            raise typer.Exit(1)
