"""Spans -> SFT dataset: reward filters per task group, dedupe, weights, exact IDs and labels, Parquet, real store."""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spanlab.adapters.filtered_dataset import (
    SFT_SCHEMA,
    FilterConfig,
    as_hf_dataset,
    build_sft_dataset,
    filter_samples,
    read_dataset,
    rows_from_table,
    to_table,
    write_dataset,
)
from spanlab.adapters.samples import Sample
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Span, reward_span


def _s(rid: str, group: str, reward: float, ids: list[int] | None = None, mask: list[int] | None = None) -> Sample:
    """A hand-built sample; by default its IDs spell the rollout ID (distinct per rollout), loss on the last two."""
    ids = ids if ids is not None else [len(rid), *(ord(c) for c in rid), 7]
    mask = mask if mask is not None else [0] * (len(ids) - 2) + [1, 1]
    return Sample(rid, group, np.array(ids, np.int32), np.array(mask, np.uint8), np.zeros(len(ids), np.float32),
                  reward, [f"sp-{rid}"])


def _kept_ids(kept: list[tuple[Sample, float]]) -> list[str]:
    return [s.rollout_id for s, _ in kept]


def test_threshold_keeps_rewards_at_or_above_min_reward() -> None:
    samples = [_s("a", "g1", 1.0), _s("b", "g1", 0.0), _s("c", "g2", 1.0), _s("d", "g2", 0.5)]
    kept, stats = filter_samples(samples, FilterConfig())
    assert _kept_ids(kept) == ["a", "c"] and [w for _, w in kept] == [1.0, 1.0]
    assert (stats.seen, stats.groups, stats.kept, stats.dropped_reward) == (4, 2, 2, 2)
    assert stats.mean_reward_seen == pytest.approx(0.625) and stats.mean_reward_kept == 1.0
    kept, _ = filter_samples(samples, FilterConfig(min_reward=0.5))
    assert _kept_ids(kept) == ["a", "c", "d"]  # input order, not rank order


def test_top_frac_per_group_breaks_ties_by_rollout_id() -> None:
    group_a = [_s("a3", "A", 1.0), _s("a1", "A", 1.0), _s("a2", "A", 1.0), _s("a0", "A", 0.0), _s("a4", "A", 1.0)]
    group_b = [_s("b1", "B", 0.2), _s("b0", "B", 0.5)]
    kept, stats = filter_samples(group_a + group_b, FilterConfig(rule="top_frac", top_frac=0.5, min_reward=0.0))
    # A: ceil(0.5 * 5) = 3 of the four tied 1.0s, lowest rollout IDs; B: ceil(0.5 * 2) = 1, the best
    assert _kept_ids(kept) == ["a3", "a1", "a2", "b0"]
    assert (stats.kept, stats.dropped_rank, stats.dropped_reward) == (4, 3, 0)
    again, _ = filter_samples(list(reversed(group_a + group_b)), FilterConfig(rule="top_frac", min_reward=0.0))
    assert sorted(_kept_ids(again)) == sorted(_kept_ids(kept))


def test_best_of_n_keeps_the_best_n_per_group() -> None:
    samples = [_s("x1", "X", 0.3), _s("x2", "X", 0.9), _s("x3", "X", 0.6), _s("y1", "Y", 0.1), _s("y2", "Y", 0.1)]
    kept, stats = filter_samples(samples, FilterConfig(rule="best_of_n", n=2, min_reward=0.0))
    assert _kept_ids(kept) == ["x2", "x3", "y1", "y2"] and stats.dropped_rank == 1
    kept, _ = filter_samples(samples, FilterConfig(rule="best_of_n", n=1, min_reward=0.0))
    assert _kept_ids(kept) == ["x2", "y1"]  # y1 and y2 tie: the lower rollout ID


@pytest.mark.parametrize("rule", ["top_frac", "best_of_n"])
def test_min_reward_is_a_floor_a_group_with_no_success_contributes_nothing(rule: str) -> None:
    samples = [_s("f1", "F", 0.0), _s("f2", "F", 0.0), _s("f3", "F", 0.0), _s("s1", "S", 0.0), _s("s2", "S", 1.0)]
    kept, stats = filter_samples(samples, FilterConfig(rule=rule, top_frac=1.0, n=3))
    assert _kept_ids(kept) == ["s2"]
    assert (stats.dropped_reward, stats.dropped_rank, stats.groups) == (4, 0, 2)


