"""Typed spans are journaled as columns (``SpanColumns``) and become Arrow only when needed: what is stored,
read and replayed must be exactly what the Arrow path stores, and bad spans fail the same way."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from spanlab.errors import InvalidSpanError
from spanlab.store import SpanStore
from spanlab.store.arrow import spans_to_arrow
from spanlab.store.span_columns import RECORD_TAG, SpanColumns, columns_to_arrow
from spanlab.types import LLMCall, Reward, Rollout, Span, Usage


def _varied(rollout_id: str, attempt_id: str) -> list[Span]:
    """Every kind of column: NumPy and list token IDs, logprobs and loss masks present or not, usage, JSON
    columns, a non-LLM span, a reward, non-ASCII text."""
    rng = np.random.default_rng(0)
    ids = dict(rollout_id=rollout_id, attempt_id=attempt_id)
    return [
        Span(**ids, name="chat", kind="llm_call", attributes={"k": 1, "text": "héllo ✓"},
             llm=LLMCall(model="m", prompt_token_ids=rng.integers(0, 1000, 30).astype(np.int32),
                         response_token_ids=[1, 2, 3], response_logprobs=[-0.5, -1.0, -0.25],
                         loss_mask=[0] * 30 + [1, 0, 1],
                         request_messages=[{"role": "user", "content": "2+2? \"quoted\""}],
                         request_tools=[{"type": "function", "function": {"name": "add"}}],
                         response_message={"role": "assistant", "content": "4"}, finish_reason="stop",
                         usage=Usage(prompt_tokens=30, completion_tokens=3, total_tokens=33))),
        Span(**ids, name="chat", kind="llm_call", llm=LLMCall(model="m", prompt_token_ids=[], response_token_ids=[7])),
        Span(**ids, name="tool", kind="tool_call", attributes={"tool": "add", "args": [2, 2]}),
        Span(**ids, name="reward", kind="reward", reward=Reward(value=-0.5, call_span_id="x")),
        Span(**ids, name="reward", kind="reward", reward=Reward(value=1.0)),
    ]


def test_columns_convert_to_the_same_arrow_as_before() -> None:
    spans = _varied("r", "a")
    via_columns = columns_to_arrow([SpanColumns.of(spans[:2]), SpanColumns.of(spans[2:])])
    record = b"".join(bytes(p) for p in SpanColumns.of(spans).record())
    assert record[:1] == RECORD_TAG
    replayed = columns_to_arrow([SpanColumns.from_record(record)])
    want = spans_to_arrow(spans)
    for got in (via_columns, replayed):
        assert got.schema == want.schema
        assert got.equals(want) or str(got.to_pylist()) == str(want.to_pylist())  # NaN != NaN in equals
    assert SpanColumns.of(spans).take([4, 0]).values["span_id"] == [spans[4].span_id, spans[0].span_id]
    taken = columns_to_arrow([SpanColumns.of(spans).take([3, 0])])
    assert taken["prompt_token_ids"].to_pylist() == [None, list(spans[0].llm.prompt_token_ids)]


def test_typed_and_arrow_writes_store_and_read_the_same_rows(tmp_path: Path) -> None:
    tables = {}
    for way in ("typed", "arrow"):
        path = tmp_path / f"{way}.duckdb"
        with SpanStore(path, span_flush_s=3600, queue_flush_s=3600) as store:
            store.enqueue([Rollout(rollout_id="r", input={})])
            _, attempt = store.dequeue("w")
            spans = _varied("r", attempt.attempt_id)
            for span in spans:
                span.attempt_id = attempt.attempt_id
            if way == "typed":
                store.add_spans(spans[:2])
                store.finish_attempt(attempt.attempt_id, "succeeded", spans[2:])
            else:
                store.add_span_table(spans_to_arrow(spans[:2]))
                store.finish_attempt_table(attempt.attempt_id, "succeeded", spans_to_arrow(spans[2:]))
            waiting = store.spans_reader(rollout_ids=["r"]).read_all()  # from the journal, in memory
            tables[way] = (waiting, store.spans_table())  # from the table (SQL inserts them first)
    typed, arrow = tables["typed"], tables["arrow"]
    for got, want in zip(typed, arrow, strict=True):
        assert got.num_rows == len(_varied("r", "a"))
        drop = ["span_id", "attempt_id", "start_time", "end_time", "reward_call_span_id"]
        assert str(got.drop_columns(drop).to_pylist()) == str(want.drop_columns(drop).to_pylist())


def test_a_journal_of_columns_records_replays_after_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = SpanStore(path, span_flush_s=3600, queue_flush_s=3600)
    store.enqueue([Rollout(rollout_id="r", input={})])
    _, attempt = store.dequeue("w")
    spans = _varied("r", attempt.attempt_id)
    store.add_spans(spans[:2])  # columns
    store.add_span_table(spans_to_arrow(spans[2:3]))  # Arrow IPC, in the same file
    store.finish_attempt(attempt.attempt_id, "succeeded", spans[3:])  # columns, with the finish
    before = store.spans_reader(rollout_ids=["r"]).read_all()
    crashed = tmp_path / "crashed.duckdb"
    store._conn.execute("CHECKPOINT")
    shutil.copy(path, crashed)  # the tables as they were: no span in them yet
    shutil.copy(f"{path}.journal", f"{crashed}.journal")
    store.close()
    with SpanStore(crashed) as replayed:
        assert replayed.get_rollout("r").status == "succeeded"  # its finish found its spans
        after = replayed.spans_reader(rollout_ids=["r"]).read_all()
    assert str(after.to_pylist()) == str(before.to_pylist())


@pytest.mark.parametrize("bad", ["nan_json", "surrogate", "twice", "tokens", "json_bytes"])
def test_bad_typed_spans_fail_like_arrow_ones_and_store_nothing(tmp_path: Path, bad: str) -> None:
    with SpanStore(tmp_path / "s.duckdb", max_tokens_per_span=50, max_json_bytes=100) as store:
        store.enqueue([Rollout(rollout_id="r", input={})])
        _, attempt = store.dequeue("w")
        spans = _varied("r", attempt.attempt_id)[:3]
        if bad == "nan_json":
            spans[2].attributes = {"x": math.nan}
        elif bad == "surrogate":
            spans[2].name = "bad \ud800"
        elif bad == "twice":
            spans[2].span_id = spans[0].span_id
        elif bad == "tokens":
            spans[1].llm.prompt_token_ids = list(range(60))
        else:
            spans[2].attributes = {"x": "y" * 200}
        with pytest.raises(InvalidSpanError, match=r"nothing( of this batch was)? stored") as typed:
            store.add_spans(spans)
        with pytest.raises(InvalidSpanError, match=r"nothing( of this batch was)? stored") as finished:
            store.finish_attempt(attempt.attempt_id, "succeeded", spans)
        assert str(finished.value) == str(typed.value)
        assert store.spans_table().num_rows == 0
        assert store.get_attempt(attempt.attempt_id).status == "preparing"  # the finish did not happen
        if bad in ("twice", "tokens", "json_bytes"):  # the same words as the Arrow path
            with pytest.raises(InvalidSpanError) as arrow:
                store.add_span_table(spans_to_arrow(spans))
            assert str(arrow.value) == str(typed.value)
