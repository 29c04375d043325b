"""Spans -> a reward-filtered dataset on the exact token IDs the engine read and sampled: what SFT rounds train
on, and the filter the per-role warm start applies to mined demonstrations (:mod:`spanlab.adapters.role_demos`).

Rejection-sampling fine-tuning: of the samples the sample rule allows (:mod:`spanlab.adapters.trainable`: ``ok``
calls of finished attempts, each with its attempt's final reward; failed attempts are always dropped here), keep
the rollouts that earned a reward (``threshold``), the best fraction of
each task's group (``top_frac``) or the best ``n`` per task (``best_of_n``), drop exact duplicates, and train
on the sampled tokens only. The IDs come from ``iter_samples`` unchanged (no re-tokenization, so no drift);
``labels`` are the IDs where the TITO loss mask is 1 and -100 elsewhere (prompts, tool results), the format
Hugging Face causal-LM losses expect. Optional per-example weights: the reward, or the group-relative
advantage clipped at 0 (a success on a hard task counts more than one on a task every rollout solved).

Left out: packing, truncation (``max_len`` drops, never cuts: a cut session would train on half a turn),
near-duplicate detection (only byte-identical ``(input_ids, loss_mask)`` pairs are duplicates).

    table, stats = build_sft_dataset(store, rollout_ids, FilterConfig(rule="best_of_n", n=2))
    write_dataset(table, "runs/sft.parquet"); rows = rows_from_table(table)  # or as_hf_dataset(table)
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.samples import Sample
from spanlab.adapters.trainable import Dropped
from spanlab.store.base import StoreAPI

__all__ = ["SFT_SCHEMA", "FilterConfig", "FilterStats", "as_hf_dataset", "build_sft_dataset", "filter_samples",
           "read_dataset", "rows_from_table", "to_table", "write_dataset"]

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # the label Hugging Face / torch cross-entropy skips
SFT_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("labels", pa.list_(pa.int32())),
    ("attention_mask", pa.list_(pa.int8())),
    ("weight", pa.float32()),
    ("reward", pa.float32()),
    ("rollout_id", pa.string()),
    ("group_id", pa.string()),
    ("span_ids", pa.list_(pa.string())),
])


class FilterConfig(BaseModel):
    """Which samples become SFT examples. ``min_reward`` is a floor under every rule: a task where nothing
    succeeded contributes nothing, even to ``top_frac`` or ``best_of_n``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: Literal["threshold", "top_frac", "best_of_n"] = Field(default="threshold", description="threshold: "
                                                                "every sample at min_reward or above")
    min_reward: float = Field(default=1.0, description="the floor under every rule")
    top_frac: float = Field(default=0.5, gt=0, le=1, description="top_frac: keep the best ceil(frac * n) per group")
    n: int = Field(default=1, ge=1, description="best_of_n: keep the best n per group")
    dedupe: bool = Field(default=True, description="one example per distinct token sequence")
    weighting: Literal["none", "reward", "advantage"] = Field(default="none", description="how examples weigh "
                                                              "in the loss")
    max_len: int | None = Field(default=None, ge=1, description="drop (not cut) longer samples")

    @model_validator(mode="after")
    def _weights_not_negative(self) -> FilterConfig:
        if self.weighting == "reward" and self.min_reward < 0:
            raise ValueError("weighting 'reward' needs min_reward >= 0: a negative weight would unlearn an example")
        return self


@dataclass
class FilterStats:
    """What happened to each sample seen: ``seen == kept + the five dropped_* counts``.

    ``dropped_rank``: above the floor but outside its group's ``top_frac`` / ``best_of_n`` quota.
    """

    seen: int = 0
    groups: int = 0
    kept: int = 0
    dropped_reward: int = 0
    dropped_rank: int = 0
    dropped_duplicate: int = 0
    dropped_too_long: int = 0
    dropped_no_tokens: int = 0
    mean_reward_seen: float | None = None
    mean_reward_kept: float | None = None

    def metrics(self) -> dict[str, float]:
        """One flat, namespaced dict for logs and ``train_metrics``; None means are left out."""
        return {f"filter_{k}": float(v) for k, v in vars(self).items() if v is not None}


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _reward_key(reward: float) -> float:
    """NaN rewards rank last and never pass a floor."""
    return -math.inf if math.isnan(reward) else reward


