"""`sandgym swe`: SWE-bench-style debug runs against gold patches, validation, task images.

Every instance is written to the run directory the moment it finishes (result.json, its
logs, the applied diff); the tables come after, and they never read data as rich markup
(test ids like `test_x[/tmp/a]` or `[red]` are shown as they are).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from sandgym.cli.consoles import LazyConsole

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.text import Text

console = LazyConsole(stderr=True)

STEPS = ("gold_patch", "none", "command", "script")
IMAGE_SOURCE_HELP = ("build: task images built here, offline (default). prebuilt: SWE-bench's instance images "
                     "(swebench/sweb.eval.x86_64.<id>, `__` as `_1776_`), pulled when missing, from Docker Hub or --registry; "
                     "run as root on a writable root (the vm profile, gVisor); a failed pull is an infra failure of "
                     "that instance. auto: prebuilt where the pull works, else built here (the result says why).")
MIRRORS_HELP = "Directory of local git mirrors (owner__name, owner+name/repo, ...; default $SANDGYM_SWE_MIRRORS)."
NETWORK_ALLOW_HELP = ("Comma-separated egress allow-list (hosts, *.wildcards, host:port, CIDRs) for rows with `network: true` "
                      "(or every row, with --network-rows all); such rows are refused without it. Others never get network.")
NETWORK_ROWS_HELP = ("Which rows --network-allow applies to: `marked` (rows with `network: true`, the default) or `all` "
                     "(every row, as SWE-bench runs them: for rows whose tests need the network).")
INSTANCES_HELP = "Only these instance ids, comma-separated (or repeat -i)."


def _load(tasks: str, instance: list[str] | None, split: str, instances: str | None = None) -> list[Any]:
    from sandgym.errors import UserError
    from sandgym.swe.bundled import resolve_tasks
    from sandgym.swe.tasks import TaskFileNotFound, load_tasks

    wanted = list(instance or []) + [i.strip() for i in (instances or "").split(",") if i.strip()]
    try:
        task_list = load_tasks(resolve_tasks(tasks, split=split), instance_ids=wanted or None)
    except KeyError as exc:  # KeyError's str() quotes its message
        raise UserError(f"cannot load tasks from {tasks}: {exc.args[0] if exc.args else exc}") from exc
    except (OSError, ValueError) as exc:
        hint = ""
        if tasks not in ("bundled", "bundled-good") and not isinstance(exc, TaskFileNotFound) and not Path(tasks).exists():
            hint = ("; a name that is not a local file or directory is loaded through `datasets` from the Hugging Face hub "
                    "(or its cache, with HF_HUB_OFFLINE=1); offline, give a JSONL file or a dataset directory")
        raise UserError(f"cannot load tasks from {tasks}: {exc}{hint}") from exc
    if not task_list:
        raise UserError(f"no tasks in {tasks}" + (f" with instance ids {', '.join(wanted)}" if wanted else ""))
    return task_list


def _check_mirrors(task_list: list[Any], mirrors: Path | None, image_source: str) -> None:
    """Before anything runs: every repository a build needs has a local mirror, else one
    message naming $SANDGYM_SWE_MIRRORS, where it looked and how to get them (prebuilt images
    need none; rows with a recipe and repo_path are checked the same way)."""
    from sandgym.errors import UserError
    from sandgym.swe.tasks import MissingRepository, missing_repository_message

    if image_source != "build":
        return
    missing = []
    for t in task_list:
        try:
            t.find_repo(mirrors)
        except MissingRepository:
            missing.append(t)
    if missing:
        raise UserError(missing_repository_message(missing, mirrors))


def _ratio(d: dict[str, str]) -> Text:
    from rich.text import Text

    if not d:
        return Text("-")
    ok = sum(v in ("passed", "xfail") for v in d.values())
    return Text(f"{ok}/{len(d)}", style="green" if ok == len(d) else "red")


STATUS_STYLE = {"resolved": "green", "unresolved": "yellow", "error": "red", "infra": "magenta"}


def _render(rows: list[dict[str, Any]], step: str, verbose: bool) -> None:
    """Tables of results (dicts from result.json): every data cell is a Text, never markup."""
    from rich.table import Table
    from rich.text import Text

    from sandgym.swe.debug import fuzzy_notes

    table = Table(title=f"sandgym swe debug --step {step}", show_lines=False)
    for col in ("instance", "status", "FAIL_TO_PASS", "PASS_TO_PASS", "image", "time", "failing tests / error"):
        table.add_column(col, overflow="fold", no_wrap=col == "instance")
    for r in rows:
        if r.get("image_source") == "prebuilt":
            img = "prebuilt"
        else:
            img = "-" if r.get("image_reused") is None else ("reused" if r["image_reused"] else "built")
            img += " (fallback)" if r.get("image_fallback") else ""
        note = ", ".join(r.get("failing_tests") or [])
        if r.get("error"):
            note = (note + "\n" if note else "") + (r.get("infra_reason") and f"[{r['infra_reason']}] " or "") + r["error"].splitlines()[0][:200]
        for fuzzy in fuzzy_notes(r):
            note = (note + "\n" if note else "") + "[fuzzy] " + fuzzy[:300]
        status = r.get("status", "?")
        table.add_row(Text(r["instance_id"]), Text(status, style=STATUS_STYLE.get(status, "white")),
                      _ratio(r.get("fail_to_pass") or {}), _ratio(r.get("pass_to_pass") or {}), Text(img),
                      Text(f"{(r.get('timings') or {}).get('total_s', 0):.1f}s"), Text(note))
    console.print(table)
    for r in rows:
        if not verbose and r.get("resolved"):
            continue
        detail = Table(title=Text(f"{r['instance_id']}: {r.get('status')}"), title_justify="left")
        detail.add_column("test")
        detail.add_column("kind")
        detail.add_column("outcome")
        for kind, tests in (("FAIL_TO_PASS", r.get("fail_to_pass") or {}), ("PASS_TO_PASS", r.get("pass_to_pass") or {})):
            for tid, outcome in tests.items():
                if not verbose and outcome in ("passed", "xfail") and kind == "PASS_TO_PASS":
                    continue
                detail.add_row(Text(tid), Text(kind), Text(outcome, style="green" if outcome in ("passed", "xfail") else "red"))
        if detail.row_count:
            console.print(detail)


def _render_validation(vals: list[Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="sandgym swe validate")
    for col in ("instance", "version", "python", "gold", "empty", "flaky", "cold s", "gold s", "empty s", "verdict"):
        table.add_column(col, overflow="fold", no_wrap=col == "instance")

    def sec(x: float | None) -> Text:
        return Text("-" if x is None else f"{x:.1f}")

    for v in vals:
        flaky = str(len(v.flaky_listed)) + (f" (+{v.flaky_other})" if v.flaky_other else "")
        table.add_row(Text(v.instance_id), Text(v.version), Text(v.python or "-"),
                      Text(f"{v.gold_resolved}/{v.runs}", style="green" if v.gold_resolved == v.runs else "red"),
                      Text(f"{v.empty_resolved}/{v.runs}", style="green" if v.empty_resolved == 0 else "red"),
                      Text(flaky, style="red" if v.flaky_listed else ""), sec(v.cold_s), sec(v.gold_warm_s), sec(v.empty_warm_s),
                      Text(v.verdict, style={"valid": "green", "needs_network": "yellow", "not_run": "yellow"}.get(v.verdict, "red")))
    console.print(table)


def _run_dir(kind: str, output: Path | None, resume: Path | None, step: str) -> Path:
    """The run folder; whether it may be used (a fresh run, or a resume of the same run) is
    sandgym.run_folder's rule, checked when the store starts."""
    if resume is not None:
        if output is not None and output != resume:
            raise typer.BadParameter("--resume DIR continues the run in DIR; do not also give a different --output")
        return resume
    return output or Path("runs") / f"swe-{kind}-{step}-{time.strftime('%Y%m%d-%H%M%S')}"


