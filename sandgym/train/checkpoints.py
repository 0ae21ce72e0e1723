"""Model weights from a run's checkpoint, for a model built from the same [model] section:
GRPO starting from an SFT run (`[model] init_from`), and evaluating a run's policy.

`sandgym sft` and `sandgym train` both write `OUT/checkpoints/step_NNNNNN/trainer_state.pt`,
a dict holding at least `model` (the state dict), `step` and `config` (the run's config, whose
`model` section describes the architecture).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sandgym.errors import UserError
from sandgym.train.folder import CHECKPOINTS

STATE_FILE = "trainer_state.pt"


def find_checkpoint(path: str | Path) -> Path:
    """`path` itself when it holds a checkpoint, else the newest `checkpoints/step_*` (or
    `step_*`) under it."""
    p = Path(path)
    if (p / STATE_FILE).is_file():
        return p
    for root in (p / CHECKPOINTS, p):
        found = sorted(c for c in root.glob("step_*") if (c / STATE_FILE).is_file())
        if found:
            return found[-1]
    raise UserError(f"no checkpoint in {p} (looked for {STATE_FILE} there, in checkpoints/step_*/ and step_*/)")


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    ck = find_checkpoint(path)
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
