"""The NLL terms a GRPO update adds to its loss: ``coef`` x some rows' mean token NLL, against forgetting.

Two feed it. ``grpo.demonstrations`` (PPO-ptx): demonstrations drawn in the loop, the warm start's when it recorded
them. ``grpo.replay``: the step's own all-solved groups, which GRPO drops (equal rewards, zero advantage); chosen
here (:func:`replayed_rows`) from the samples the step already read, so the rows are the policy's current answers
as the engine sampled them (only ``levels`` reads the rollouts' tasks, in the loop). Each term is backed into the
gradients the GRPO loss left, before the optimizer step, and reports its own metrics (``demo_*``, ``replay_*``).

Why a module of its own: the update (:mod:`.update`) runs the terms; what a term's rows are and how its NLL is
taken is the same for both, and neither needs the clipped surrogate.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from spanlab.adapters.samples import Sample, collate
from spanlab.algos.grpo.config import GRPOConfig, ReplayTerm
from spanlab.training.logprobs import token_logprobs
from spanlab.training.packing import packed_micro_batches

__all__ = ["ReplayDraw", "autocast", "nll_term", "replay_metrics", "replayed_rows"]


def autocast(model: nn.Module, config: GRPOConfig) -> torch.autocast:
    """bfloat16 forward passes when ``config.bf16`` (on the model's device), else a no-op: the GRPO loss's forward
    passes (:mod:`.update`) and the NLL terms' alike."""
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16, enabled=config.bf16)


@dataclass(frozen=True)
class ReplayDraw:
    """What a step's replay needs beside its samples: the seed of its choice (which groups when more than
    ``per_step`` are solved, which rollout of each), and the rollouts whose task is of a replayed level (None:
    every rollout). The loop makes one per step (:func:`spanlab.algos.grpo.loop.train_grpo`)."""

    seed: str = "spanlab-replay"
    rollouts: frozenset[str] | None = None


@dataclass(frozen=True)
class ReplayedRows:
    """A step's replay: the rows (every sample of one rollout per chosen group) and how many groups qualified."""

    rows: list[Sample]
    groups_solved: int
    groups: int


def replayed_rows(samples: Sequence[Sample], groups_with_signal: set[str], term: ReplayTerm,
                  draw: ReplayDraw) -> ReplayedRows:
    """One rollout's samples of each group GRPO dropped whose every sample reached ``term.solved_reward`` (and whose
    rollouts ``draw`` allows), for at most ``term.per_step`` groups; groups and rollouts are drawn with
    ``draw.seed``, in the samples' order, so a seeded run replays the same rows."""
    members: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        members[s.group_id].append(s)
    solved = [g for g, group in members.items()
              if g not in groups_with_signal and all(s.reward >= term.solved_reward for s in group)
              and (draw.rollouts is None or all(s.rollout_id in draw.rollouts for s in group))]
    if not solved:
        return ReplayedRows([], 0, 0)
    rng = random.Random(draw.seed)
    chosen = sorted(rng.sample(range(len(solved)), min(term.per_step, len(solved))))
    rows: list[Sample] = []
    for k in chosen:
        group = members[solved[k]]
        rollout = rng.choice(list(dict.fromkeys(s.rollout_id for s in group)))
        rows += [s for s in group if s.rollout_id == rollout]
    return ReplayedRows(rows, len(solved), len(chosen))


def replay_metrics(replayed: ReplayedRows, nll: float, tokens: float) -> dict[str, float]:
    """The step log's ``replay_*`` keys: NaN NLL when no group was solved (no row, no term)."""
    return {"replay_nll": nll if replayed.rows else math.nan, "replay_tokens": tokens,
            "replay_rows": float(len(replayed.rows)), "replay_groups": float(replayed.groups),
            "replay_groups_solved": float(replayed.groups_solved)}


def nll_term(model: nn.Module, rows: Sequence[Sample], coef: float, config: GRPOConfig, pad_id: int,
             device: torch.device) -> tuple[float, float]:
    """Backward of ``coef`` x the rows' mean token NLL (over all their trained tokens, in micro-batches) into the
    gradients already there; the NLL and the token count. The NLL is at temperature 1: the model's own
    distribution, the one SFT trained (a row sampled at another temperature is still the policy's answer)."""
    n_tokens = float(sum(int(r.loss_mask.sum()) for r in rows))
    nll_sum = 0.0
    for chunk in packed_micro_batches([r.input_ids for r in rows], config.micro_batch_tokens):
        b = collate([rows[k] for k in chunk], [0.0] * len(chunk), pad_id).to(device)
        with autocast(model, config):
            logprobs_B_T = token_logprobs(model, b.input_ids, b.attention_mask, positions_mask=b.loss_mask > 0)
        nll = -(logprobs_B_T * b.loss_mask.to(logprobs_B_T.dtype)).sum() / max(n_tokens, 1.0)
        (coef * nll).backward()
        nll_sum += float(nll.detach())
    return nll_sum, n_tokens
