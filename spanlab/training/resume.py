"""The trainer's state after a completed step, on disk, so ``spanlab train --resume`` continues where it stopped.

What a step leaves behind and a restart would otherwise lose: the trainable weights, the optimizer's
moments, the step counter and policy version (in ``state.json``, with the job's report so far) and the
RNG states. One folder, ``runs/NAME/resume/``, written whole as a sibling and renamed into place, so a
kill at any moment leaves either the previous step's state or this one's, never a mix: between the two
renames the previous folder is ``resume.old``, which :func:`load_state` falls back to.

Only trainable parameters are saved (for LoRA the adapters, a few MB): frozen ones are the base model's,
which the job loads again anyway.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

STATE_DIR = "resume"


@dataclass
class TrainState:
    """What :func:`load_state` read: the job's JSON state and the tensors (applied with :func:`restore`)."""

    info: dict[str, Any]
    tensors: dict[str, Any]


def save_state(run_dir: Path, info: dict[str, Any], model: nn.Module | None,
               optimizer: torch.optim.Optimizer | None) -> Path:
    """Write ``run_dir/resume`` atomically: ``state.json`` (``info`` + RNG states) and ``tensors.pt``."""
    final = run_dir / STATE_DIR
    tmp = run_dir / f".{STATE_DIR}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        tensors: dict[str, Any] = {"torch_rng": torch.get_rng_state()}
        if model is not None:
            tensors["params"] = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
        if optimizer is not None:
            tensors["optimizer"] = optimizer.state_dict()
        torch.save(tensors, tmp / "tensors.pt")
        rng = {"python": _jsonable(random.getstate()), "numpy": _jsonable(np.random.get_state(legacy=True))}
        (tmp / "state.json").write_text(json.dumps({**info, "rng": rng}) + "\n")
        old = run_dir / f"{STATE_DIR}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_state(run_dir: Path) -> TrainState | None:
    """The last saved state (``resume``, else ``resume.old`` left by a kill between two renames), or None."""
    for folder in (run_dir / STATE_DIR, run_dir / f"{STATE_DIR}.old"):
        if (folder / "state.json").is_file() and (folder / "tensors.pt").is_file():
            info = json.loads((folder / "state.json").read_text())
            tensors = torch.load(folder / "tensors.pt", weights_only=True, map_location="cpu")
            return TrainState(info, tensors)
    return None


def restore_weights(state: TrainState, model: nn.Module) -> None:
    """Put the saved trainable parameters back (every one of them must exist in ``model``)."""
    params = state.tensors.get("params")
    if params is None:
        return
    own = dict(model.named_parameters())
    missing = sorted(set(params) - set(own))
    if missing:
        raise ValueError(f"the saved state has parameters this model lacks: {missing[:3]}")
    with torch.no_grad():
        for name, value in params.items():
            own[name].copy_(value)


def restore_optimizer(state: TrainState, optimizer: torch.optim.Optimizer) -> bool:
    """Load the saved optimizer state into ``optimizer`` (False when the state has none: no step was done)."""
    saved = state.tensors.get("optimizer")
    if saved is None:
        return False
    optimizer.load_state_dict(saved)
    return True


def restore_rng(state: TrainState) -> None:
    """Python's, NumPy's and torch's global RNGs as they were when the state was saved."""
    rng = state.info["rng"]
    python = rng["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state.tensors["torch_rng"])


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value