def test_nan_rewards_rank_last_and_never_pass_the_floor() -> None:
    kept, stats = filter_samples([_s("n", "G", math.nan), _s("o", "G", 0.0)],
                                 FilterConfig(rule="best_of_n", n=1, min_reward=-1.0))
    assert _kept_ids(kept) == ["o"] and stats.dropped_reward == 1


def test_dedupe_drops_identical_ids_and_mask_without_eating_the_quota() -> None:
    same = dict(ids=[5, 6, 7, 8], mask=[0, 0, 1, 1])
    samples = [_s("d2", "G", 1.0, **same), _s("d1", "G", 1.0, **same), _s("c", "G", 1.0),
               _s("m", "G", 1.0, ids=[5, 6, 7, 8], mask=[0, 1, 1, 1])]  # same IDs, other mask: not a duplicate
    kept, stats = filter_samples(samples, FilterConfig(rule="best_of_n", n=3))
    assert _kept_ids(kept) == ["d1", "c", "m"] and stats.dropped_duplicate == 1 and stats.dropped_rank == 0
    kept, stats = filter_samples(samples, FilterConfig(dedupe=False))
    assert len(kept) == 4 and stats.dropped_duplicate == 0
    # across groups: the first group in sorted order keeps its copy
    kept, stats = filter_samples([_s("z", "Z", 1.0, **same), _s("y", "A", 1.0, **same)], FilterConfig())
    assert _kept_ids(kept) == ["y"] and stats.dropped_duplicate == 1


def test_weighting_none_reward_and_clipped_normalised_advantage() -> None:
    samples = [_s("a1", "A", 1.0), _s("a2", "A", 0.0), _s("a3", "A", 0.0), _s("a4", "A", 1.0),  # mean 0.5
               _s("b1", "B", 1.0), _s("b2", "B", 1.0),  # mean 1: every rollout solved it, advantage 0
               _s("c1", "C", 0.0), _s("c2", "C", 1.0), _s("c3", "C", 0.0), _s("c4", "C", 0.0)]  # mean 0.25
    kept, _ = filter_samples(samples, FilterConfig(weighting="none"))
    assert {s.rollout_id: w for s, w in kept} == dict.fromkeys(["a1", "a4", "b1", "b2", "c2"], 1.0)
    kept, _ = filter_samples(samples, FilterConfig(weighting="advantage"))
    # advantages 0.5, 0.5, 0, 0, 0.75: mean 0.35 -> weights adv / 0.35
    weights = {s.rollout_id: w for s, w in kept}
    assert weights == pytest.approx({"a1": 0.5 / 0.35, "a4": 0.5 / 0.35, "b1": 0.0, "b2": 0.0, "c2": 0.75 / 0.35})
    assert np.mean(list(weights.values())) == pytest.approx(1.0)
    kept, _ = filter_samples([_s("r1", "R", 0.5), _s("r2", "R", 0.25), _s("r3", "R", 0.1)],
                             FilterConfig(weighting="reward", min_reward=0.2))
    assert [w for _, w in kept] == [0.5, 0.25]
    kept, _ = filter_samples([_s("b1", "B", 1.0), _s("b2", "B", 1.0)], FilterConfig(weighting="advantage"))
    assert [w for _, w in kept] == [1.0, 1.0]  # all advantages 0: fall back to 1


def test_max_len_and_samples_without_sampled_tokens_are_dropped_before_ranking() -> None:
    long = _s("a", "G", 1.0, ids=list(range(1, 9)), mask=[0] * 6 + [1, 1])
    empty = _s("b", "G", 1.0, ids=[1, 2, 3], mask=[0, 0, 0])
    ok = _s("c", "G", 0.5, ids=[4, 5, 6, 7, 8], mask=[0, 0, 0, 1, 1])
    kept, stats = filter_samples([long, empty, ok], FilterConfig(rule="best_of_n", n=1, min_reward=0.0, max_len=5))
    assert _kept_ids(kept) == ["c"]
    assert (stats.dropped_too_long, stats.dropped_no_tokens, stats.dropped_rank) == (1, 1, 0)


