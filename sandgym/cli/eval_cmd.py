"""`sandgym eval ENV`: run an environment with a model (a server, or a trained run's checkpoint
served by the built-in backend) or an offline policy, save every rollout as it finishes,
resume a killed run, and print a summary (or JSON)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer


def _parse_env_args(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if item.lstrip().startswith("{"):
            try:
                obj = json.loads(item)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"--env-arg {item!r} is not a JSON object: {exc}") from exc
            if not isinstance(obj, dict):
                raise typer.BadParameter(f"--env-arg {item!r} is not a JSON object")
            out.update(obj)
            continue
        if "=" not in item:
            raise typer.BadParameter(f"--env-arg wants KEY=VALUE or a JSON object, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


INFRA_FAILURE_EXIT = 3  # the run finished, but too many rollouts failed for infrastructure reasons
# Rewards and pass@k are over valid attempts, and infrastructure failures are not a random
# sample (long rollouts time out, big outputs overflow, a dead endpoint fails all): past one
# rollout in ten, the failures choose what is scored and the number stops measuring the
# policy. A healthy setup fails well under 1%, so 0.1 never trips on it.
DEFAULT_MAX_INFRA_FAILURE_RATE = 0.1


def default_concurrency() -> int:
    """Rollouts in flight: sandbox work is mostly waiting on the engine, so a few per core."""
    from sandgym.sandboxes.spec import host_cpus

    return max(2, min(16, 4 * host_cpus()))


def eval_command(
    env_name: str = typer.Argument(..., metavar="ENV", help="Environment: a name listed below, a dotted module path, or an installed module with load_environment(**kwargs)."),
    num_examples: Optional[int] = typer.Option(None, "-n", "--num-examples", help="Examples to evaluate (-1: all; default all, or a resumed run's own)."),
    rollouts: Optional[int] = typer.Option(None, "-r", "--rollouts", help="Rollouts per example (pass@k up to this; default 1, or a resumed run's own)."),
    concurrency: Optional[int] = typer.Option(None, "-c", "--concurrency", help="Rollouts in flight (default: 4 per core, 2..16)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model name at --base-url."),
    base_url: Optional[str] = typer.Option(None, "--base-url", "-b", help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="API key (default: $OPENAI_API_KEY or EMPTY)."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Offline policy instead of a model: oracle or null."),
    checkpoint: Optional[Path] = typer.Option(
        None, "--checkpoint", help="A `sandgym sft` or `sandgym train` run folder (its newest checkpoint) or checkpoint: serve it with the built-in transformers backend and evaluate it."
    ),
    provider: Optional[str] = typer.Option(None, "--provider", help="Sandbox provider: docker (default), local, prime, ray, an installed one, or pkg.module:ClassName."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Run directory (default: runs/eval-ENV-TIME)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Resume the run in this directory: skip rollouts already recorded. What is not given again (model or policy, env args, sampling, provider, examples, rollouts) is the run's own, from its meta.json."),
    env_arg: list[str] = typer.Option([], "--env-arg", "-a", help="KEY=VALUE (JSON value) or a JSON object for load_environment."),
    temperature: Optional[float] = typer.Option(None, "--temperature", "-t"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens"),
    timeout_s: float = typer.Option(600.0, "--request-timeout", help="Per model request timeout, seconds."),
    max_retries: int = typer.Option(3, "--max-retries", help="Retries of a failed model request."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object, last on stdout."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Log at INFO; show the traceback of an error."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run the rollouts on the sandgym nodes of this Ray cluster (HOST:PORT; see `sandgym ray up`). -c is then the total in flight (default: 2 per sandbox slot of each node)."),
    node_retries: int = typer.Option(2, "--node-retries", help="With --ray: how often a rollout lost with its node (or its sandbox) is run again on another node."),
    max_infra_failure_rate: float = typer.Option(
        DEFAULT_MAX_INFRA_FAILURE_RATE, "--max-infra-failure-rate", min=0.0, max=1.0,
        help=f"Most rollouts (a fraction) that may fail for infrastructure reasons (sandbox, model server, environment code, time limit, scoring) before the run counts as failed: past it, the run ends with exit status {INFRA_FAILURE_EXIT} and a line saying why (its records and summary are kept). 1 never fails.",
    ),
) -> None:
    """Evaluate an environment; each rollout is appended to OUTPUT/results.jsonl as it finishes.

    Exit status: 0 done; 1 a bug (a traceback); 2 a mistake in the command, said in one line (a bad option, nothing to resume, a folder that holds another run); 3 the run finished, but more of its rollouts than --max-infra-failure-rate (default 0.1) failed for infrastructure reasons."""
    import logging

    import anyio
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from sandgym import envs
    from sandgym.cli.errors import check_provider, show_tracebacks
    from sandgym.core.clients import OpenAIClient
    from sandgym.core.evaluation import infra_failure_note, run_eval
    from sandgym.core.policies import get_policy
    from sandgym.errors import UserError
    from sandgym.run_folder import read_meta

    show_tracebacks(verbose)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    err = Console(stderr=True)
    out_console = err if as_json else Console()

    if sum(map(bool, (policy, model or base_url, checkpoint))) > 1:
        raise typer.BadParameter("give one of --policy, --model/--base-url or --checkpoint")
    meta = read_meta(resume) if resume is not None else None
    if meta is not None and meta.get("env") in (None, env_name):
        # The run's own settings, for what this command does not say again (another
        # environment's run is refused below, by the same-run rule, naming both).
        kept = []
        if not (policy or model or base_url or checkpoint):
            policy, base_url, checkpoint = meta.get("policy"), meta.get("base_url"), meta.get("checkpoint")
            checkpoint = Path(checkpoint) if checkpoint else None
            model = meta.get("model") if base_url else None
            kept.append(f"policy {policy}" if policy else f"checkpoint {checkpoint}" if checkpoint else f"model {model} at {base_url}")
        if not env_arg and meta.get("env_args"):
            env_arg = [json.dumps(meta["env_args"])]
            kept.append(f"env args {env_arg[0]}")
        sampling_meta = meta.get("sampling_args") or {}
        if temperature is None and "temperature" in sampling_meta:
            temperature = sampling_meta["temperature"]
            kept.append(f"temperature {temperature}")
        if max_tokens is None and "max_tokens" in sampling_meta:
            max_tokens = sampling_meta["max_tokens"]
            kept.append(f"max tokens {max_tokens}")
        if provider is None and meta.get("provider"):
            provider = str(meta["provider"])
            kept.append(f"provider {provider}")
        if num_examples is None and isinstance(meta.get("num_examples"), int):
            num_examples = meta["num_examples"]
        if rollouts is None and isinstance(meta.get("rollouts_per_example"), int):
            rollouts = meta["rollouts_per_example"]
        examples = "all" if num_examples in (None, -1) else str(num_examples)
        err.print(f"resuming {resume} with its own " + ", ".join([*kept, f"{examples} examples x {rollouts or 1} rollouts"]),
                  soft_wrap=True, markup=False, highlight=False)
    provider = provider or "docker"
    num_examples = -1 if num_examples is None else num_examples
    rollouts = 1 if rollouts is None else rollouts
    if not policy and not base_url and not checkpoint:
        raise typer.BadParameter("give --base-url (and --model) for a model, --checkpoint for a trained run, or --policy oracle|null")
    if checkpoint is not None:
        from sandgym.train.checkpoints import find_checkpoint

        find_checkpoint(checkpoint)  # a missing checkpoint is the user's error, said before anything starts
    check_provider(provider)
    run_dir = resume or output
    # Whether the folder may be used (a fresh run, or a resume of the same run) is
    # sandgym.run_folder's rule, checked by run_eval and run_fleet_eval alike.
    if resume is not None and output is not None and output != resume:
        raise typer.BadParameter("--resume DIR continues the run in DIR; do not also give a different --output")
    if run_dir is None:
        run_dir = Path("runs") / f"eval-{env_name.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"

    env_kwargs = _parse_env_args(env_arg)
    try:
        env = envs.load_environment(env_name, **env_kwargs)
    except TypeError as exc:
        if env_kwargs and "unexpected keyword argument" in str(exc):
            raise UserError(f"bad --env-arg for {env_name}: {exc}") from exc
        raise
    if provider == "ray" and ray is None and not os.environ.get("RAY_ADDRESS"):
        raise typer.BadParameter("--provider ray needs the cluster: give --ray HOST:PORT")
    conc = concurrency or env.max_concurrent or default_concurrency()
    sampling: dict[str, Any] = {}
    if temperature is not None:
        sampling["temperature"] = temperature
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    stack = contextlib.ExitStack()
    if policy:
        client: Any = get_policy(policy, env)
        model_name = policy
    elif checkpoint is not None:
        from sandgym.train.evaluate import serve_checkpoint

        backend = stack.enter_context(serve_checkpoint(checkpoint, max_batch_size=max(conc, 1)))
        client = OpenAIClient(backend.base_url, "sandgym", timeout_s=timeout_s, max_retries=max_retries)
        model_name = backend.model_name
    else:
        client = OpenAIClient(base_url, api_key, timeout_s=timeout_s, max_retries=max_retries)
        model_name = model or "default"

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]:.3f}  errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
    totals = {"n": 0, "reward": 0.0, "errors": 0}
    task_id = progress.add_task(env.name, total=None, reward=0.0, errors=0)

    def on_start(total: int, done: int) -> None:
        progress.update(task_id, total=total, completed=done)

    def on_record(rec: dict[str, Any]) -> None:
        totals["n"] += 1
        totals["reward"] += float(rec.get("reward") or 0.0)
        totals["errors"] += 1 if rec.get("error") else 0
        progress.update(task_id, advance=1, reward=totals["reward"] / totals["n"], errors=totals["errors"])

    async def _run_on_ray() -> dict[str, Any]:
        # The rollouts run on the cluster's node agents (sandgym.fleet.driver); the
        # environment and the policy are rebuilt there from their names and arguments.
        from sandgym.fleet.driver import run_fleet_eval
        from sandgym.fleet.jobs import ClientSpec, EnvSpec

        client_spec = (
            ClientSpec(model=model_name, policy=policy)
            if policy
            else ClientSpec(model=model_name, base_url=base_url, api_key=api_key or "EMPTY", timeout_s=timeout_s, max_retries=max_retries)
        )
        return await run_fleet_eval(
            env, EnvSpec(name=env_name, args=env_kwargs), client_spec, address=ray, output_dir=run_dir,
            num_examples=num_examples, rollouts_per_example=rollouts, concurrency=concurrency, node_retries=node_retries,
            sampling_args=sampling, fleet_options={"agent_provider": "docker" if provider == "ray" else provider},
            meta={"policy": policy, "base_url": base_url, "provider": provider, "env_args": env_kwargs, "argv": sys.argv[1:]},
            resume=resume is not None, on_start=on_start, on_record=on_record,
        )

    async def main() -> dict[str, Any]:
        try:
            if ray is not None:
                return await _run_on_ray()
            return await run_eval(
                env,
                client,
                model_name,
                output_dir=run_dir,
                num_examples=num_examples,
                rollouts_per_example=rollouts,
                concurrency=conc,
                sampling_args=sampling,
                provider=provider,
                meta={
                    "policy": policy,
                    "base_url": base_url,
                    "checkpoint": str(checkpoint) if checkpoint else None,
                    "provider": provider,
                    "env_args": env_kwargs,
                    "concurrency": conc,
                    "argv": sys.argv[1:],
                },
                resume=resume is not None,
                on_start=on_start,
                on_record=on_record,
            )
        finally:
            if hasattr(client, "aclose"):
                await client.aclose()
            await env.close()

    t0 = time.perf_counter()
    with stack, progress:
        summary = anyio.run(main)
    summary["command_wall_s"] = time.perf_counter() - t0
    summary["policy"] = policy
    summary["provider"] = provider
    summary["concurrency"] = summary["fleet"]["concurrency"] if "fleet" in summary else conc
    _print_table(out_console, summary)
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        sys.stdout.flush()
    note = infra_failure_note(summary, max_infra_failure_rate)
    if note is not None:
        err.print(f"error: {note}", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(INFRA_FAILURE_EXIT)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def _print_table(console: Any, s: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"sandgym eval: {s['env']} ({s['model']})", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("examples / rollouts", f"{s['num_examples']} / {s['num_rollouts']} (new {s['new_rollouts']}, resumed {s['resumed_rollouts']})")
    t.add_row("reward mean (std), valid", f"{_fmt(s['reward_mean'])} ({_fmt(s['reward_std'])})")
    t.add_row("passed", f"{s['passed']}/{s['num_rollouts']}")
    for k, v in s["pass_at_k"].items():
        t.add_row(f"pass@{k}", _fmt(v))
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(s["error_kinds"].items()))
    t.add_row("infra failures", f"{s['errors']} ({_fmt(s['infra_failure_rate'])}){': ' + kinds if kinds else ''}")
    timing = s["timing"]
    t.add_row(
        "mean time / rollout",
        "  ".join(f"{k.removesuffix('_s_mean')} {_fmt(v)}s" for k, v in timing.items() if v is not None),
    )
    for m, v in s["metrics"].items():
        t.add_row(f"metric {m}", _fmt(v))
    if "fleet" in s:
        f = s["fleet"]
        lost = [e["node"] for e in f["events"] if e["event"] == "lost"]
        t.add_row("fleet", f"{len(f['nodes'])} nodes, {f['per_node_concurrency']} per node; rollouts by node "
                  + ", ".join(f"{k} {v}" for k, v in f["rollouts_by_node"].items()))
        t.add_row("node failures", f"lost {', '.join(lost) or 'none'}; {f['retried_rollouts']} rollouts retried ({f['retries']} retries)"
                  + (f"; pruned {f['pruned']}" if f["pruned"] else ""))
    t.add_row("wall time", f"{s['wall_s']:.2f}s ({_fmt(s['rollouts_per_s'])} rollouts/s)")
    t.add_row("output", os.path.join(s["output_dir"], "results.jsonl"))
    console.print(t)


def environments_help() -> str:
    """The built-in environments, one per line, from the registry (no environment is imported)."""
    from sandgym.envs import BUILTIN

    width = max(map(len, BUILTIN))
    # "\b" keeps click from re-wrapping the lines into one paragraph.
    return "\b\nEnvironments:\n" + "\n".join(f"  {name:<{width}}  {e.description}" for name, e in BUILTIN.items())


def register(app: typer.Typer) -> None:
    app.command("eval", epilog=environments_help())(eval_command)
