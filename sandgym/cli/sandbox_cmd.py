"""`sandgym sandbox`: run one command in a fresh sandbox, list, remove and prune; check a
provider against the provider contract."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

err = Console(stderr=True)

ProviderOpt = Annotated[str, typer.Option("--provider", "-p", help="docker, local or prime.")]


def _spec(**fields: object) -> "SandboxSpec":  # noqa: F821
    from pydantic import ValidationError

    from sandgym.sandboxes import SandboxSpec

    try:
        return SandboxSpec(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        for e in exc.errors():
            err.print(f"[red]invalid {'.'.join(map(str, e['loc']))}:[/] {e['msg']}")
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    sandbox = typer.Typer(help="Run commands in sandboxes; list, remove and prune them; check a provider.", no_args_is_help=True)
    app.add_typer(sandbox, name="sandbox")

    @sandbox.command("run", context_settings={"allow_interspersed_args": False})
    def run_cmd(
        cmd: Annotated[list[str], typer.Argument(help="Command and arguments (after --).")],
        provider: ProviderOpt = "docker",
        image: Annotated[Optional[str], typer.Option(help="Image (docker/prime).")] = None,
        cpu: Annotated[Optional[float], typer.Option(help="CPU cores.")] = None,
        memory_mb: Annotated[Optional[int], typer.Option("--memory-mb", help="Memory limit, MiB.")] = None,
        disk_mb: Annotated[Optional[int], typer.Option("--disk-mb", help="Writable space, MiB.")] = None,
        pids: Annotated[Optional[int], typer.Option(help="Process limit.")] = None,
        timeout: Annotated[float, typer.Option(help="Command timeout, seconds.")] = 60.0,
        network: Annotated[bool, typer.Option(help="Allow network (off by default).")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Create a sandbox, run one command, print the result, destroy the sandbox."""
        import anyio

        from sandgym.sandboxes import SandboxError, SandboxManager, SpecError

        spec = _spec(image=image, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, pids=pids,
                     network=network, exec_timeout_s=timeout)

        async def go() -> object:
            async with SandboxManager(provider, max_sandboxes=1) as mgr:
                async with mgr.sandbox(spec) as sb:
                    argv = cmd[0] if len(cmd) == 1 else cmd
                    return await sb.exec(argv, timeout=timeout)

        try:
            result = anyio.run(go)
        except (SpecError, SandboxError, ValueError) as exc:
            err.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2)
        if as_json:
            print(result.model_dump_json())  # type: ignore[attr-defined]
        else:
            sys.stdout.buffer.write(result.stdout_bytes)  # type: ignore[attr-defined]
            sys.stderr.buffer.write(result.stderr_bytes)  # type: ignore[attr-defined]
            flags = [k for k in ("timed_out", "oom_killed", "truncated") if getattr(result, k)]
            err.print(f"[dim]exit {result.exit_code} in {result.duration_s:.3f}s {' '.join(flags)}[/]")  # type: ignore[attr-defined]
        raise typer.Exit(0 if result.exit_code == 0 else 1)  # type: ignore[attr-defined]

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
        table = Table(title=f"{provider} sandboxes")
        for col in ("id", "image", "status", "owner", "pid", "owner alive"):
            table.add_column(col)
        for i in infos:
            alive = "yes" if owner_alive(i.labels) else "[red]no[/]" + (" (reaped)" if i.id in reaped else "")
            table.add_row(i.id[:12], i.image, i.status, i.owner or "", str(i.pid or ""), alive)
        Console().print(table)
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

        async def go():  # type: ignore[no-untyped-def]
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
    ) -> None:
        """Run the provider contract (sandgym.sandboxes.contract) against a provider: each
        check creates and destroys its own sandboxes. Exit status 1 when a check fails."""
        import anyio

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
        except ValueError as exc:
            err.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2)

        async def go() -> ContractReport:
            try:
                return await run_contract(p, spec, only=only or None)
            finally:
                await p.aclose()

        with err.status(f"checking the {provider} provider..."):
            report = anyio.run(go)
        if as_json:
            print(json.dumps({"provider": report.provider, "ok": report.ok,
                              "results": [r.__dict__ for r in report.results]}))
        else:
            table = Table(title=f"provider contract: {provider}")
            table.add_column("check", no_wrap=True)
            table.add_column("result", no_wrap=True)
            table.add_column("time", no_wrap=True, justify="right")
            table.add_column("message", overflow="fold")
            descriptions = {c.name: c.description for c in CHECKS}
            for r in report.results:
                table.add_row(r.name, "[green]pass[/]" if r.ok else "[red]FAIL[/]", f"{r.duration_s:.2f}s",
                              escape(r.message) if r.message else f"[dim]{escape(descriptions[r.name])}[/]")
            Console().print(table)
            passed = len(report.results) - len(report.failures)
            err.print(f"{passed}/{len(report.results)} checks passed")
        if not report.ok:
            raise typer.Exit(1)
