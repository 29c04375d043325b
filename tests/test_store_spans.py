"""Spans in and out of the DuckDB store: exact token IDs, order, dedupe, bad input, views, resources."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanlab.errors import InvalidSpanError, NotFoundError
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Span, reward_span
from tests.conftest import llm_span


def test_token_ids_round_trip_exactly(store: SpanStore, started) -> None:
    rollout, attempt = started
    spans = [llm_span(rollout, attempt, seed=i) for i in range(5)]
    assert store.add_spans(spans) == 5
    back = list(store.iter_spans(attempt_ids=[attempt.attempt_id]))
    assert [s.span_id for s in back] == [s.span_id for s in spans]
    assert [s.sequence_id for s in back] == [0, 1, 2, 3, 4]
    for orig, got in zip(spans, back, strict=True):
        assert got.llm.prompt_token_ids == orig.llm.prompt_token_ids
        assert got.llm.response_token_ids == orig.llm.response_token_ids
        assert np.allclose(got.llm.response_logprobs, orig.llm.response_logprobs, atol=1e-6)
        assert got.llm.request_messages == orig.llm.request_messages
        assert got.llm.response_message == orig.llm.response_message


def test_token_columns_are_typed_lists_not_json(store: SpanStore) -> None:
    rows = store.query(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'spans'"
    ).to_pylist()
    types = {r["column_name"]: r["data_type"] for r in rows}
    assert types["prompt_token_ids"] == "INTEGER[]"
    assert types["response_token_ids"] == "INTEGER[]"
    assert types["response_logprobs"] == "FLOAT[]"


def test_arrow_schema_follows_the_table_column_order(store: SpanStore) -> None:
    from spanlab.store.schema import SPAN_COLUMNS

    assert tuple(store.query("SELECT * FROM spans LIMIT 0").column_names) == SPAN_COLUMNS


def test_numpy_arrays_are_accepted_and_stored_the_same(store: SpanStore, started) -> None:
    rollout, attempt = started
    ids = np.arange(100, 140, dtype=np.int64)
    span = Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="c", kind="llm_call",
                llm=LLMCall(model="m", prompt_token_ids=ids, response_token_ids=np.array([7, 8, 2])))
    store.add_span(span)
    table = store.spans_table(columns=["prompt_token_ids", "response_token_ids"])
    assert table["prompt_token_ids"].to_pylist() == [list(range(100, 140))]
    assert table["response_token_ids"].type == pa.list_(pa.int32())


def test_list_input_stays_a_list_and_a_change_after_validation_is_what_is_stored(store: SpanStore, started) -> None:
    """Validation leaves a list a plain list; what the list holds when it is written is what is stored."""
    rollout, attempt = started
    changed = [Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="c", kind="llm_call",
                    llm=LLMCall(model="m", prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                                response_logprobs=[-0.5, -0.25])) for _ in range(7)]
    ids = changed[0].llm.prompt_token_ids
    assert ids == [1, 2, 3] and type(ids) is list
    changed[0].llm.prompt_token_ids.append(6)
    changed[1].llm.prompt_token_ids[0] = 9
    changed[2].llm.prompt_token_ids.extend([7, 7])
    changed[3].llm.prompt_token_ids += [8]
    del changed[4].llm.prompt_token_ids[0]
    changed[5].llm.prompt_token_ids.sort(reverse=True)
    changed[6].llm.response_logprobs[1] = -2.0
    store.add_spans(changed)
    table = store.spans_table(columns=["prompt_token_ids", "response_logprobs"])
    assert table["prompt_token_ids"].to_pylist()[:6] == [[1, 2, 3, 6], [9, 2, 3], [1, 2, 3, 7, 7], [1, 2, 3, 8],
                                                          [2, 3], [3, 2, 1]]
    assert table["response_logprobs"].to_pylist()[6] == [-0.5, -2.0]


def test_spans_df(store: SpanStore, started) -> None:
    rollout, attempt = started
    store.add_spans([llm_span(rollout, attempt, n_prompt=7, seed=i) for i in range(3)])
    df = store.spans_df(kinds=["llm_call"], columns=["span_id", "prompt_token_ids"])
    assert list(df.columns) == ["span_id", "prompt_token_ids"] and len(df) == 3
    assert [len(x) for x in df["prompt_token_ids"]] == [7, 7, 7]


def test_sequence_ids_and_dedupe_survive_restarts(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    with SpanStore(path) as store:
        store.enqueue_one({})
        rollout, attempt = store.dequeue()
        first = [llm_span(rollout, attempt, seed=i) for i in range(3)]
        store.add_spans(first)
    with SpanStore(path) as store:
        assert store.add_spans(first[1:]) == 0  # the reopened store still knows what it holds
        store.add_spans([llm_span(rollout, attempt, seed=9)])
        seqs = store.spans_table(columns=["sequence_id"])["sequence_id"].to_pylist()
    assert seqs == [0, 1, 2, 3]


def test_repeated_span_id_is_stored_once(store: SpanStore, started) -> None:
    rollout, attempt = started
    span = llm_span(rollout, attempt)
    assert store.add_spans([span]) == 1
    assert store.add_spans([span]) == 0  # a retried write is idempotent
    assert store.spans_table().num_rows == 1
    with pytest.raises(InvalidSpanError, match="appears twice"):
        store.add_spans([llm_span(rollout, attempt, span_id="x"), llm_span(rollout, attempt, span_id="x")])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt_token_ids", ["1", 2], "must be integers"),
        ("prompt_token_ids", [1.5, 2.0], "must be integers"),
        ("prompt_token_ids", [-3], r"must lie in \[0"),
        ("prompt_token_ids", [2**40], r"must lie in \[0"),
        ("response_token_ids", "123", "list or a 1-D NumPy array"),
        ("response_logprobs", [0.1, float("nan")], "NaN"),
    ],
)
def test_malformed_spans_are_rejected_and_nothing_is_stored(store: SpanStore, started, field, value, message) -> None:
    rollout, attempt = started
    good = llm_span(rollout, attempt, seed=1)
    store.add_span(good)
    bad = good.model_dump()
    bad["span_id"] = "bad"
    bad["llm"][field] = value
    if field == "response_logprobs":
        bad["llm"]["response_token_ids"] = bad["llm"]["response_token_ids"][:2]
    with pytest.raises(InvalidSpanError, match=message):
        store.add_spans([llm_span(rollout, attempt, seed=2), bad])
    assert store.spans_table(columns=["span_id"])["span_id"].to_pylist() == [good.span_id]


def test_unknown_or_mismatched_attempt_is_rejected(store: SpanStore, started) -> None:
    rollout, attempt = started
    other = store.enqueue_one({})
    ghost = llm_span(rollout, attempt).model_copy(update={"attempt_id": "at-ghost"})
    with pytest.raises(InvalidSpanError, match="unknown attempt_id 'at-ghost'"):
        store.add_spans([llm_span(rollout, attempt), ghost])
    wrong = llm_span(rollout, attempt).model_copy(update={"rollout_id": other.rollout_id})
    with pytest.raises(InvalidSpanError, match="belongs to rollout"):
        store.add_spans([wrong])
    assert store.spans_table().num_rows == 0


def test_span_shape_rules() -> None:
    with pytest.raises(ValueError, match="needs its `llm` fields"):
        Span(name="x", kind="llm_call")
    with pytest.raises(ValueError, match="both be set"):
        Span(name="x", kind="custom", rollout_id="r")
    with pytest.raises(ValueError, match="response_logprobs has 1 entries"):
        LLMCall(model="m", response_token_ids=[1, 2], response_logprobs=[0.0])
    with pytest.raises(ValueError, match=r"loss_mask has 3 entries but prompt\+response has 2"):
        LLMCall(model="m", prompt_token_ids=[1], response_token_ids=[2], loss_mask=[0, 1, 1])
    with pytest.raises(ValueError, match=r"loss_mask must lie in \[0, 1\]"):
        LLMCall(model="m", prompt_token_ids=[1], response_token_ids=[2], loss_mask=[0, 2])
    with pytest.raises(ValueError, match="Extra inputs"):
        Span(name="x", kind="custom", surprise=1)


def test_oversize_payloads_are_rejected(tmp_path) -> None:
    with SpanStore(tmp_path / "o.duckdb", max_tokens_per_span=100, max_json_bytes=1000) as store:
        store.enqueue_one({})
        rollout, attempt = store.dequeue()
        with pytest.raises(InvalidSpanError, match="exceed max_tokens_per_span=100"):
            store.add_span(llm_span(rollout, attempt, n_prompt=200))
        huge = llm_span(rollout, attempt, attributes={"blob": "x" * 5000})
        with pytest.raises(InvalidSpanError, match=r"`attributes` is 50\d\d bytes"):
            store.add_span(huge)
        assert store.spans_table().num_rows == 0


def test_unattributed_spans(store: SpanStore) -> None:
    span = Span(name="chat", kind="llm_call", llm=LLMCall(model="m", prompt_token_ids=[1], response_token_ids=[2]))
    assert store.add_span(span) == 1
    assert store.add_span(span) == 0
    row = store.query("SELECT rollout_id, attempt_id, sequence_id FROM llm_calls").to_pylist()
    assert row == [{"rollout_id": None, "attempt_id": None, "sequence_id": 0}]


def test_streaming_reader_yields_bounded_batches(store: SpanStore, started) -> None:
    rollout, attempt = started
    store.add_spans([llm_span(rollout, attempt, seed=i) for i in range(50)])
    reader = store.spans_reader(columns=["span_id", "prompt_token_ids"], batch_size=8)
    sizes = [b.num_rows for b in reader]
    assert sum(sizes) == 50 and max(sizes) <= 8 * 2  # DuckDB may round up to its vector size
    with pytest.raises(InvalidSpanError, match="unknown span columns"):
        store.spans_reader(columns=["nope"])


def test_views_summarize_rollouts(store: SpanStore) -> None:
    store.enqueue_one({"q": 1})
    store.enqueue_one({"q": 2})
    r1, a1 = store.dequeue()
    store.add_spans([llm_span(r1, a1, n_prompt=10, n_resp=3, seed=i) for i in range(2)])
    call = store.spans_table(columns=["span_id"])["span_id"][0].as_py()
    store.add_spans([
        reward_span(r1.rollout_id, a1.attempt_id, 0.25, name="step", call_span_id=call),
        reward_span(r1.rollout_id, a1.attempt_id, 1.0),
    ])
    store.finish_attempt(a1.attempt_id, "succeeded")
    rows = {r["rollout_id"]: r for r in store.query("SELECT * FROM rollout_summary").to_pylist()}
    s1 = rows[r1.rollout_id]
    assert (s1["status"], s1["attempts"], s1["llm_calls"]) == ("succeeded", 1, 2)
    assert (s1["prompt_tokens"], s1["response_tokens"]) == (20, 6)
    assert s1["total_reward"] == pytest.approx(1.25) and s1["final_reward"] == 1.0
    other = next(r for k, r in rows.items() if k != r1.rollout_id)
    assert (other["status"], other["attempts"], other["llm_calls"], other["total_reward"]) == ("queuing", 0, 0, None)
    rewards = store.query("SELECT name, value, call_span_id FROM rewards ORDER BY sequence_id").to_pylist()
    assert rewards == [{"name": "step", "value": 0.25, "call_span_id": call},
                       {"name": "reward", "value": 1.0, "call_span_id": None}]
    calls = store.query("SELECT prompt_len, response_len, finish_reason FROM llm_calls").to_pylist()
    assert calls == [{"prompt_len": 10, "response_len": 3, "finish_reason": "stop"}] * 2


def test_resources_are_versioned(store: SpanStore) -> None:
    v1 = store.add_resource("system_prompt", {"poml": "<p>v1</p>"}, kind="prompt_template")
    v2 = store.add_resource("system_prompt", {"poml": "<p>v2</p>"}, kind="prompt_template")
    assert (v1.version, v2.version, v2.ref) == (1, 2, "system_prompt@2")
    assert store.get_resource("system_prompt").payload == {"poml": "<p>v2</p>"}
    assert store.get_resource("system_prompt", 1).payload == {"poml": "<p>v1</p>"}
    assert [r.version for r in store.list_resources("system_prompt")] == [1, 2]
    with pytest.raises(NotFoundError, match="unknown resource 'nope'"):
        store.get_resource("nope")


token_lists = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=50)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=token_lists, response=token_lists, text=st.text(max_size=40))
def test_any_valid_span_round_trips(store: SpanStore, started, prompt, response, text) -> None:
    rollout, attempt = started
    span = Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name=text or "n", kind="llm_call",
                attributes={"t": text},
                llm=LLMCall(model=text, prompt_token_ids=prompt, response_token_ids=response,
                            request_messages=[{"role": "user", "content": text}]))
    store.add_span(span)
    (back,) = [s for s in store.iter_spans(attempt_ids=[attempt.attempt_id]) if s.span_id == span.span_id]
    assert back.llm.prompt_token_ids == prompt and back.llm.response_token_ids == response
    assert back.attributes == {"t": text} and back.llm.request_messages[0]["content"] == text


def test_uncompressed_store_round_trips(tmp_path) -> None:
    with SpanStore(tmp_path / "raw.duckdb", compress=False) as store:
        store.enqueue_one({})
        rollout, attempt = store.dequeue()
        spans = [llm_span(rollout, attempt, n_prompt=3000, seed=i) for i in range(3)]
        store.add_spans(spans)
        got = store.spans_table(columns=["prompt_token_ids"])["prompt_token_ids"].to_pylist()
    assert got == [s.llm.prompt_token_ids for s in spans]


def test_span_batches_written_at_once_each_get_their_own_result(store: SpanStore, started) -> None:
    """Two callers writing at once: each gets the span IDs new from its own batch, a span both send counts
    once (for the first), and sequence numbers follow the order the writes ran in."""
    from concurrent.futures import ThreadPoolExecutor

    rollout, attempt = started
    a = [llm_span(rollout, attempt, seed=i) for i in range(3)]
    b = [a[2], *(llm_span(rollout, attempt, seed=10 + i) for i in range(2))]  # a[2] again
    with ThreadPoolExecutor(2) as pool:
        got_a, got_b = pool.map(store.ingest, [a, b])
    (first, got_first), (second, got_second) = sorted([(a, got_a), (b, got_b)], key=lambda x: -len(x[1]))
    assert got_first == [s.span_id for s in first]  # the write that ran first stored its whole batch
    assert got_second == [s.span_id for s in second if s.span_id not in got_first]
    seqs = {s.span_id: s.sequence_id for s in store.iter_spans(attempt_ids=[attempt.attempt_id])}
    assert [seqs[i] for i in got_first + got_second] == [0, 1, 2, 3, 4]
