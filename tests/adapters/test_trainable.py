"""The sample rule (spanlab/adapters/trainable.py) on both store kinds, with spans written through the store API.

One group of four rollouts as they end in a real run: a call the agent abandoned then retried (the error span
written after the retry, as the gateway does), an attempt that failed after a call, one that timed out after an
intermediate reward, one still running. GRPO and SFT's filtering read exactly the retry; the drops are counted;
``failed_attempts: {reward: R}`` keeps the ended ones on R; the views and APO's readers agree. The same cases
through a real gateway, vLLM and runner are in test_trainable_vllm.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spanlab.adapters.credit import CreditConfig, turn_rewards
from spanlab.adapters.filtered_dataset import FilterConfig, build_sft_dataset
from spanlab.adapters.messages import conversations
from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.trainable import Dropped, KeepFailed, final_index, final_mark, final_rewards, trainable_rollouts
from spanlab.algos.grpo.config import GRPOSection
from spanlab.errors import InvalidSpanError
from spanlab.store import StoreAPI
from spanlab.types import Span, reward_span
from tests.conftest import llm_span

DISCONNECTED = {"error": {"type": "client_disconnected", "message": "the agent closed the stream before it ended"}}


def _rollout(store: StoreAPI, case: str) -> tuple[str, str]:
    store.enqueue_one({"task_id": "t", "case": case})
    got = store.dequeue(worker_id="w")
    assert got is not None
    return got[0].rollout_id, got[1].attempt_id


def _group(store: StoreAPI) -> dict[str, tuple[str, str, list[Span]]]:
    """``case -> (rollout_id, attempt_id, its ok calls)`` of one task's four rollouts (module docstring)."""
    out = {}
    for i, case in enumerate(("retry", "failed", "timeout", "running")):
        rid, aid = _rollout(store, case)
        got = store.last_attempts([rid])[0]
        call = llm_span(*got, seed=10 * i)
        if case == "retry":
            retry = llm_span(*got, seed=10 * i + 1)
            cut = llm_span(*got, seed=10 * i + 2, n_resp=6, status="error", attributes=DISCONNECTED)
            cut.llm.response_message = {"role": "assistant", "content": "hel"}  # truncated
            store.add_spans([retry, cut])  # the cut stream's span lands after the retry's
            store.finish_attempt(aid, "succeeded", [reward_span(rid, aid, 1.0, final=True)])
            out[case] = (rid, aid, [retry])
            continue
        store.add_spans([call])
        if case == "failed":
            store.finish_attempt(aid, "failed")
        elif case == "timeout":
            store.add_spans([reward_span(rid, aid, 1.0, name="check.verdict", final=False)])
            store.finish_attempt(aid, "timeout")
        out[case] = (rid, aid, [call])
    return out


def test_grpo_reads_only_the_finished_attempts_ok_calls_and_counts_the_rest(
        any_store: StoreAPI, caplog: pytest.LogCaptureFixture) -> None:
    group = _group(any_store)
    ids = [rid for rid, _, _ in group.values()]
    dropped = Dropped()
    with caplog.at_level(logging.WARNING, logger="spanlab.adapters.trainable"):
        samples = list(iter_samples(any_store, ids, dropped=dropped))
    assert [(s.rollout_id, s.span_ids, s.reward) for s in samples] == [
        (group["retry"][0], [group["retry"][2][0].span_id], 1.0)]
    assert dropped.metrics() == {"dropped_error_spans": 1.0, "dropped_failed_attempts": 2.0,
                                 "dropped_unfinished_attempts": 1.0, "dropped_unrewarded_attempts": 0.0,
                                 "dropped_no_attempt": 0.0, "dropped_empty_samples": 0.0,
                                 "kept_failed_attempts": 0.0}
    assert "group t: 3 of its 4 rollouts give no sample" in caplog.text
    assert "(failed attempt: 2, unfinished attempt: 1)" in caplog.text


def test_failed_attempts_are_kept_only_under_the_switch_and_only_on_its_reward(any_store: StoreAPI) -> None:
    group = _group(any_store)
    ids = [rid for rid, _, _ in group.values()]
    dropped = Dropped()
    keep = GRPOSection.model_validate({"failed_attempts": {"reward": -0.5}}).failed_attempts
    assert keep == KeepFailed(reward=-0.5)
    samples = {s.rollout_id: (s.span_ids, s.reward) for s in iter_samples(any_store, ids, failed_attempts=keep,
                                                                        dropped=dropped)}
    assert samples == {rid: ([c.span_id for c in calls], 1.0 if case == "retry" else -0.5)
                       for case, (rid, _, calls) in group.items() if case != "running"}
    assert (dropped.kept_failed_attempts, dropped.failed_attempts, dropped.unfinished_attempts) == (2, 0, 1)
    # per-turn credit would pay the timed-out attempt for its verdict: a kept failed attempt takes R whatever it read
    per_turn = {s.rollout_id: s.reward for s in iter_samples(any_store, ids, failed_attempts=keep,
                                                             credit=CreditConfig(mode="per_turn"))}
    assert per_turn[group["timeout"][0]] == -0.5
    assert GRPOSection().failed_attempts == "drop"
    with pytest.raises(ValueError, match="failed_attempts"):
        GRPOSection.model_validate({"failed_attempts": "keep"})


