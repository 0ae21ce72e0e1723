"""A training run's checkpoints: writing them (`sandgym train` and `sandgym sft`), finding
the newest, and model weights from one for a model built from the same [model] section (GRPO
starting from an SFT run, `[model] init_from`; evaluating a run's policy).

A checkpoint is `OUT/checkpoints/step_NNNNNN/trainer_state.pt` (`STATE_FILE`), a dict holding
at least `model` (the full state dict), `step` and `config` (the run's config, whose `model`
section describes the architecture); GRPO adds what its resume needs (optimizer state keyed
by parameter name, scheduler, data position, RNG states).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandgym.errors import UserError
from sandgym.train.folder import CHECKPOINTS

if TYPE_CHECKING:  # torch is imported where tensors are saved or loaded: finding a checkpoint
    import torch  # (the CLI's finished-run check) needs none

STATE_FILE = "trainer_state.pt"
STEP_PREFIX = "step_"


def step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step:06d}"


def checkpoints_in(root: Path) -> list[Path]:
    """The whole checkpoints under `root` (a run's checkpoints/ folder), oldest first."""
    return sorted(p for p in root.glob(STEP_PREFIX + "*") if (p / STATE_FILE).is_file())


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest checkpoint of the run whose output folder is `out` (None: it has none)."""
    found = checkpoints_in(Path(out) / CHECKPOINTS)
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint folder was written at (its name says it)."""
    return int(path.name.removeprefix(STEP_PREFIX))


def write_checkpoint(out: str | Path, step: int, state: Mapping[str, Any], keep: int) -> Path:
    """Write `state` as the checkpoint of `step` under the run folder `out`, whole or not at
    all (a temporary folder renamed into place), and keep only the newest `keep`."""
    root = Path(out) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp_{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    import torch

    torch.save(dict(state), tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob(STEP_PREFIX + "*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def find_checkpoint(path: str | Path) -> Path:
    """`path` itself when it holds a checkpoint, else the newest `checkpoints/step_*` (or
    `step_*`) under it."""
    p = Path(path)
    if (p / STATE_FILE).is_file():
        return p
    for root in (p / CHECKPOINTS, p):
        found = checkpoints_in(root)
        if found:
            return found[-1]
    raise UserError(f"no checkpoint in {p} (looked for {STATE_FILE} there, in checkpoints/step_*/ and step_*/)")


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    ck = find_checkpoint(path)
    import torch

    state = torch.load(ck / STATE_FILE, map_location=map_location, weights_only=False)
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{ck / STATE_FILE} is not a sandgym checkpoint (no model weights)")
    state["path"] = str(ck)
    return state


def model_section(state: dict[str, Any]) -> dict[str, Any]:
    """The [model] section the checkpoint's weights were made with."""
    model = (state.get("config") or {}).get("model")
    if not isinstance(model, dict):
        raise UserError(f"checkpoint {state.get('path')} does not record its [model] section")
    return model


def load_weights(model: torch.nn.Module, path: str | Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load a checkpoint's weights into `model` (strict). With `expect` (a [model] section as
    a dict), the checkpoint's must describe the same architecture: same `name_or_path` and,
    for "tiny", the same shape. Returns the checkpoint dict (without reloading later)."""
    state = read_checkpoint(path)
    if expect is not None:
        got = model_section(state)
        for key in ("name_or_path", "tiny"):
            if key in got and key in expect and got[key] != expect[key] and (key != "tiny" or expect.get("name_or_path") == "tiny"):
                raise UserError(
                    f"model.init_from: {state['path']} was trained with model.{key} = {got[key]!r}, "
                    f"this config has {expect[key]!r}; use the same [model] section"
                )
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise UserError(f"model.init_from: the weights in {state['path']} do not fit this model: {str(exc)[:300]}") from exc
    return state