def _progress(total: int, done: int, label: str) -> tuple[Progress, Callable[[str, str], None]]:
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(SpinnerColumn(), TextColumn(escape(label)), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[phase]}", markup=False), console=console.console, transient=False)
    tid = bar.add_task(label, total=total, completed=done, phase="")
    phases: dict[str, str] = {}

    def progress(iid: str, phase: str) -> None:
        if phase == "done":
            phases.pop(iid, None)
            bar.advance(tid)
        else:
            phases[iid] = phase
        bar.update(tid, phase="  ".join(f"{i}:{p}" for i, p in list(phases.items())[:3]))

    return bar, progress


def register(app: typer.Typer) -> None:
    swe = typer.Typer(help="SWE-bench-style tasks: debug runs against gold patches, validation, task images.", no_args_is_help=True)
    app.add_typer(swe, name="swe")

    @swe.command("debug")
    def debug_cmd(
        tasks: Annotated[str, typer.Argument(help="Rows: a JSONL or JSON file, a datasets directory or hub name, or `bundled`.")],
        step: Annotated[str, typer.Option("--step", "-s", help=f"Debug step: {', '.join(STEPS)}.")] = "gold_patch",
        concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Sandboxes at once.")] = 2,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary on stdout.")] = False,
        provider: Annotated[str, typer.Option(help="Sandbox provider (task images need `docker`).")] = "docker",
        command: Annotated[Optional[str], typer.Option(help="Shell command for --step command (else the task's).")] = None,
        script: Annotated[Optional[Path], typer.Option(help="Script file for --step script (else the task's).")] = None,
        instance: Annotated[Optional[list[str]], typer.Option("--instance", "-i", help="Only these instance ids.")] = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Run directory (default: runs/swe-debug-STEP-TIME).")] = None,
        resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in this directory: skip finished instances.")] = None,
        retry_infra: Annotated[bool, typer.Option("--retry-infra", help="With --resume: run again the instances that failed for infrastructure reasons.")] = False,
        mirrors: Annotated[Optional[Path], typer.Option(help=MIRRORS_HELP)] = None,
        recipes: Annotated[Optional[Path], typer.Option(help="Recipes file (JSON/TOML: owner/name -> version|* -> recipe) for repos no spec covers.")] = None,
        image_source: Annotated[str, typer.Option("--image-source", help=IMAGE_SOURCE_HELP)] = "build",
        registry: Annotated[Optional[str], typer.Option("--registry", help="With --image-source prebuilt/auto: pull from this registry or mirror instead of Docker Hub: HOST, HOST:PORT or HOST:PORT/prefix (e.g. 127.0.0.1:5000, mirror.example.com/dockerhub).")] = None,
        image_namespace: Annotated[str, typer.Option("--image-namespace", help="swebench's --namespace for prebuilt images (`none`: the unnamespaced images swebench's harness builds locally).")] = "swebench",
        split: Annotated[str, typer.Option(help="Dataset split (Hugging Face datasets).")] = "test",
        network_allow: Annotated[Optional[str], typer.Option("--network-allow", help=NETWORK_ALLOW_HELP)] = None,
        network_rows: Annotated[str, typer.Option("--network-rows", help=NETWORK_ROWS_HELP)] = "marked",
        instances: Annotated[Optional[str], typer.Option("--instances", help=INSTANCES_HELP)] = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Per-test tables for resolved instances too.")] = False,
        fail_on_unresolved: Annotated[bool, typer.Option(help="Exit 1 when any instance is not resolved.")] = False,
    ) -> None:
        """Run one debug step per task (gold_patch by default), then the task's tests; report
        per instance whether it is resolved, and which instances the step does not resolve."""
        import anyio
        from rich.text import Text

        from sandgym.cli.errors import check_provider
        from sandgym.errors import UnknownNameError
        from sandgym.swe.debug import IMAGE_SOURCES, summary
        from sandgym.swe.store import DEBUG, RunStore

        if step not in STEPS:
            raise UnknownNameError(f"unknown step {step!r}; choose one of {', '.join(STEPS)}")
        if image_source not in IMAGE_SOURCES:
            raise UnknownNameError(f"unknown image source {image_source!r}; choose {', '.join(IMAGE_SOURCES)}")
        prebuilt = _prebuilt(registry, image_namespace)
        check_provider(provider)
        allow, every_row = _network_allow(network_allow), _network_rows(network_rows, network_allow)
        task_list = _load(tasks, instance, split, instances)
        _check_mirrors(task_list, mirrors, image_source)
        run_dir = _run_dir("debug", output, resume, step)
        store = RunStore(run_dir)
        store.start({"kind": DEBUG, "step": step, "tasks": tasks, "instances": len(task_list),
                     "image_source": image_source, "registry": registry, "argv": sys.argv[1:]}, resume=resume is not None)
        done = store.finished(t.instance_id for t in task_list)
        if retry_infra:
            done = {k: v for k, v in done.items() if v.get("status") != "infra"}
        todo = [t for t in task_list if t.instance_id not in done]
        if done:
            console.print(Text(f"resuming {run_dir}: {len(done)} finished, {len(todo)} to run"))
        script_text = script.read_text() if script is not None else None
        t0 = time.perf_counter()
        try:
            anyio.run(_run_debug, todo, len(task_list), len(done), step, concurrency, provider, command, script_text,
                      mirrors, recipes, image_source, store, allow, prebuilt, every_row)
        finally:
            store.close()
        rows = [store.load(t.instance_id) or {"instance_id": t.instance_id, "status": "infra", "error": "no result on disk"}
                for t in task_list]
        summ = summary(rows, step, time.perf_counter() - t0)
        summ["output_dir"] = str(run_dir)
        store.write_summary(summ)
        _render(rows, step, verbose)
        broken = summ["not_resolved"]
        if step == "gold_patch" and broken:
            console.print(Text(f"{len(broken)} instance(s) whose gold patch does not resolve them:", style="yellow"))
            for b in broken:
                why = "; ".join(x for x in ((b["error"] or "").splitlines()[:1] + [", ".join(b["failing_tests"])] + b["fuzzy"]) if x)
                console.print(Text(f"  {b['instance_id']} ({b['status']}): {why[:600]}"), soft_wrap=True)
        for f in summ["infra_failures"]:
            console.print(Text(f"  infra {f['instance_id']} [{f['reason']}]: {(f['error'] or '').splitlines()[0][:400]}", style="magenta"), soft_wrap=True)
        for f in summ["fuzzy_applies"]:
            for note in f["notes"]:
                console.print(Text(f"  fuzzy {f['instance_id']}: {note[:400]}", style="yellow"), soft_wrap=True)
        for r in rows:
            if r.get("image_fallback"):
                console.print(Text(f"  {r['instance_id']}: built here, the prebuilt image was unavailable: "
                                   f"{r['image_fallback'].splitlines()[0][:300]}", style="yellow"), soft_wrap=True)
        prebuilt_note = (f", prebuilt {summ['images_prebuilt']} (fallbacks {summ['prebuilt_fallbacks']})"
                         if image_source != "build" else "")
        network_note = f" ({summ['network']} need the network)" if summ["network"] else ""
        console.print(Text(f"{summ['resolved']}/{summ['total']} resolved, {summ['unresolved']} unresolved, "
                           f"{summ['errors']} errors, {summ['infra']} infra{network_note}; images built {summ['images_built']}, "
                           f"reused {summ['images_reused']}{prebuilt_note}; {summ['wall_s']:.1f}s; results in {run_dir}"), soft_wrap=True)
        if as_json:
            sys.stdout.write(json.dumps(summ, indent=2) + "\n")
        if summ["errors"] or summ["infra"] or (fail_on_unresolved and summ["resolved"] < summ["total"]):
            raise typer.Exit(1)

    @swe.command("validate")
    def validate_cmd(
        tasks: Annotated[str, typer.Argument(help="Rows: a JSONL or JSON file, a datasets directory or hub name, or `bundled`.")],
        runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Runs of each step per instance (2+ finds flaky tests).")] = 2,
        concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Instances at once.")] = 2,
        instance: Annotated[Optional[list[str]], typer.Option("--instance", "-i", help="Only these instance ids.")] = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Run directory (default: runs/swe-validate-TIME).")] = None,
        resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the validation in this directory.")] = None,
        mirrors: Annotated[Optional[Path], typer.Option(help=MIRRORS_HELP)] = None,
        recipes: Annotated[Optional[Path], typer.Option(help="Recipes file for repos no spec covers.")] = None,
        provider: Annotated[str, typer.Option(help="Sandbox provider.")] = "docker",
        split: Annotated[str, typer.Option(help="Dataset split.")] = "test",
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON summary on stdout.")] = False,
        image_source: Annotated[str, typer.Option("--image-source", help=IMAGE_SOURCE_HELP)] = "build",
        registry: Annotated[Optional[str], typer.Option("--registry", help="With --image-source prebuilt/auto: pull from this registry or mirror (HOST[:PORT][/prefix]).")] = None,
        image_namespace: Annotated[str, typer.Option("--image-namespace", help="swebench's --namespace for prebuilt images (`none`: unnamespaced).")] = "swebench",
        network_allow: Annotated[Optional[str], typer.Option("--network-allow", help=NETWORK_ALLOW_HELP)] = None,
        network_rows: Annotated[str, typer.Option("--network-rows", help=NETWORK_ROWS_HELP)] = "marked",
        instances: Annotated[Optional[str], typer.Option("--instances", help=INSTANCES_HELP)] = None,
    ) -> None:
        """Gold patch and empty patch on every instance, N runs each: gold must resolve every
        run, empty none; FAIL_TO_PASS must fail and PASS_TO_PASS pass without the fix; tests
        that change outcome between runs are flagged flaky; tests that fail only for want of
        a network make the verdict `needs_network`. Seconds per instance, a table."""
        import anyio
        from rich.text import Text

        from sandgym.errors import UnknownNameError
        from sandgym.swe.debug import IMAGE_SOURCES
        from sandgym.swe.store import VALIDATE, RunStore
        from sandgym.swe.validate import validation_summary

        if image_source not in IMAGE_SOURCES:
            raise UnknownNameError(f"unknown image source {image_source!r}; choose {', '.join(IMAGE_SOURCES)}")
        prebuilt = _prebuilt(registry, image_namespace)
        allow, every_row = _network_allow(network_allow), _network_rows(network_rows, network_allow)
        task_list = _load(tasks, instance, split, instances)
        _check_mirrors(task_list, mirrors, image_source)
        run_dir = _run_dir("validate", output, resume, "gold+none")
        store = RunStore(run_dir)
        store.start({"kind": VALIDATE, "step": "gold+none", "runs": runs, "tasks": tasks, "image_source": image_source,
                     "registry": registry, "argv": sys.argv[1:]}, resume=resume is not None)
        runner_kw = {"image_source": image_source, "prebuilt": prebuilt, "network_allow": allow, "network_every_row": every_row}
        t0 = time.perf_counter()
        try:
            vals = anyio.run(_run_validate, task_list, runs, concurrency, provider, mirrors, recipes, store, runner_kw)
        finally:
            store.close()
        summ = validation_summary(vals, runs, time.perf_counter() - t0)
        summ["output_dir"] = str(run_dir)
        store.write_summary(summ)
        _render_validation(vals)
        for v in vals:
            if v.verdict != "valid":
                style = "yellow" if v.verdict in ("needs_network", "not_run") else "red"
                console.print(Text(f"  {v.instance_id} ({v.verdict}): {'; '.join(v.problems)}", style=style), soft_wrap=True)
        net = f", {len(summ['needs_network'])} need the network" if summ["needs_network"] else ""
        net += f", {len(summ['not_run'])} could not be run here" if summ["not_run"] else ""
        console.print(Text(f"{summ['valid']}/{summ['total']} valid{net}; {summ['wall_s']:.1f}s; results in {run_dir}"), soft_wrap=True)
        if as_json:
            sys.stdout.write(json.dumps(summ, indent=2) + "\n")
        if summ["valid"] < summ["total"]:
            raise typer.Exit(1)

    @swe.command("bundled")
    def bundled_cmd(
        dest: Annotated[Path, typer.Argument(help="Directory for the repositories and tasks.jsonl.")],
    ) -> None:
        """Write the bundled tasks (git repositories + tasks.jsonl) to DEST."""
        from rich.text import Text

        from sandgym.swe.bundled import load_bundled

        tasks = load_bundled(dest)
        for t in tasks:
            console.print(Text(f"{t.instance_id:40} {t.base_commit[:12]}  {t.repo_path}"), soft_wrap=True)
        print(dest.resolve() / "tasks.jsonl")

    @swe.command("build")
    def build_cmd(
        tasks: Annotated[str, typer.Argument(help="Rows: a JSONL or JSON file, a dataset, or `bundled`.")],
        instance: Annotated[Optional[list[str]], typer.Option("--instance", "-i")] = None,
        mirrors: Annotated[Optional[Path], typer.Option(help=MIRRORS_HELP)] = None,
        recipes: Annotated[Optional[Path], typer.Option(help="Recipes file for repos no spec covers.")] = None,
        split: Annotated[str, typer.Option()] = "test",
    ) -> None:
        """Build (or find) the image of every task."""
        import anyio
        from rich.text import Text

        from sandgym.swe.images import BaseImageError, ImageBuildError, RepoError, TaskImageBuilder
        from sandgym.swe.tasks import RecipeError

        task_list = _load(tasks, instance, split)
        failed = 0

        async def go() -> None:
            nonlocal failed
            with console.status("building task images...") as status:
                builder = TaskImageBuilder(mirrors=mirrors, recipes=recipes,
                                           log=lambda line: status.update(Text(line[:110], style="dim")))
                for t in task_list:
                    try:
                        b = await builder.ensure(t)
                        console.print(Text(f"{t.instance_id:40} {b.tag}  {'reused' if b.reused else f'built in {b.build_s:.1f}s'}"), soft_wrap=True)
                    except (ImageBuildError, BaseImageError, RepoError, RecipeError, OSError) as exc:
                        failed += 1
                        console.print(Text(f"{t.instance_id}: {exc}", style="red"), soft_wrap=True)

        anyio.run(go)
        if failed:
            raise typer.Exit(1)