def test_sft_filtering_sees_the_same_samples(any_store: StoreAPI) -> None:
    group = _group(any_store)
    ids = [rid for rid, _, _ in group.values()]
    dropped = Dropped()
    # min_reward 1.0: the timed-out attempt's verdict (1.0) would pass it, were it read as the final reward
    table, stats = build_sft_dataset(any_store, ids, FilterConfig(min_reward=1.0, dedupe=False), dropped=dropped)
    assert table["span_ids"].to_pylist() == [[group["retry"][2][0].span_id]]
    assert (stats.seen, stats.kept) == (1, 1)
    assert (dropped.error_spans, dropped.failed_attempts, dropped.unfinished_attempts) == (1, 2, 1)
    everything, _ = build_sft_dataset(any_store, ids, FilterConfig(min_reward=-1.0))
    assert everything["span_ids"].to_pylist() == [[group["retry"][2][0].span_id]]


def test_views_credit_and_apo_readers_apply_the_same_rule(any_store: StoreAPI) -> None:
    group = _group(any_store)
    ids = [rid for rid, _, _ in group.values()]
    finals = {s.rollout_id: s.final_reward for s in any_store.rollout_summaries(ids)}
    assert finals == {group["retry"][0]: 1.0, group["failed"][0]: None, group["timeout"][0]: None,
                      group["running"][0]: None}
    marks = any_store.query("SELECT name, final FROM rewards ORDER BY name").to_pylist()
    assert marks == [{"name": "check.verdict", "final": False}, {"name": "reward", "final": True}]
    role = any_store.query("SELECT final_rewards, intermediate_rewards FROM role_summary").to_pylist()
    assert role == [{"final_rewards": 1, "intermediate_rewards": 1}]  # the verdict stays intermediate
    assert trainable_rollouts(any_store, ids) == {group["retry"][0]}
    convs = conversations(any_store, ids)
    assert convs[group["timeout"][0]].reward is None and convs[group["retry"][0]].reward == 1.0
    retry_call = group["retry"][2][0]
    assert convs[group["retry"][0]].messages[-1] == retry_call.llm.response_message  # not the cut stream's
    turns = turn_rewards(any_store, ids, CreditConfig())
    assert [(t.span_id, t.reward) for t in turns] == [(retry_call.span_id, 1.0)]


def test_a_reward_without_the_marker_reads_as_before_and_the_marker_wins(any_store: StoreAPI) -> None:
    rid, aid = _rollout(any_store, "old")
    call = llm_span(*any_store.last_attempts([rid])[0], seed=1)
    any_store.add_spans([call, reward_span(rid, aid, 0.2), reward_span(rid, aid, 0.4, call_span_id=call.span_id),
                         reward_span(rid, aid, 0.7)])  # a store written before the marker: the last untied one
    any_store.finish_attempt(aid, "succeeded")
    assert final_rewards(any_store, [aid]) == {aid: 0.7}
    assert any_store.rollout_summaries([rid])[0].final_reward == 0.7
    rid2, aid2 = _rollout(any_store, "new")
    call2 = llm_span(*any_store.last_attempts([rid2])[0], seed=2)
    any_store.add_spans([call2, reward_span(rid2, aid2, 0.9, final=True), reward_span(rid2, aid2, 0.1),
                         reward_span(rid2, aid2, 0.5, final=False)])
    any_store.finish_attempt(aid2, "succeeded")
    assert final_rewards(any_store, [aid, aid2]) == {aid: 0.7, aid2: 0.9}
    assert any_store.rollout_summaries([rid2])[0].final_reward == 0.9
    assert {s.rollout_id: s.reward for s in iter_samples(any_store, [rid, rid2])} == {rid: 0.7, rid2: 0.9}


def test_the_marker_is_a_boolean_refused_otherwise_on_write(any_store: StoreAPI) -> None:
    rid, aid = _rollout(any_store, "bad")
    bad = reward_span(rid, aid, 1.0).model_dump() | {"attributes": {"final": "yes"}}
    with pytest.raises(InvalidSpanError, match=r"attributes\.final is true or false"):
        any_store.add_spans([bad])
    assert any_store.spans_table(attempt_ids=[aid]).num_rows == 0


def test_rule_three_in_one_place() -> None:
    assert final_index([], []) is None
    assert final_index([None, None, None], [None, "sp-a", None]) == 2  # unmarked: the last untied
    assert final_index([True, None, None], [None, None, None]) == 0  # a marked final wins over later unmarked
    assert final_index([False, False], [None, None]) is None  # intermediate rewards are never final
    assert final_index([False, None], [None, None]) == 1
    assert final_index([True, True, False], [None, "sp-a", None]) == 1  # the last marked, tied or not
    assert [final_mark(a) for a in ('{"final": true}', {"final": False}, None, "{}", '{"final": 1}')] == [
        True, False, None, None, None]


def test_the_report_sums_each_steps_drops_and_ends_with_a_line(tmp_path: Path) -> None:
    from spanlab.jobs.outcome import end_lines
    from spanlab.jobs.report import TrainReport

    steps = [Dropped(error_spans=1, failed_attempts=2).metrics() | {"reward_mean": 0.5, "dropped_stale_groups": 3.0},
             Dropped(failed_attempts=1, kept_failed_attempts=4).metrics()]
    report = TrainReport(run_name="r", algorithm="grpo", model="m", db="d", steps=steps)
    assert report.dropped() == {"dropped_error_spans": 1, "dropped_failed_attempts": 3, "kept_failed_attempts": 4}
    assert report.summary()["not_trained"] == report.dropped()  # the async loop's stale drops are its own metric
    (line,) = [text for _, text in end_lines(report, tmp_path) if "sample rule" in text]
    assert "1 error spans, 3 failed attempts" in line and "kept" not in line
    assert not [text for _, text in end_lines(TrainReport(run_name="r", algorithm="grpo", model="m", db="d",
                                                          steps=[Dropped().metrics()]), tmp_path)
                if "sample rule" in text]