def _fingerprint(s: Sample) -> bytes:
    """Hash of the exact IDs and mask: the same tokens trained differently are not duplicates."""
    ids, mask = np.ascontiguousarray(s.input_ids, np.int32), np.ascontiguousarray(s.loss_mask, np.uint8)
    return hashlib.blake2b(len(ids).to_bytes(8, "little") + ids.tobytes() + mask.tobytes(), digest_size=16).digest()


def _quota(config: FilterConfig, group_size: int) -> int:
    rules = {"threshold": group_size, "top_frac": math.ceil(config.top_frac * group_size), "best_of_n": config.n}
    return rules[config.rule]


def filter_samples(samples: Iterable[Sample], config: FilterConfig) -> tuple[list[tuple[Sample, float]], FilterStats]:
    """The kept samples with their weights, in input order, and the counts of what was dropped and why.

    Consumes the iterable: a group's ranking needs all its samples (SFT sets are small). Per group, samples
    are ranked by reward, then rollout_id and first span ID (deterministic ties); going down the ranking,
    a sample is dropped below ``min_reward``, as a duplicate of one already kept (so duplicates do not eat
    a group's quota), or once the quota is full. The group size behind ``top_frac`` counts the group's
    trainable samples (with sampled tokens, within ``max_len``), failures included.
    """
    all_N = list(samples)
    stats = FilterStats(seen=len(all_N), mean_reward_seen=_mean([s.reward for s in all_N]))
    by_group: dict[str, list[int]] = defaultdict(list)
    rewards_by_group: dict[str, list[float]] = defaultdict(list)
    for i, s in enumerate(all_N):
        rewards_by_group[s.group_id].append(s.reward)
        if len(s.loss_mask) != len(s.input_ids):
            raise ValueError(f"sample of rollout {s.rollout_id}: {len(s.input_ids)} IDs but {len(s.loss_mask)} mask")
        if not np.any(s.loss_mask):
            stats.dropped_no_tokens += 1
        elif config.max_len is not None and len(s) > config.max_len:
            stats.dropped_too_long += 1
        else:
            by_group[s.group_id].append(i)
    stats.groups = len(rewards_by_group)

    kept_idx: list[int] = []
    fingerprints: set[bytes] = set()
    for group_id in sorted(by_group):  # sorted: which copy of a cross-group duplicate survives is deterministic
        pool = by_group[group_id]
        ranked = sorted(pool, key=lambda i: (-_reward_key(all_N[i].reward), all_N[i].rollout_id,
                                             all_N[i].span_ids[:1], i))
        quota, taken = _quota(config, len(pool)), 0
        for i in ranked:
            s = all_N[i]
            if not _reward_key(s.reward) >= config.min_reward:
                stats.dropped_reward += 1
                continue
            fp = _fingerprint(s) if config.dedupe else b""
            if config.dedupe and fp in fingerprints:
                stats.dropped_duplicate += 1
            elif taken >= quota:
                stats.dropped_rank += 1
            else:
                fingerprints.add(fp)
                kept_idx.append(i)
                taken += 1
    kept_idx.sort()

    kept_K = [all_N[i] for i in kept_idx]
    weights_K = _weights(kept_K, config, {g: float(np.mean(r)) for g, r in rewards_by_group.items()})
    stats.kept = len(kept_K)
    stats.mean_reward_kept = _mean([s.reward for s in kept_K])
    return list(zip(kept_K, weights_K, strict=True)), stats


def _weights(kept_K: Sequence[Sample], config: FilterConfig, group_mean: dict[str, float]) -> list[float]:
    """1, the reward, or max(reward - group mean, 0) scaled to mean 1 over the kept examples.

    The group mean is over every sample the group had (failures included): the GRPO baseline, i.e. how
    hard the task was. If every kept advantage is 0 (each task solved every time) the weights fall back to 1.
    """
    if config.weighting == "none":
        return [1.0] * len(kept_K)
    if config.weighting == "reward":
        return [float(s.reward) for s in kept_K]
    adv_K = [max(s.reward - group_mean[s.group_id], 0.0) for s in kept_K]
    total = sum(adv_K)
    if total <= 0:
        if kept_K:
            logger.warning("advantage weighting: every kept example has advantage 0; using weight 1")
        return [1.0] * len(kept_K)
    return [a * len(adv_K) / total for a in adv_K]