def test_config_is_strict() -> None:
    with pytest.raises(ValidationError, match="extra"):
        FilterConfig(rulez="threshold")  # type: ignore[call-arg]
    for bad in ({"top_frac": 0.0}, {"top_frac": 1.5}, {"n": 0}, {"rule": "best"}, {"max_len": 0},
                {"weighting": "reward", "min_reward": -1.0}):
        with pytest.raises(ValidationError):
            FilterConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        FilterConfig().n = 2  # type: ignore[misc]  # frozen


def test_labels_are_ids_on_sampled_tokens_and_minus_100_elsewhere() -> None:
    samples = [_s("a", "G", 1.0, ids=[11, 12, 13, 14, 15, 16], mask=[0, 0, 1, 0, 1, 1]), _s("b", "G", 1.0)]
    table = to_table(filter_samples(samples, FilterConfig())[0])
    assert table.schema.equals(SFT_SCHEMA)
    row = table.to_pylist()[0]
    assert row["input_ids"] == [11, 12, 13, 14, 15, 16]
    assert row["labels"] == [-100, -100, 13, -100, 15, 16]
    assert row["attention_mask"] == [1] * 6 and row["span_ids"] == ["sp-a"]
    for s, ids, labels in zip(samples, table["input_ids"].to_pylist(), table["labels"].to_pylist(), strict=True):
        assert ids == s.input_ids.tolist()
        assert [lab == -100 for lab in labels] == [m == 0 for m in s.loss_mask.tolist()]
    assert rows_from_table(table)[0] == {"input_ids": row["input_ids"], "labels": row["labels"], "weight": 1.0}
    assert to_table([]).num_rows == 0 and to_table([]).schema.equals(SFT_SCHEMA)


def test_parquet_round_trip_is_identical(tmp_path: Path) -> None:
    kept, _ = filter_samples([_s("a", "G", 1.0), _s("b", "H", 0.75)], FilterConfig(min_reward=0.5, weighting="reward"))
    table = to_table(kept)
    path = write_dataset(table, tmp_path / "sub" / "sft.parquet")
    back = read_dataset(path)
    assert back.schema.equals(SFT_SCHEMA) and back.equals(table)


def test_as_hf_dataset_needs_datasets() -> None:
    table = to_table(filter_samples([_s("a", "G", 1.0)], FilterConfig())[0])
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(ImportError, match="pip install datasets"):
            as_hf_dataset(table)
    else:
        assert len(as_hf_dataset(table)) == 1


_sample_st = st.builds(
    lambda rid, group, reward, toks: _s(rid, group, reward, ids=[t for t, _ in toks], mask=[m for _, m in toks]),
    st.sampled_from(["r0", "r1", "r2", "r3"]), st.sampled_from(["g0", "g1", "g2"]),
    st.sampled_from([0.0, 0.5, 1.0]), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1)), max_size=6),
)
_config_st = st.builds(
    FilterConfig, rule=st.sampled_from(["threshold", "top_frac", "best_of_n"]),
    min_reward=st.sampled_from([0.0, 0.5, 1.0]), top_frac=st.floats(0.01, 1.0), n=st.integers(1, 3),
    dedupe=st.booleans(), weighting=st.sampled_from(["none", "reward", "advantage"]),
    max_len=st.none() | st.integers(1, 6),
)


@settings(max_examples=150, deadline=None)
@given(samples=st.lists(_sample_st, max_size=14), config=_config_st)
def test_filter_properties(samples: list[Sample], config: FilterConfig) -> None:
    kept, stats = filter_samples(samples, config)
    kept_S = [s for s, _ in kept]
    assert len({id(s) for s in kept_S}) == len(kept_S) and {id(s) for s in kept_S} <= {id(s) for s in samples}
    assert stats.seen == len(samples) == stats.kept + stats.dropped_reward + stats.dropped_rank \
        + stats.dropped_duplicate + stats.dropped_too_long + stats.dropped_no_tokens
    seen_per_group, kept_per_group = Counter(s.group_id for s in samples), Counter(s.group_id for s in kept_S)
    for group, count in kept_per_group.items():
        limit = {"threshold": seen_per_group[group], "best_of_n": config.n,
                 "top_frac": math.ceil(config.top_frac * seen_per_group[group])}[config.rule]
        assert count <= limit
    for s in kept_S:
        assert s.reward >= config.min_reward and s.loss_mask.any()
        assert config.max_len is None or len(s) <= config.max_len
    if config.dedupe:
        assert len({(s.input_ids.tobytes(), s.loss_mask.tobytes()) for s in kept_S}) == len(kept_S)
    weights = [w for _, w in kept]
    assert all(w >= 0 for w in weights)
    if config.weighting == "advantage" and kept:
        assert np.mean(weights) == pytest.approx(1.0)
    table = to_table(kept)
    ids, labels, attn = (table[c].to_pylist() for c in ("input_ids", "labels", "attention_mask"))
    for s, row_ids, row_labels, row_attn in zip(kept_S, ids, labels, attn, strict=True):
        assert row_ids == s.input_ids.tolist() and len(row_labels) == len(row_ids) == len(row_attn)
        assert row_labels == [t if m else -100 for t, m in zip(row_ids, s.loss_mask.tolist(), strict=True)]


