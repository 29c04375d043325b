"""Spans -> samples on a real DuckDB store: grouping, masks, last attempt, rewards, TITO sessions, padding."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
import torch

from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.samples import Sample, collate, micro_batches
from spanlab.store import StoreAPI
from spanlab.types import Attempt, LLMCall, Rollout, RolloutConfig, Span, reward_span
from tests.conftest import llm_span


@pytest.fixture
def store(any_store: StoreAPI) -> StoreAPI:
    """Every test here runs on SpanStore and on StoreClient over HTTP to a store server (tests/stores.py)."""
    return any_store


def _run(store: StoreAPI, task: object, reward: float | None, n_calls: int = 1, **enqueue) -> tuple[Rollout, list]:
    """Enqueue one rollout, record ``n_calls`` LLM calls and a final reward, finish it."""
    rollout = store.enqueue_one(task, **enqueue)
    got = store.dequeue(worker_id="w")
    assert got is not None and got[0].rollout_id == rollout.rollout_id
    seed = int(rollout.rollout_id[-6:], 16)  # any per-rollout seed: distinct token IDs per call
    calls = [llm_span(*got, seed=seed + i, n_prompt=5 + i, n_resp=2 + i)
             for i in range(n_calls)]
    store.add_spans(calls + ([reward_span(rollout.rollout_id, got[1].attempt_id, reward)] if reward is not None
                             else []))
    store.finish_attempt(got[1].attempt_id, "succeeded")
    return rollout, calls


def test_per_call_triplets_have_prompt_response_mask_and_engine_logprobs(store: StoreAPI) -> None:
    rollout, calls = _run(store, {"task_id": "t1", "q": "1+1"}, 0.5, n_calls=2)
    samples = list(iter_samples(store, [rollout.rollout_id]))
    assert [s.span_ids for s in samples] == [[c.span_id] for c in calls]
    for s, c in zip(samples, calls, strict=True):
        p, r = c.llm.prompt_token_ids, c.llm.response_token_ids
        assert s.input_ids.dtype == np.int32 and s.input_ids.tolist() == [*p, *r]
        assert s.loss_mask.dtype == np.uint8 and s.loss_mask.tolist() == [0] * len(p) + [1] * len(r)
        assert s.engine_logprobs.dtype == np.float32
        np.testing.assert_allclose(s.engine_logprobs, [0.0] * len(p) + list(c.llm.response_logprobs), rtol=1e-6)
        assert (s.rollout_id, s.group_id, s.reward) == (rollout.rollout_id, "t1", 0.5)


def test_group_id_from_input_key_metadata_or_input_json(store: StoreAPI) -> None:
    by_key, _ = _run(store, {"task_id": 7, "q": "a"}, 1.0)
    by_meta, _ = _run(store, {"q": "b"}, 1.0, metadata={"group_id": "G"})
    by_json, _ = _run(store, {"q": "c", "a": 1}, 1.0)
    by_other_key, _ = _run(store, {"name": "n1"}, 1.0)
    ids = [r.rollout_id for r in (by_key, by_meta, by_json, by_other_key)]
    groups = {s.rollout_id: s.group_id for s in iter_samples(store, ids)}
    assert groups[by_key.rollout_id] == "7"
    assert groups[by_meta.rollout_id] == "G"
    assert groups[by_json.rollout_id] == '{"a": 1, "q": "c"}'
    assert {s.group_id for s in iter_samples(store, [by_other_key.rollout_id], group_key="name")} == {"n1"}


def test_only_the_last_attempt_is_read(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"}, config=RolloutConfig(max_attempts=2))
    first = store.dequeue(worker_id="w")
    assert first is not None
    store.add_spans([llm_span(*first, seed=1), reward_span(rollout.rollout_id, first[1].attempt_id, 0.0)])
    store.finish_attempt(first[1].attempt_id, "failed")
    second = store.dequeue(worker_id="w")
    assert second is not None and second[1].sequence_id == 2
    retry = llm_span(*second, seed=2)
    store.add_spans([retry, reward_span(rollout.rollout_id, second[1].attempt_id, 1.0)])
    store.finish_attempt(second[1].attempt_id, "succeeded")
    samples = list(iter_samples(store, [rollout.rollout_id]))
    assert [(s.span_ids, s.reward) for s in samples] == [([retry.span_id], 1.0)]


def test_unrewarded_rollouts_are_skipped_with_a_log_line(store: StoreAPI, caplog: pytest.LogCaptureFixture) -> None:
    rewarded, _ = _run(store, {"task_id": "t"}, 1.0)
    silent, _ = _run(store, {"task_id": "t"}, None)
    with caplog.at_level(logging.INFO, logger="spanlab.adapters.sample_reader"):
        samples = list(iter_samples(store, [rewarded.rollout_id, silent.rollout_id, "ro-never-enqueued"]))
    assert {s.rollout_id for s in samples} == {rewarded.rollout_id}
    assert silent.rollout_id in caplog.text and "ro-never-enqueued" in caplog.text


def test_final_reward_is_the_last_untied_reward_and_per_call_rewards_are_opt_in(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    a, b = llm_span(*got, seed=1), llm_span(*got, seed=2)
    rid, aid = rollout.rollout_id, got[1].attempt_id
    store.add_spans([a, b, reward_span(rid, aid, 0.3, call_span_id=a.span_id), reward_span(rid, aid, 0.1),
                     reward_span(rid, aid, 0.9)])  # the runner's final reward comes last
    store.finish_attempt(aid, "succeeded")  # only a finished attempt is trained (adapters/trainable.py)
    final = {s.span_ids[0]: s.reward for s in iter_samples(store, [rid])}
    per_call = {s.span_ids[0]: s.reward for s in iter_samples(store, [rid], reward="per_call")}
    assert final == {a.span_id: 0.9, b.span_id: 0.9}
    assert per_call == {a.span_id: 0.3, b.span_id: 0.9}  # b has no per-call reward: the final one


def _tito(rollout: Rollout, attempt: Attempt, prompt: list[int], response: list[int], mask: list[int],
          logprobs: list[float], agent: str | None = None) -> Span:
    return Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat", kind="llm_call",
                attributes={} if agent is None else {"agent": agent},
                llm=LLMCall(model="m", prompt_token_ids=prompt, response_token_ids=response,
                            response_logprobs=logprobs, loss_mask=mask))


def test_interleaved_roles_of_one_attempt_are_separate_sessions_and_can_be_selected(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    w1 = _tito(*got, [1, 2], [10], [0, 0, 1], [-0.1], agent="writer")
    c1 = _tito(*got, [7, 8], [30], [0, 0, 1], [-0.2], agent="checker")
    w2 = _tito(*got, [1, 2, 10, 3], [11], [0, 0, 1, 0, 1], [-0.3], agent="writer")  # extends the writer's buffer
    c2 = _tito(*got, [7, 8, 30, 9], [31], [0, 0, 1, 0, 1], [-0.4], agent="checker")
    store.add_spans([w1, c1, w2, c2, reward_span(rollout.rollout_id, got[1].attempt_id, 1.0)])
    store.finish_attempt(got[1].attempt_id, "succeeded")
    for rows in (1, 3, 256):
        by_role = {tuple(s.span_ids): s for s in iter_samples(store, [rollout.rollout_id], batch_rows=rows)}
        assert set(by_role) == {(w1.span_id, w2.span_id), (c1.span_id, c2.span_id)}  # one sample per role
        writer = by_role[(w1.span_id, w2.span_id)]
        assert writer.input_ids.tolist() == [1, 2, 10, 3, 11] and writer.loss_mask.tolist() == [0, 0, 1, 0, 1]
        np.testing.assert_allclose(writer.engine_logprobs, [0, 0, -0.1, 0, -0.3], rtol=1e-6)
        assert writer.reward == 1.0
    only = list(iter_samples(store, [rollout.rollout_id], agents=["writer"]))
    assert [s.span_ids for s in only] == [[w1.span_id, w2.span_id]]  # the checker's calls never reach training
    assert list(iter_samples(store, [rollout.rollout_id], agents=["nobody"])) == []


def test_tito_session_keeps_the_last_span_of_each_segment(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    turn1 = _tito(*got, [1, 2, 3], [10, 11], [0, 0, 0, 1, 1], [-0.1, -0.2])
    # next call: tool result 20, 21 (mask 0) appended, then the sampled turn 12
    turn2 = _tito(*got, [1, 2, 3, 10, 11, 20, 21], [12], [0, 0, 0, 1, 1, 0, 0, 1], [-0.3])
    # history rewritten: a new segment whose prompt does not extend the buffer
    turn3 = _tito(*got, [5, 6], [13, 14], [0, 0, 1, 1], [-0.4, -0.5])
    store.add_spans([turn1, turn2, turn3, reward_span(rollout.rollout_id, got[1].attempt_id, 1.0)])
    store.finish_attempt(got[1].attempt_id, "succeeded")
    for rows in (1, 2, 256):
        first, second = iter_samples(store, [rollout.rollout_id], batch_rows=rows)
        assert first.input_ids.tolist() == [1, 2, 3, 10, 11, 20, 21, 12]
        assert first.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
        np.testing.assert_allclose(first.engine_logprobs, [0, 0, 0, -0.1, -0.2, 0, 0, -0.3], rtol=1e-6)
        assert first.span_ids == [turn1.span_id, turn2.span_id]
        assert second.input_ids.tolist() == [5, 6, 13, 14] and second.span_ids == [turn3.span_id]


def test_streaming_in_small_batches_gives_the_same_samples(store: StoreAPI) -> None:
    ids = [_run(store, {"task_id": f"t{i % 3}"}, float(i), n_calls=1 + i % 3)[0].rollout_id for i in range(9)]
    gen = iter_samples(store, ids, batch_rows=2)
    assert isinstance(gen, types.GeneratorType)  # lazy: nothing read until iterated
    small = [(s.span_ids, s.input_ids.tolist(), s.group_id, s.reward) for s in gen]
    large = [(s.span_ids, s.input_ids.tolist(), s.group_id, s.reward) for s in iter_samples(store, ids)]
    assert small == large and len(small) == sum(1 + i % 3 for i in range(9))


def _sample(n: int, n_resp: int = 2, reward: float = 0.0) -> Sample:
    mask = np.array([0] * (n - n_resp) + [1] * n_resp, np.uint8)
    return Sample("r", "g", np.arange(1, n + 1, dtype=np.int32), mask, -0.5 * mask.astype(np.float32), reward)


def test_collate_right_pads() -> None:
    batch = collate([_sample(3), _sample(5, n_resp=3)], [1.5, -2.0], pad_id=0)
    assert batch.input_ids.dtype == torch.long and batch.input_ids.tolist() == [[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.loss_mask.dtype == torch.float32 and batch.loss_mask.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
    assert batch.engine_logprobs.tolist() == [[0, -0.5, -0.5, 0, 0], [0, 0, -0.5, -0.5, -0.5]]
    assert batch.advantages.tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match="advantages"):
        collate([_sample(3)], [1.0, 2.0], pad_id=0)


def test_micro_batches_count_padding_and_keep_order() -> None:
    samples = [_sample(n) for n in (4, 4, 6, 2, 12, 3)]
    chunks = list(micro_batches(samples, max_tokens=12))
    # [4,4] ok (2x4=8); +6 -> 3x6=18 > 12: cut; [6,2] = 12; +12 alone (over budget, own chunk); [3]
    assert [[len(s) for s in c] for c in chunks] == [[4, 4], [6, 2], [12], [3]]
    assert [s for c in chunks for s in c] == samples
    for c in chunks:
        assert len(c) * max(len(s) for s in c) <= 12 or len(c) == 1
