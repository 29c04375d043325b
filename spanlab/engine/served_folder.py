"""A trained run's folder as ``spanlab serve`` serves it: the files spanlab writes beside the weights, the name
clients ask for the model by, and the command that serves the folder.

Why here and not in the serve command: the training job writes these folders (:mod:`spanlab.jobs.checkpoints`,
:mod:`spanlab.jobs.policies`) and prints the command that serves them (:mod:`spanlab.jobs.outcome`), and the serve
command reads them; both sides name the same files, so the names live below both, with the engine that loads the
folder, and training never imports the command line's modules.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from spanlab.errors import ConfigError

__all__ = ["CHECKPOINT_INFO", "POLICIES_FILE", "serve_command", "served_name"]

POLICIES_FILE = "policies.json"  # a run's folder with a policy per role (spanlab.jobs.policies) has it
CHECKPOINT_INFO = "spanlab_checkpoint.json"  # what a run writes beside the weights (spanlab.jobs.checkpoints)
_RUN_TAG = re.compile(r"final|step-\d+")


def served_name(folder: Path) -> str:
    """The name clients ask for a model folder by: a trained run's name (``calc-grpo`` for
    ``runs/calc-grpo/final``, ``calc-grpo-step-3`` for its ``step-3/``), else the folder's own name.

    Why not the path (vLLM's default): clients would send a path that changes when the folder moves, and a
    wrong name's 404 would list it. The run's name comes from the folder's checkpoint info, else from the
    folder above a ``final``/``step-K`` folder."""
    info_file = folder / CHECKPOINT_INFO
    try:
        info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    except ValueError as exc:
        raise ConfigError(f"--model {folder}: {CHECKPOINT_INFO} is not JSON: {exc}") from exc
    resolved = folder.resolve()
    tag = str(info.get("tag") or resolved.name)
    run = info.get("run_name") or (resolved.parent.name if _RUN_TAG.fullmatch(resolved.name) else None)
    if not run:
        return resolved.name
    return str(run) if tag == "final" else f"{run}-{tag}"


def serve_command(model_dir: Path) -> str:
    """The command that serves a trained folder: the line ``spanlab train`` prints, and the one its test runs."""
    return f"spanlab serve --model {shlex.quote(str(model_dir))}"
