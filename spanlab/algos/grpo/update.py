"""GRPO on stored spans: group-normalized advantages, DAPO clipped surrogate, optional k3 KL and TIS.

One ``grpo_step`` is one batch of samples (already rolled out and rewarded, see ``spanlab.adapters.sample_reader``):
advantages per group of samples of one task, then ``epochs_per_batch`` optimizer steps, each over all
micro-batches with gradient accumulation so the loss is aggregated exactly over the whole batch. The
engine's sampling logprobs correct the trainer/engine mismatch with truncated importance sampling
(verl/TRL "TIS"). Micro-batches hold up to ``micro_batch_tokens`` packed tokens: rows in token order, so
the samples that share a prompt share a micro-batch, where it runs once (``spanlab.training.packing``).
REFERENCE.md §6 has the formulas. Drift metrics (issue #7): ``drift_*_frac`` compare the
trained tokens with the sampled ones (``spanlab.adapters.retokenize.drift_stats``); ``drift_logp_abs_diff`` is
the mean |trainer - engine| logprob at the step's start over trained tokens aligned with a sampled token
(samples of groups with reward variance only: the others get no forward pass).

Left out: the rollout loop, weight sync and eval (the caller's), GSPO's sequence-level ratio, entropy
bonus, learning-rate schedules, mixed precision. Run it through ``spanlab train`` or call
``grpo_step(model, optimizer, samples, config, pad_id=...)`` directly.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from spanlab.adapters.retokenize import drift_stats
from spanlab.adapters.samples import Batch, Sample, collate
from spanlab.algos.grpo.advantages import cancel_identical, group_advantages, sample_advantages, turn_advantages
from spanlab.algos.grpo.config import Aggregation, GRPOConfig
from spanlab.algos.grpo.nll_terms import ReplayDraw, autocast, nll_term, replay_metrics, replayed_rows
from spanlab.training.logprobs import token_logprobs
from spanlab.training.model import apply_lora, peak_rss_mb
from spanlab.training.packing import packed_micro_batches
from spanlab.training.ranks import Ranks, gather
from spanlab.training.settings import LoraConfig

__all__ = ["GRPOConfig", "LoraConfig", "group_advantages", "grpo_step", "make_model_for_training", "policy_loss",
           "sample_advantages", "turn_advantages"]

logger = logging.getLogger(__name__)


def make_model_for_training(model_dir: str | Path, config: GRPOConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model in train mode and an AdamW over its trainable parameters (LoRA's only, when configured)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    logger.info("training %s: %.1f M trainable of %.1f M parameters", model_dir,
                sum(p.numel() for p in params) / 1e6, sum(p.numel() for p in model.parameters()) / 1e6)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    return model, optimizer


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: Aggregation,
    constant_divisor: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    engine_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    batch_tokens: float | None = None,
    batch_seqs: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of ``[B, T]`` token logprobs and ``[B]`` advantages, and token-mean metrics.

    Per token: ``-min(rho*A, clip(rho, 1-clip_low, 1+clip_high)*A) * w + kl_beta * k3`` with
    ``rho = exp(logp - old)``, ``w = min(exp(old - engine), tis_cap)`` (detached; 1 where the engine
    logprob is unknown/NaN; ``mismatch_kl`` reports the k3 KL of engine to trainer behind it) and
    ``k3 = exp(ref - logp) - (ref - logp) - 1``. Aggregation: token_mean sums
    over the batch's loss tokens and divides by their count; seq_mean averages each sequence then the
    batch; constant divides the sum by ``batch_seqs * constant_divisor`` (Dr.GRPO). ``batch_tokens`` and
    ``batch_seqs`` are the whole batch's totals when this call sees one micro-batch of it (default: this
    call's own), so summed micro-batch losses equal the full-batch loss.
    """
    mask_B_T = mask.to(logprobs.dtype)
    n_tokens = float(mask_B_T.sum())
    old_B_T = old_logprobs.detach()
    ratio_B_T = torch.exp(logprobs - old_B_T)
    adv_B_1 = advantages.to(logprobs.dtype).unsqueeze(1)
    clipped_B_T = ratio_B_T.clamp(1 - clip_low, 1 + clip_high)
    per_token_B_T = -torch.min(ratio_B_T * adv_B_1, clipped_B_T * adv_B_1)
    metrics: dict[str, float] = {}
    if engine_logprobs is not None and tis_cap is not None:
        known_B_T = torch.isfinite(engine_logprobs)
        delta_B_T = torch.where(known_B_T, old_B_T - engine_logprobs, torch.zeros_like(old_B_T))
        weight_B_T = torch.exp(delta_B_T).clamp(max=tis_cap).detach()
        per_token_B_T = per_token_B_T * weight_B_T
        metrics["tis_weight_mean"] = _masked_mean(weight_B_T, mask_B_T)
        metrics["tis_capped_frac"] = _masked_mean((torch.exp(delta_B_T) > tis_cap).to(mask_B_T.dtype), mask_B_T)
        # k3 estimate of KL(engine || trainer) on the engine's own samples (prime-rl's mismatch_kl): how far the
        # policy that sampled (an older version, in an async loop) is from the one being trained.
        metrics["mismatch_kl"] = _masked_mean(torch.exp(delta_B_T) - delta_B_T - 1, mask_B_T)
    if kl_beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs ref_logprobs")
        log_ratio_B_T = ref_logprobs.detach() - logprobs
        kl_B_T = torch.exp(log_ratio_B_T) - log_ratio_B_T - 1
        per_token_B_T = per_token_B_T + kl_beta * kl_B_T
        metrics["kl"] = _masked_mean(kl_B_T, mask_B_T)
    loss = _aggregate(per_token_B_T, mask_B_T, aggregation, constant_divisor, batch_tokens, batch_seqs)
    positive_B_1, negative_B_1 = (adv_B_1 > 0).to(mask_B_T.dtype), (adv_B_1 < 0).to(mask_B_T.dtype)
    metrics |= {
        "clip_frac_low": _masked_mean((ratio_B_T < 1 - clip_low).to(mask_B_T.dtype) * negative_B_1, mask_B_T),
        "clip_frac_high": _masked_mean((ratio_B_T > 1 + clip_high).to(mask_B_T.dtype) * positive_B_1, mask_B_T),
        "ratio_mean": _masked_mean(ratio_B_T, mask_B_T),
        "loss_tokens": n_tokens,
    }
    return loss, metrics


