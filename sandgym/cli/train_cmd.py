"""`sandgym train CONFIG.toml`: GRPO training with a per-step reward line (rich).

`--nproc N` trains with N local processes (FSDP2, train.launch.launch); under `torchrun`
(WORLD_SIZE > 1 in the environment) this process is one rank (train.launch.train_rank). A
finished run in the output folder is reported as finished, and nothing is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sandgym.cli.train_config import OutputOpt, SetOpt, StepsOpt, VerboseOpt


def show_step(m: dict[str, float]) -> None:
    """One line per step (module level: spawned ranks receive it pickled)."""
    from rich.console import Console

    extra = f" kl={m['kl']:.4f}" if "kl" in m else ""
    if m.get("infra_failure_rate"):
        extra += f"  infra-fail {m['infra_failure_rate']:.2f}"
    if m.get("stale_groups_dropped"):
        extra += f"  stale-dropped {int(m['stale_groups_dropped'])}"
    Console().print(
        f"step {int(m['step']):4d}  reward [bold green]{m['reward_mean']:.3f}[/] ±{m['reward_std']:.3f}  "
        f"loss {m['loss']:+.4f}  entropy {m.get('entropy', 0.0):.3f}  clip {m.get('clip_frac', 0.0):.3f}{extra}  "
        f"gen {m['generate_s']:.1f}s  train {m.get('train_s', 0.0):.1f}s  "
        f"{m.get('train_tokens_per_s', 0.0):.0f} tok/s"
    )


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: Path = typer.Argument(..., exists=True, dir_okay=False, help="TOML training config"),
        steps: StepsOpt = None,
        output: OutputOpt = None,
        set_: SetOpt = None,
        no_resume: bool = typer.Option(False, "--no-resume", help="start fresh even if checkpoints exist"),
        nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="trainer processes on this machine (FSDP2); overrides distributed.nproc"),
        verbose: VerboseOpt = False,
    ) -> None:
        """Train a policy with GRPO on an environment (toy or a sandgym environment)."""
        from sandgym.cli.errors import show_tracebacks
        from sandgym.cli.train_config import overrides, read_config, rich_logging
        from sandgym.errors import UserError
        from sandgym.train.checkpoints import checkpoint_step, latest_checkpoint
        from sandgym.train.config import TrainConfig
        from sandgym.train.folder import METRICS
        from sandgym.train.launch import torchrun_env

        show_tracebacks(verbose)
        console = rich_logging(verbose)
        changes = overrides(set_, steps=steps, output=output)
        if no_resume:
            changes["output.resume"] = False
        ranks = torchrun_env()
        if ranks is not None:
            if nproc is not None and nproc != ranks[1]:
                raise UserError(f"--nproc {nproc} disagrees with torchrun's WORLD_SIZE {ranks[1]}; leave --nproc out under torchrun")
            changes["distributed.nproc"] = ranks[1]
        elif nproc is not None:
            changes["distributed.nproc"] = nproc
        cfg = read_config(TrainConfig.from_toml, config, changes)
        if cfg.output.resume and (ck := latest_checkpoint(cfg.output.dir)) is not None and checkpoint_step(ck) >= cfg.optim.steps:
            if ranks is None or ranks[0] == 0:
                console.print(
                    f"{cfg.output.dir} is a finished run (step {checkpoint_step(ck)} of {cfg.optim.steps}): nothing to train. "
                    "--no-resume trains it again from scratch, --output DIR trains a new run elsewhere, --steps N trains this one further."
                )
            return

        # Checked above while the config was read: nothing is built (or torch imported) before this point.
        from sandgym.train.launch import launch, train_rank
        from sandgym.train.trainer import Trainer

        world = cfg.distributed.nproc
        if ranks is not None:
            rank, world, local = ranks
            if rank == 0:
                console.print(f"[bold]sandgym train[/] rank 0 of {world} (torchrun) model={cfg.model.name_or_path} out={cfg.output.dir}")
            train_rank(cfg, rank, world, local_rank=local, init_method="env://", on_step=show_step)
            return
        if world > 1:
            console.print(
                f"[bold]sandgym train[/] model={cfg.model.name_or_path} env={cfg.env.kind}{':' + cfg.env.name if cfg.env.name else ''} "
                f"nproc={world} (FSDP2) steps={cfg.optim.steps} out={cfg.output.dir}"
            )
            launch(cfg, world, on_step=show_step)
            console.print(f"done: metrics {Path(cfg.output.dir) / METRICS}")
            return
        trainer = Trainer(cfg, on_step=show_step)
        console.print(
            f"[bold]sandgym train[/] model={cfg.model.name_or_path} env={cfg.env.kind}{':' + cfg.env.name if cfg.env.name else ''} "
            f"device={trainer.device} attention={trainer.policy.kernel} steps={cfg.optim.steps} out={trainer.out}"
        )
        hist = trainer.run()
        console.print(
            f"done: reward {hist[0]['reward_mean']:.3f} -> {hist[-1]['reward_mean']:.3f}; "
            f"metrics {trainer.metrics_path}; plot {trainer.plot_path if cfg.output.plot else '(off)'}; "
            f"checkpoint {trainer.latest_checkpoint()}"
        )
