"""Supervised fine-tuning on chat conversations, loss on the assistant's tokens only.

Used as the warm start before GRPO (REFERENCE.md §8: SmolLM2 never calls a tool by itself, so RL has
nothing to reinforce until a few demonstrations show it the tool-call format). A conversation is
rendered with the served model's own chat template, so the model learns exactly the prompt the live
agent will send it; the mask comes from the character spans of the assistant turns, found by
rendering the conversation's prefixes (the template must be prefix-preserving, which spanlab's is and
``spanlab template check`` verifies for others).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from spanlab.adapters.conversation import encode_conversation, sft_sample
from spanlab.adapters.samples import Sample, collate
from spanlab.errors import ConfigError
from spanlab.training.logprobs import token_logprobs
from spanlab.training.settings import SFTConfig

if TYPE_CHECKING:
    from spanlab.progress import PhaseProgress

__all__ = ["SFTConfig", "encode_conversation", "sft_sample", "sft_train"]

logger = logging.getLogger(__name__)


def sft_train(
    model: torch.nn.Module,
    samples: Sequence[Sample],
    config: SFTConfig,
    *,
    pad_id: int,
    progress: PhaseProgress | None = None,
    weights: Sequence[float] | None = None,
    label: str = "warm start (SFT)",
) -> dict[str, float]:
    """Shuffled mini-batch SFT over ``samples`` (from :func:`encode_conversation` or an SFT dataset).

    ``weights`` (one per sample, e.g. the reward) scale each example's token losses; the loss is still
    divided by the batch's trained-token count, so weights of 1 give the plain mean token NLL.
    """
    weight_of = {id(s): w for s, w in zip(samples, weights, strict=True)} if weights is not None else {}
    kept = [s for s in samples if len(s.input_ids) <= config.max_len and s.loss_mask.any()]
    if len(kept) < len(samples):
        logger.warning("SFT skips %d of %d conversations (too long or nothing to learn)", len(samples) - len(kept),
                       len(samples))
    if not kept:
        raise ConfigError("SFT has no usable conversations")
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter's only
    device = trainable[0].device  # the batches go where the model is (a GPU with trainer.device: gpu)
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    rng = random.Random(config.seed)
    steps = config.epochs * math.ceil(len(kept) / config.batch_size)
    model.train()
    losses: list[float] = []
    tokens, started = 0, time.perf_counter()
    with progress.phase(label, steps) if progress is not None else contextlib.nullcontext() as bar:
        for chunk in _batches(kept, config, rng):
            batch = collate(chunk, torch.zeros(len(chunk)), pad_id).to(device)
            w_B = torch.tensor([weight_of.get(id(s), 1.0) for s in chunk], dtype=torch.float32, device=device)
            logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask, positions_mask=batch.loss_mask)
            loss = -(logprobs * batch.loss_mask * w_B[:, None]).sum() / batch.loss_mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # the trained weights' norm only: another adapter's gradients (a policy trained before) are not ours
            torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            tokens += int(batch.attention_mask.sum())
            if bar is not None:
                bar.advance(note=f"loss {loss.item():.3f}")
    optimizer.zero_grad(set_to_none=True)  # no stale gradient left for whatever trains this model next
    model.eval()
    seconds = time.perf_counter() - started
    return {"sft_steps": len(losses), "sft_loss_first": losses[0], "sft_loss_last": losses[-1],
            "sft_examples": len(kept), "sft_seconds": seconds, "sft_tokens_per_s": tokens / max(seconds, 1e-9)}


def _batches(samples: list[Sample], config: SFTConfig, rng: random.Random) -> Iterator[list[Sample]]:
    """``config.epochs`` passes over ``samples``, each shuffled by ``rng``, in mini-batches of ``batch_size``."""
    for _epoch in range(config.epochs):
        order = list(samples)
        rng.shuffle(order)
        for i in range(0, len(order), config.batch_size):
            yield order[i : i + config.batch_size]