def _list_array(arrays: Sequence[np.ndarray], dtype: pa.DataType) -> pa.ListArray:
    """One list column from numpy rows, through offsets (no Python lists of tokens)."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    values_arrow = pa.array(values.astype(dtype.to_pandas_dtype()), type=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), values_arrow, type=pa.list_(dtype))


def to_table(kept: Sequence[tuple[Sample, float]]) -> pa.Table:
    """The examples as an Arrow table (``SFT_SCHEMA``): labels are the IDs on sampled tokens, -100 elsewhere."""
    ids_K = [np.asarray(s.input_ids, dtype=np.int32) for s, _ in kept]
    labels_K = [np.where(np.asarray(s.loss_mask).astype(bool), ids, np.int32(IGNORE_INDEX)).astype(np.int32)
                for (s, _), ids in zip(kept, ids_K, strict=True)]
    columns = [
        _list_array(ids_K, pa.int32()),
        _list_array(labels_K, pa.int32()),
        _list_array([np.ones(len(ids), dtype=np.int8) for ids in ids_K], pa.int8()),
        pa.array([w for _, w in kept], type=pa.float32()),
        pa.array([s.reward for s, _ in kept], type=pa.float32()),
        pa.array([s.rollout_id for s, _ in kept], type=pa.string()),
        pa.array([s.group_id for s, _ in kept], type=pa.string()),
        pa.array([list(s.span_ids) for s, _ in kept], type=pa.list_(pa.string())),
    ]
    return pa.Table.from_arrays(columns, schema=SFT_SCHEMA)


def write_dataset(table: pa.Table, path: str | Path) -> Path:
    """Write the table as one Parquet file (``datasets.load_dataset("parquet", data_files=...)`` reads it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def read_dataset(path: str | Path) -> pa.Table:
    """Read a dataset written by ``write_dataset``, cast to ``SFT_SCHEMA`` (column types exactly as written)."""
    return pq.read_table(path).cast(SFT_SCHEMA)


def as_hf_dataset(table: pa.Table) -> Any:
    """The table as a ``datasets.Dataset`` (zero-copy). ``datasets`` is optional: not a spanlab dependency."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError("as_hf_dataset needs the Hugging Face `datasets` package: pip install datasets "
                          "(or use the Arrow table / rows_from_table directly)") from exc
    return datasets.Dataset(table)


def rows_from_table(table: pa.Table) -> list[dict[str, Any]]:
    """Python rows ``{"input_ids", "labels", "weight"}`` for trainers that take lists."""
    cols = table.select(["input_ids", "labels", "weight"]).to_pydict()
    return [{"input_ids": ids, "labels": labels, "weight": weight}
            for ids, labels, weight in zip(cols["input_ids"], cols["labels"], cols["weight"], strict=True)]


def build_sft_dataset(store: StoreAPI, rollout_ids: Sequence[str], config: FilterConfig, *,
                      dropped: Dropped | None = None, **sample_kwargs: Any) -> tuple[pa.Table, FilterStats]:
    """Read the rollouts' samples (``sample_kwargs`` go to ``iter_samples``: group_key, agents, ...), filter, table.

    ``dropped`` counts what the sample rule left out before the filter saw it (a round's ``dropped_*`` metrics)."""
    dropped = dropped if dropped is not None else Dropped()
    kept, stats = filter_samples(iter_samples(store, rollout_ids, dropped=dropped, **sample_kwargs), config)
    logger.info("SFT dataset: kept %d of %d samples in %d groups (dropped: reward %d, rank %d, duplicate %d, "
                "too long %d, no tokens %d; before the filter: %d error spans, %d failed and %d unrewarded "
                "attempts)", stats.kept, stats.seen, stats.groups, stats.dropped_reward, stats.dropped_rank,
                stats.dropped_duplicate, stats.dropped_too_long, stats.dropped_no_tokens, dropped.error_spans,
                dropped.failed_attempts, dropped.unrewarded_attempts)
    return to_table(kept), stats