def _masked_mean(x_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> float:
    return float((x_B_T.detach() * mask_B_T).sum() / mask_B_T.sum().clamp(min=1))


def _aggregate(per_token_B_T: torch.Tensor, mask_B_T: torch.Tensor, aggregation: Aggregation,
               constant_divisor: int | None, batch_tokens: float | None, batch_seqs: int | None) -> torch.Tensor:
    masked_B_T = per_token_B_T * mask_B_T
    seqs = batch_seqs if batch_seqs is not None else per_token_B_T.shape[0]
    if aggregation == "token_mean":
        tokens = batch_tokens if batch_tokens is not None else float(mask_B_T.sum())
        return masked_B_T.sum() / max(tokens, 1.0)
    if aggregation == "seq_mean":
        return (masked_B_T.sum(1) / mask_B_T.sum(1).clamp(min=1)).sum() / max(seqs, 1)
    if aggregation == "constant":
        if constant_divisor is None:
            raise ValueError("aggregation 'constant' needs constant_divisor")
        return masked_B_T.sum() / (max(seqs, 1) * constant_divisor)
    raise ValueError(f"unknown aggregation {aggregation!r}")


@torch.no_grad()
def _frozen_logprobs(model: nn.Module, batches: list[Batch], config: GRPOConfig) -> list[torch.Tensor]:
    was_training = model.training
    model.eval()
    try:
        with autocast(model, config):
            return [token_logprobs(model, b.input_ids, b.attention_mask, positions_mask=b.loss_mask > 0,
                                   temperature=config.temperature) for b in batches]
    finally:
        model.train(was_training)


def grpo_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    config: GRPOConfig,
    *,
    pad_id: int,
    ref_model: nn.Module | None = None,
    ranks: Ranks | None = None,
    demos: list[Sample] | None = None,
    replay: ReplayDraw | None = None,
) -> dict[str, float]:
    """One GRPO update on ``samples``; returns a flat metrics dict (``skipped`` 1.0 when no group has signal).

    A group has signal when its rewards vary and its samples do too: token-identical samples whose advantages
    cancel get none (:func:`~spanlab.algos.grpo.advantages.cancel_identical`; ``n_groups_cancelled`` counts the
    groups that lost their signal so), so a step that is not skipped moves the weights.

    With ``ranks`` (a data-parallel update, :mod:`spanlab.training.data_parallel`) every rank gets all the
    samples and computes the same advantages and loss totals (``batch_tokens``, ``batch_seqs``) from the
    whole batch, trains on its shard of the kept samples, and the gradients are summed over ranks before
    clipping: the update equals one process on the whole batch. Metrics are the whole batch's on every rank.
    A sharded model (``ranks.sharded``) needs every rank in each forward and backward: a rank with fewer
    micro-batches than another runs copies of one with a zero weight.

    ``demos`` (with ``config.demonstrations``): demonstration rows whose mean token NLL, times its ``coef``, is
    added to the loss of this update (PPO-ptx); one process only. With ``config.replay``, one rollout of each group
    whose samples all reached ``solved_reward`` (dropped by GRPO) adds ``coef`` x its mean token NLL the same way
    (:mod:`~spanlab.algos.grpo.nll_terms`; ``replay``: the step's seed and level filter); one process only. Both
    ride on a GRPO update: a step with no group with signal trains neither.
    """
    if config.kl_beta > 0 and ref_model is None:
        raise ValueError("kl_beta > 0 needs a ref_model")
    if config.replay is not None and ranks is not None:
        raise ValueError("grpo.replay runs in one trainer process")
    start = time.perf_counter()
    rewards_N = np.array([s.reward for s in samples], dtype=np.float64)
    adv_N = turn_advantages(samples, scale=config.scale_rewards, normalize=config.credit.normalization)
    groups_with_variance = {s.group_id for s, a in zip(samples, adv_N, strict=True) if a != 0}
    adv_N = cancel_identical(samples, adv_N)  # identical samples whose advantages cancel: no gradient, no signal
    groups_with_signal = {s.group_id for s, a in zip(samples, adv_N, strict=True) if a != 0}
    keep = sorted((i for i, s in enumerate(samples) if s.group_id in groups_with_signal), key=lambda i: len(samples[i]))
    metrics: dict[str, float] = {
        "reward_mean": float(rewards_N.mean()) if len(samples) else math.nan,
        "reward_std": float(rewards_N.std()) if len(samples) else math.nan,
        "n_samples": float(len(samples)),
        "n_groups": float(len({s.group_id for s in samples})),
        "n_groups_with_signal": float(len(groups_with_signal)),
        "n_groups_cancelled": float(len(groups_with_variance - groups_with_signal)),
        "n_samples_used": float(len(keep)),
    } | drift_stats(samples)
    replayed = None
    if config.replay is not None:  # nothing drawn without it: a seeded run without replay stays bit-identical
        replayed = replayed_rows(samples, groups_with_signal, config.replay, replay or ReplayDraw())
        metrics["replay_groups_solved"] = float(replayed.groups_solved)
    if not keep:
        logger.info("grpo_step: no group has reward variance among %d samples; no update", len(samples))
        return metrics | {"skipped": 1.0, "peak_rss_mb": peak_rss_mb()}
    kept = [samples[i] for i in keep]
    adv_by_sample = dict(zip(keep, adv_N[keep], strict=True))
    mine = keep if ranks is None else ranks.shard(keep)  # keep is sorted by length: shards hold similar tokens
    device = next(model.parameters()).device
    batches = []  # rows that share a prefix go in one micro-batch, where the prefix runs once (packing.py)
    for chunk in packed_micro_batches([samples[i].input_ids for i in mine], config.micro_batch_tokens):
        rows = [mine[k] for k in chunk]
        batches.append(collate([samples[i] for i in rows], [adv_by_sample[i] for i in rows], pad_id).to(device))
    n_real = len(batches)
    if ranks is not None and (n_pad := ranks.lockstep(n_real) - n_real):
        filler = batches[-1] if batches else collate(kept[:1], [0.0], pad_id).to(device)
        batches += [filler] * n_pad
    batch_tokens = float(sum(int(s.loss_mask.sum()) for s in kept))
    old = _frozen_logprobs(model, batches, config) if config.epochs_per_batch > 1 else None
    ref = _frozen_logprobs(ref_model, batches, config) if config.kl_beta > 0 and ref_model else None
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    sums: dict[str, float] = defaultdict(float)
    total_loss, grad_norm = 0.0, 0.0
    term_metrics: dict[str, float] = {}
    drift_sum, drift_n = 0.0, 0  # |logp_trainer - logp_engine| at the step's start, over aligned trained tokens
    for _epoch in range(config.epochs_per_batch):
        for j, b in enumerate(batches):
            with autocast(model, config):  # the loss and the backward outside it, as torch.autocast advises
                logprobs_B_T = token_logprobs(model, b.input_ids, b.attention_mask, positions_mask=b.loss_mask > 0,
                                              temperature=config.temperature)
            loss, m = policy_loss(
                logprobs_B_T, old[j] if old is not None else logprobs_B_T.detach(), b.advantages, b.loss_mask,
                clip_low=config.clip_low, clip_high=config.clip_high, aggregation=config.aggregation,
                constant_divisor=config.constant_divisor, ref_logprobs=ref[j] if ref is not None else None,
                kl_beta=config.kl_beta, engine_logprobs=b.engine_logprobs, tis_cap=config.tis_cap,
                batch_tokens=batch_tokens, batch_seqs=len(kept),
            )
            if j >= n_real:  # a filler: the sharded model's collectives run, its gradient is zero
                (loss * 0.0).backward()
                continue
            loss.backward()
            total_loss += float(loss.detach())
            if _epoch == 0:
                d_sum, d_n = _logp_drift(logprobs_B_T, b)
                drift_sum, drift_n = drift_sum + d_sum, drift_n + d_n
            for k, v in m.items():  # token-weighted sums, averaged below
                sums[k] += v * m["loss_tokens"] if k != "loss_tokens" else v
        if demos and config.demonstrations is not None:
            nll, n_tokens = nll_term(model, demos, config.demonstrations.coef, config, pad_id, device)
            term_metrics |= {"demo_nll": nll, "demo_tokens": n_tokens, "demo_samples": float(len(demos))}
        if replayed is not None and config.replay is not None:
            nll, n_tokens = nll_term(model, replayed.rows, config.replay.coef, config, pad_id, device)
            term_metrics |= replay_metrics(replayed, nll, n_tokens)
        if ranks is not None:
            ranks.reduce_grads(params)
        grad_norm = _norm_value(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    rss_all_ranks = peak_rss_mb()
    if ranks is not None:  # each rank's sums cover its shard: add them up
        sums, total_loss, drift_sum, drift_n, rss_all_ranks = _sum_over_ranks(sums, total_loss, drift_sum, drift_n)
    elapsed = time.perf_counter() - start
    tokens = sum(len(s) for s in kept)
    weighted = {k: v / max(sums["loss_tokens"], 1.0) for k, v in sums.items() if k != "loss_tokens"}
    return metrics | weighted | {
        "loss": total_loss / config.epochs_per_batch,
        "clip_frac": weighted["clip_frac_low"] + weighted["clip_frac_high"],
        "grad_norm": grad_norm,
        "tokens": float(tokens),
        "loss_tokens": batch_tokens,
        "tokens_per_s": tokens * config.epochs_per_batch / elapsed,
        "step_s": elapsed,
        "skipped": 0.0,
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_mb_all_ranks": rss_all_ranks,
        "drift_logp_abs_diff": drift_sum / drift_n if drift_n else math.nan,
    } | term_metrics


def _norm_value(norm: torch.Tensor) -> float:
    """A gradient norm as a float; over sharded gradients it is a DTensor, made whole first."""
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def _sum_over_ranks(sums: dict[str, float], loss: float, drift_sum: float,
                    drift_n: int) -> tuple[dict[str, float], float, float, int, float]:
    """The whole batch's metric sums from every rank's (a rank with no samples sent none), and the ranks'
    peak memory added up (what the update costs the machine)."""
    per_rank = gather((dict(sums), loss, drift_sum, drift_n, peak_rss_mb()))
    total: dict[str, float] = defaultdict(float)
    loss, drift_sum, drift_n, rss = 0.0, 0.0, 0, 0.0
    for rank_sums, rank_loss, rank_drift_sum, rank_drift_n, rank_rss in per_rank:
        for k, v in rank_sums.items():
            total[k] += v
        loss, drift_sum, drift_n = loss + rank_loss, drift_sum + rank_drift_sum, drift_n + rank_drift_n
        rss += rank_rss
    return total, loss, drift_sum, drift_n, rss


def _logp_drift(logprobs_B_T: torch.Tensor, batch: Batch) -> tuple[float, int]:
    """(sum, count) of |trainer - engine| logprob over trained tokens with an aligned engine logprob."""
    if batch.sampled_logprobs is None:
        return 0.0, 0
    known_B_T = (batch.loss_mask > 0) & torch.isfinite(batch.sampled_logprobs)
    diff_N = (logprobs_B_T.detach() - batch.sampled_logprobs)[known_B_T].abs()
    return float(diff_N.sum()), int(diff_N.numel())
