"""A trained policy as a folder ``vllm serve`` loads as it is: config, tokenizer, chat template, safetensors.

Why a whole folder: the weights the engine reloads in place during training (``runs/NAME/weights``) are
only ``model.safetensors``; vLLM and transformers need the config, tokenizer and chat template next to
them. Those come unchanged from the folder the policy was loaded from (for the default model the
converted SmolLM2 folder), so the served model tokenizes and renders tool calls exactly as in training.

A LoRA policy writes its adapter under ``adapter/`` (``vllm serve BASE --enable-lora --lora-modules
policy=DIR/adapter``) and, with ``merge_lora``, the merged full weights at the top, so the folder itself
also serves. The folder is built next to its target and renamed into place: a killed export never
leaves a half folder where a complete one was.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from torch import nn

from spanlab.engine.weights import save_weights

logger = logging.getLogger(__name__)

# Everything of the base folder but its weights (and spanlab's conversion marker, which describes the GGUF).
_SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_SKIPPED_NAMES = frozenset({"model.safetensors.index.json", "pytorch_model.bin.index.json",
                            "spanlab_conversion.json"})


def write_servable(model: nn.Module, base_dir: str | Path, out: str | Path, *, merge_lora: bool = True,
                   info: dict[str, object] | None = None, weights_dir: Path | None = None,
                   tokenizer: Any = None) -> Path:
    """Write ``model`` with ``base_dir``'s config and tokenizer files as the HF folder ``out`` (replaced).

    ``base_dir`` that is not a local folder (a hub name) takes the config from the model and the tokenizer
    files (chat template included) from ``tokenizer``. ``weights_dir``: take the safetensors from this folder
    instead (weights another trainer saved, such as Unsloth's merged save in a child process, which the torch
    model here never saw).
    """
    base, out = Path(base_dir), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if base.is_dir():
            for src in base.iterdir():
                if src.is_file() and src.name not in _SKIPPED_NAMES and not src.name.endswith(_SKIPPED_SUFFIXES):
                    shutil.copyfile(src, tmp / src.name)
        else:
            if tokenizer is None:
                raise ValueError(f"{base} is not a local folder: pass the tokenizer to write its files")
            plain = model.get_base_model() if hasattr(model, "get_base_model") else model
            plain.config.save_pretrained(str(tmp))
            if getattr(plain, "generation_config", None) is not None:
                plain.generation_config.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        if weights_dir is not None:
            for src in weights_dir.glob("*.safetensors*"):
                shutil.copyfile(src, tmp / src.name)
        elif hasattr(model, "peft_config"):
            model.save_pretrained(str(tmp / "adapter"))
            if merge_lora:
                merged = copy.deepcopy(model).merge_and_unload()  # a copy: the trained model keeps its adapter
                save_weights(merged.state_dict(), tmp)
        else:
            save_weights(model.state_dict(), tmp)
        (tmp / "spanlab_checkpoint.json").write_text(json.dumps({"base": str(base), **(info or {})}, indent=2) + "\n")
        for f in tmp.rglob("*"):  # safetensors writes 0600; a model folder is for others to serve too
            f.chmod(0o755 if f.is_dir() else 0o644)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote servable model %s", out)
    return out


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_servable(folder: Path) -> bool:
    """A folder vLLM can serve as a model: config, tokenizer and weights present."""
    return ((folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
            and any(folder.glob("*.safetensors")))