def _builder(mirrors: Path | None, recipes: Path | None) -> Any:
    from sandgym.swe.images import TaskImageBuilder

    return TaskImageBuilder(mirrors=mirrors or os.environ.get("SANDGYM_SWE_MIRRORS"), recipes=recipes)


async def _run_debug(todo: list[Any], total: int, done: int, step: str, concurrency: int, provider: str,
                     command: str | None, script: str | None, mirrors: Path | None, recipes: Path | None,
                     image_source: str, store: Any, network_allow: tuple[str, ...] = (), prebuilt: Any = None,
                     network_every_row: bool = False) -> None:
    from sandgym.sandboxes.manager import SandboxManager
    from sandgym.swe.debug import SWEDebugRunner

    if not todo:
        return
    bar, progress = _progress(total, done, f"swe debug ({step})")
    with bar:
        async with SandboxManager(provider, max_sandboxes=concurrency) as mgr:
            runner = SWEDebugRunner(mgr, step=step, builder=_builder(mirrors, recipes), command=command, script=script,
                                    progress=progress, image_source=image_source, store=store,
                                    network_allow=network_allow, network_every_row=network_every_row, prebuilt=prebuilt)
            await runner.run(todo, concurrency)


async def _run_validate(task_list: list[Any], runs: int, concurrency: int, provider: str, mirrors: Path | None,
                        recipes: Path | None, store: Any, runner_kw: dict[str, Any] | None = None) -> list[Any]:
    from sandgym.sandboxes.manager import SandboxManager
    from sandgym.swe.validate import Validator

    bar, progress = _progress(len(task_list) * runs * 2, 0, f"swe validate ({runs} run(s) of gold and empty)")
    with bar:
        async with SandboxManager(provider, max_sandboxes=concurrency) as mgr:
            v = Validator(mgr, builder=_builder(mirrors, recipes), store=store, runs=runs, progress=progress, **(runner_kw or {}))
            return await v.run(task_list, concurrency)


