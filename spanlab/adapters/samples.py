"""Training samples and the padded tensors built from them: what the trainers take, wherever samples come from.

Why its own module: the sample reader (:mod:`spanlab.adapters.sample_reader`: spans -> samples), the conversation
encoder (SFT demonstrations -> samples), the re-tokenizing adapter and the trainers in :mod:`spanlab.training` all
use :class:`Sample`; kept apart from the store readers, it imports none of them, so they need not import each other
for it. This is the one module to import :class:`Sample` from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["Batch", "Sample", "collate", "micro_batches"]


@dataclass
class Sample:
    """One training sequence. ``engine_logprobs`` is NaN on sampled tokens the engine gave no logprob for.

    Retokenized samples also carry ``exact`` (the engine's sample of the same call/session) and
    ``aligned_logprobs`` (engine logprob of the sampled token each trained token aligns with, NaN where none;
    for drift metrics, never for the loss). Exact samples leave both None.
    """

    rollout_id: str
    group_id: str
    input_ids: np.ndarray  # int32 [T], prompt + response
    loss_mask: np.ndarray  # uint8 [T], 1 on sampled tokens
    engine_logprobs: np.ndarray  # float32 [T], 0 where loss_mask is 0
    reward: float
    span_ids: list[str] = field(default_factory=list)
    exact: Sample | None = None
    aligned_logprobs: np.ndarray | None = None  # float32 [T]; None = engine_logprobs
    role: str = ""  # the calls' ``attributes.agent`` ("" for a single-agent call): GRPO's per-role normalization

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Batch:
    """Right-padded tensors of a list of samples; ``advantages`` has one value per row.

    ``sampled_logprobs``: the engine logprob aligned with each trained token (NaN where none, 0 on padding),
    for the trainer/engine drift metric; equal to ``engine_logprobs`` for exact samples.
    """

    input_ids: torch.Tensor  # long [B, T]
    attention_mask: torch.Tensor  # long [B, T]
    loss_mask: torch.Tensor  # float [B, T]
    engine_logprobs: torch.Tensor  # float [B, T]
    advantages: torch.Tensor  # float [B]
    sampled_logprobs: torch.Tensor | None = None  # float [B, T]

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device`` (the model's: collate builds it on the CPU)."""
        if device.type == "cpu":
            return self
        return Batch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()})


def collate(samples: Sequence[Sample], advantages: Sequence[float] | np.ndarray | torch.Tensor, pad_id: int) -> Batch:
    """Right-pad ``samples`` to the longest one; padding has attention 0, loss mask 0, logprob 0."""
    adv_B = torch.as_tensor(np.asarray(advantages, dtype=np.float32))
    if adv_B.shape != (len(samples),):
        raise ValueError(f"advantages has shape {tuple(adv_B.shape)}, expected ({len(samples)},)")
    B, T = len(samples), max((len(s) for s in samples), default=0)
    ids_B_T = np.full((B, T), pad_id, dtype=np.int64)
    attn_B_T = np.zeros((B, T), dtype=np.int64)
    mask_B_T = np.zeros((B, T), dtype=np.float32)
    engine_B_T = np.zeros((B, T), dtype=np.float32)
    sampled_B_T = np.zeros((B, T), dtype=np.float32)
    for i, s in enumerate(samples):
        n = len(s)
        ids_B_T[i, :n], attn_B_T[i, :n] = s.input_ids, 1
        mask_B_T[i, :n], engine_B_T[i, :n] = s.loss_mask, s.engine_logprobs
        sampled_B_T[i, :n] = s.aligned_logprobs if s.aligned_logprobs is not None else s.engine_logprobs
    return Batch(torch.from_numpy(ids_B_T), torch.from_numpy(attn_B_T), torch.from_numpy(mask_B_T),
                 torch.from_numpy(engine_B_T), adv_B, torch.from_numpy(sampled_B_T))


def micro_batches(samples: Sequence[Sample], max_tokens: int) -> Iterator[list[Sample]]:
    """Consecutive chunks whose padded size (rows x longest row) stays within ``max_tokens``.

    Order is kept (sort by length first to waste less on padding); a sample longer than the budget
    gets a micro-batch of its own rather than being cut.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    chunk: list[Sample] = []
    longest = 0
    for s in samples:
        if chunk and (len(chunk) + 1) * max(longest, len(s)) > max_tokens:
            yield chunk
            chunk, longest = [], 0
        chunk.append(s)
        longest = max(longest, len(s))
    if chunk:
        yield chunk
