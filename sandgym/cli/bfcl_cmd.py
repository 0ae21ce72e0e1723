"""`sandgym bfcl`: BFCL runs as BFCL result files, and `bfcl evaluate` on them."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

RUNS_HELP = "Run directories (or results.jsonl files) of `sandgym eval bfcl_v4_single_turn / bfcl_v4_multi_turn`."


def register(app: typer.Typer) -> None:
    bfcl = typer.Typer(help="BFCL v4: export sandgym results for `bfcl evaluate`, and check that both agree.", no_args_is_help=True)
    app.add_typer(bfcl, name="bfcl")

    @bfcl.command("export")
    def export_cmd(
        runs: list[Path] = typer.Argument(..., help=RUNS_HELP),
        out: Path = typer.Option(..., "--out", "-o", help="BFCL project root to write result/<model>/... under."),
        model: Optional[str] = typer.Option(None, help="BFCL model registry name (default: the one sandgym scores with)."),
        rollout: int = typer.Option(0, help="Which rollout of each entry (BFCL has one result per entry)."),
    ) -> None:
        """Write BFCL result files; then `BFCL_PROJECT_ROOT=OUT bfcl evaluate --model MODEL`.
        Rollouts that failed (model call, sandbox, scoring) are left out, as sandgym leaves
        them out of its own scores; BFCL then scores the rest with --partial-eval."""
        from sandgym.bfcl.data import BFCL_MODEL
        from sandgym.bfcl.export import export_results, failed_by_category, is_partial, load_records

        m = model or BFCL_MODEL
        records = load_records(runs, rollout)
        counts = export_results(records, out, model=m)
        failed = failed_by_category(records)
        for cat in sorted(set(counts) | set(failed)):
            left = f"  ({len(failed[cat])} failed rollouts left out)" if cat in failed else ""
            typer.echo(f"{cat:26} {counts.get(cat, 0):5} entries{left}")
        partial = " --partial-eval" if is_partial(counts) else ""
        typer.echo(f"wrote {out}/result/{m}/ ; score with: BFCL_PROJECT_ROOT={out} bfcl evaluate --model {m} "
                   f"--test-category {','.join(counts)}{partial}")

    @bfcl.command("evaluate")
    def evaluate_cmd(
        runs: list[Path] = typer.Argument(..., help=RUNS_HELP),
        model: Optional[str] = typer.Option(None, help="BFCL model registry name (default: the one sandgym scores with)."),
        rollout: int = typer.Option(0, help="Which rollout of each entry."),
        keep: Optional[Path] = typer.Option(None, help="Keep the exported result files here."),
        provider: str = typer.Option("docker", help="Sandbox provider for the sandgym/bfcl sandbox."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON, last on stdout."),
    ) -> None:
        """Export the runs, run `bfcl evaluate` on them in a sandgym/bfcl sandbox, and compare its
        verdicts with sandgym's, per category and entry by entry. Rollouts that failed (model
        call, sandbox, scoring) have no verdict on either side (left out of the export, as
        out of sandgym's scores). Exits 1 when any verdict differs."""
        import anyio
        from rich.console import Console
        from rich.table import Table

        from sandgym.bfcl.data import BFCL_MODEL
        from sandgym.bfcl.export import bfcl_evaluate, compare, export_results, is_partial, load_records

        m = model or BFCL_MODEL
        records = load_records(runs, rollout)
        with tempfile.TemporaryDirectory(prefix="sandgym-bfcl-") as tmp:
            root = keep or Path(tmp)
            counts = export_results(records, root, model=m)
            ev = anyio.run(lambda: bfcl_evaluate(root, list(counts), model=m, partial=is_partial(counts), provider=provider))
        rows = compare(records, ev)
        console = Console(stderr=as_json)
        t = Table(title=f"BFCL per-category accuracy: sandgym vs `{ev.command}`")
        for col in ("category", "n", "failed (left out)", "sandgym", "bfcl evaluate", "agree"):
            t.add_column(col)

        def acc(x: float | None) -> str:
            return "-" if x is None else f"{x:.4f}"

        for r in rows:
            t.add_row(r["category"], str(r["n"]), str(r["failed"]), acc(r["sandgym"]), acc(r["bfcl"]),
                      "yes" if r["agree"] else "[red]NO[/]")
        console.print(t)
        for r in rows:
            if r["differ"]:
                console.print(f"[red]{r['category']}: the verdicts differ on {', '.join(r['differ'][:20])}[/]", soft_wrap=True)
        if as_json:
            sys.stdout.write(json.dumps({"command": ev.command, "rows": rows}) + "\n")
        if not all(r["agree"] for r in rows):
            raise typer.Exit(1)