# --- through a real DuckDB store file ------------------------------------------------------------
def _tito_rollout(store: SpanStore, task: dict, reward: float, base: int) -> tuple[str, list[int], list[int]]:
    """One TITO session of two calls with a tool result between them; returns (rollout_id, ids, mask)."""
    rollout = store.enqueue_one(task)
    got = store.dequeue(worker_id="w")
    assert got is not None and got[0].rollout_id == rollout.rollout_id
    prompt, turn1, tool, turn2 = [base, base + 1, base + 2], [base + 10, base + 11], [base + 20, base + 21], [base + 12]

    def call(p: list[int], r: list[int], mask: list[int]) -> Span:
        return Span(rollout_id=rollout.rollout_id, attempt_id=got[1].attempt_id, name="chat", kind="llm_call",
                    llm=LLMCall(model="m", prompt_token_ids=p, response_token_ids=r,
                                response_logprobs=[-0.1] * len(r), loss_mask=mask))

    mask1 = [0, 0, 0, 1, 1]
    mask2 = [*mask1, 0, 0, 1]
    store.add_spans([call(prompt, turn1, mask1), call([*prompt, *turn1, *tool], turn2, mask2),
                     reward_span(rollout.rollout_id, got[1].attempt_id, reward)])
    store.finish_attempt(got[1].attempt_id, "succeeded")
    return rollout.rollout_id, [*prompt, *turn1, *tool, *turn2], mask2


def test_build_sft_dataset_from_a_store_keeps_the_rewarded_sessions_exact_ids(tmp_path: Path, any_store) -> None:
    with any_store as store:
        runs = [_tito_rollout(store, {"task_id": group}, reward, base=1000 * (i + 1))
                for i, (group, reward) in enumerate([("A", 1.0), ("A", 0.0), ("B", 0.0), ("B", 1.0), ("B", 1.0)])]
        rollout_ids = [rid for rid, _, _ in runs]
        table, stats = build_sft_dataset(store, rollout_ids, FilterConfig(), batch_rows=1)
        assert (stats.seen, stats.groups, stats.kept, stats.dropped_reward) == (5, 2, 3, 2)
        expected = {rid: (ids, mask) for (rid, ids, mask), r in zip(runs, [1, 0, 0, 1, 1], strict=True) if r}
        assert sorted(table.column("rollout_id").to_pylist()) == sorted(expected)  # the store's read order
        assert sorted(table.column("group_id").to_pylist()) == ["A", "B", "B"]
        for row in table.to_pylist():
            ids, mask = expected[row["rollout_id"]]
            assert row["input_ids"] == ids and len(row["span_ids"]) == 2
            # prompt and the tool result (mask 0 inside the session) are -100; both sampled turns are labels
            assert row["labels"] == [t if m else -100 for t, m in zip(ids, mask, strict=True)]
            assert row["labels"][5:7] == [-100, -100] and row["labels"][-1] == ids[-1]
        best, stats = build_sft_dataset(store, rollout_ids, FilterConfig(rule="best_of_n", n=1, min_reward=0.0))
        assert sorted(best.column("rollout_id").to_pylist()) == sorted([runs[0][0], min(runs[3][0], runs[4][0])])
        assert stats.dropped_rank == 3
        assert read_dataset(write_dataset(table, tmp_path / "sft.parquet")).equals(table)
        assert table.schema.equals(SFT_SCHEMA) and isinstance(table, pa.Table)
