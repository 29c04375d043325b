"""Do a LoRA config's ``target_modules`` name layers the model has? Checked before a run starts.

Why: peft matches each name as a suffix of the model's module names and fails only once it wraps the model,
which a job does after the engine start, the base evaluation and the warm start; and a list with one good name
(``[q_proj, no_such_proj]``) trains that one alone without a word. Here every name must match at least one layer
peft can adapt (linear, embedding, convolution), and every module it matches must be one.

The module names come from a model built on the meta device from the model folder's ``config.json``: the
architecture's own code names them, and no weight is read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

# peft's own wrappers: what ``get_peft_model`` can put a LoRA on (torch.nn and transformers' GPT-2 ``Conv1D``).
ADAPTABLE = frozenset({"Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D"})


def model_modules(model_dir: str | Path) -> dict[str, str]:
    """Module name -> class name of the model whose ``config.json`` is in ``model_dir`` (no weights loaded).
    Raises OSError/ValueError when the folder has no config transformers can read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: type(module).__name__ for name, module in model.named_modules() if name}


def target_problem(targets: Iterable[str], modules: Mapping[str, str]) -> str | None:
    """Why ``targets`` (peft's list form: each a module name or its dotted suffix) would not adapt what they
    say, or None: a name matching no module, or matching a module peft cannot adapt."""
    layers = sorted({name.rpartition(".")[2] for name, kind in modules.items() if kind in ADAPTABLE})
    for target in targets:
        matched = [name for name in modules if name == target or name.endswith("." + target)]
        if not matched:
            return f"{target!r} names no layer of the model (its layers: {', '.join(layers)})"
        if odd := [name for name in matched if modules[name] not in ADAPTABLE]:
            return (f"{target!r} names {odd[0]} ({modules[odd[0]]}), which is not a layer LoRA can adapt "
                    f"(its layers: {', '.join(layers)})")
    return None