def _prebuilt(registry: str | None, namespace: str) -> Any:
    """--registry and --image-namespace as PrebuiltImages (a bad value is a one-line user error)."""
    from sandgym.errors import UserError
    from sandgym.swe.prebuilt import PrebuiltImages

    try:
        return PrebuiltImages(registry=registry, namespace=None if namespace.lower() == "none" else namespace)
    except ValueError as exc:
        raise UserError(f"--registry/--image-namespace: {exc}") from None


def _network_rows(value: str, allow: str | None) -> bool:
    """--network-rows as whether every row gets the allow-list."""
    from sandgym.errors import UnknownNameError, UserError

    if value not in ("marked", "all"):
        raise UnknownNameError(f"unknown --network-rows {value!r}; choose marked or all")
    if value == "all" and not allow:
        raise UserError("--network-rows all gives rows the --network-allow list; give that list too")
    return value == "all"


def _network_allow(text: str | None) -> tuple[str, ...]:
    """--network-allow as entries, each checked now (a bad one is a one-line user error)."""
    from sandgym.errors import UserError
    from sandgym.sandboxes.spec import EgressPolicy

    if text is None:
        return ()
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    if not entries:
        raise UserError("--network-allow: give at least one host, host:port or CIDR")
    try:
        EgressPolicy(allow=entries)
    except ValueError as exc:
        errors = getattr(exc, "errors", None)  # pydantic: the validator's own message
        msg = errors()[0]["msg"].removeprefix("Value error, ") if callable(errors) else str(exc)
        raise UserError(f"--network-allow: {msg}".splitlines()[0]) from None
    return entries
