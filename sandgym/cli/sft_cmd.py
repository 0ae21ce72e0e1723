"""`sandgym sft CONFIG.toml`: supervised fine-tuning on rollout records (a warm start for
`sandgym train`; sandgym.train.sft)."""

from __future__ import annotations

from pathlib import Path

import typer

from sandgym.cli.train_config import OutputOpt, SetOpt, StepsOpt, VerboseOpt


def register(app: typer.Typer) -> None:
    @app.command("sft")
    def sft(
        config: Path = typer.Argument(..., exists=True, dir_okay=False, help="TOML SFT config"),
        steps: StepsOpt = None,
        output: OutputOpt = None,
        set_: SetOpt = None,
        verbose: VerboseOpt = False,
    ) -> None:
        """Fine-tune a policy on `sandgym eval` records (results.jsonl): assistant tokens only."""
        from sandgym.cli.errors import show_tracebacks
        from sandgym.cli.train_config import overrides, read_config, rich_logging
        from sandgym.train.sft_data import SFTConfig, read_records

        show_tracebacks(verbose)
        console = rich_logging(verbose)
        cfg = read_config(SFTConfig.from_toml, config, overrides(set_, steps=steps, output=output))
        records = read_records(cfg.data)  # bad config or data is refused before torch is imported

        from sandgym.train.sft import SFTTrainer

        every = max(1, cfg.optim.steps // 20)

        def show(m: dict[str, float]) -> None:
            step = int(m["step"])
            if step == 1 or step % every == 0 or step == cfg.optim.steps:
                console.print(
                    f"step {step:4d}  loss [bold green]{m['loss']:.4f}[/]  tokens {int(m['loss_tokens'])}/{int(m['train_tokens'])}  "
                    f"grad {m['grad_norm']:.2f}  lr {m['lr']:.2e}  {m['train_s']:.2f}s"
                )

        trainer = SFTTrainer(cfg, on_step=show, records=records)
        console.print(
            f"[bold]sandgym sft[/] model={cfg.model.name_or_path} records={len(trainer.sequences)} "
            f"steps={cfg.optim.steps} batch={cfg.optim.batch_size} device={trainer.device} out={trainer.out}"
        )
        hist = trainer.run()
        console.print(f"done: loss {hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f}; checkpoint {trainer.checkpoint}")
