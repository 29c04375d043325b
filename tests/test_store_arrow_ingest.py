"""The Arrow batch path (`add_span_table`): same rules as typed spans, enforced column-wise."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spanlab.errors import InvalidSpanError
from spanlab.store import SpanStore
from spanlab.store.spans import spans_to_arrow
from tests.conftest import llm_span


def _table(rollout, attempt, n: int = 3, **overrides) -> pa.Table:
    tbl = spans_to_arrow([llm_span(rollout, attempt, seed=i, span_id=f"s{i}") for i in range(n)])
    for name, values in overrides.items():
        idx = tbl.schema.get_field_index(name)
        tbl = tbl.set_column(idx, tbl.schema.field(idx), pa.array(values, tbl.schema.field(idx).type))
    return tbl


def test_table_path_stores_what_objects_would(store: SpanStore, started) -> None:
    rollout, attempt = started
    tbl = _table(rollout, attempt)
    assert store.add_span_table(tbl) == 3
    assert store.add_span_table(tbl) == 0  # idempotent
    back = store.spans_table(columns=["span_id", "sequence_id", "prompt_token_ids"])
    assert back["span_id"].to_pylist() == ["s0", "s1", "s2"]
    assert back["sequence_id"].to_pylist() == [0, 1, 2]
    assert back["prompt_token_ids"].to_pylist() == tbl["prompt_token_ids"].to_pylist()


def test_minimal_columns_are_enough(store: SpanStore, started) -> None:
    rollout, attempt = started
    tbl = pa.table({
        "span_id": ["a"], "rollout_id": [rollout.rollout_id], "attempt_id": [attempt.attempt_id],
        "name": ["note"], "kind": ["message"], "start_time": [1.0], "status": ["ok"],
    })
    assert store.add_span_table(tbl) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": ["llm_call", "banana", "llm_call"]}, r"span #1 \(s1\) is invalid: kind: Input should be .llm_call"),
        ({"status": ["ok", "ok", "fine"]}, r"span #2 \(s2\) is invalid: status"),
        ({"model": ["m", None, "m"]}, r"span #1 \(s1\) is invalid: llm.model"),
        ({"response_token_ids": [[1, 2, 3, 4, 5], [1, -7, 3, 4, 5], [1, 2, 3, 4, 5]]}, r"span #1 .*lie in \[0"),
        ({"response_logprobs": [[0.0] * 5, [0.0] * 4, [0.0] * 5]}, r"span #1 .*response_logprobs has 4 entries"),
        ({"response_logprobs": [[0.0] * 5, [0.0] * 5, [0.0, float("nan"), 0, 0, 0]]}, r"span #2 .*finite"),
        ({"response_logprobs": [[0.0] * 5, [0.0, float("inf"), 0, 0, 0], [0.0] * 5]}, r"span #1 .*finite"),
        ({"loss_mask": [None, [1] * 24, None]}, r"span #1 .*loss_mask has 24 entries"),
        ({"loss_mask": [None, None, [0] * 24 + [2]]}, r"span #2 .*loss_mask must lie in \[0, 1\]"),
        ({"span_id": ["s0", "s0", "s2"]}, "appears twice"),
        ({"attempt_id": ["at-nope"] * 3}, "unknown attempt_id 'at-nope'"),
        ({"rollout_id": [None] * 3}, "both be set or both be None"),
        ({"request_messages": ["[]", "{not json", "[]"]}, r"span #1 .*`request_messages` is not valid JSON"),
        ({"span_id": ["s0", "", "s2"]}, r"span #1 \(\) is invalid: span_id"),
        ({"name": ["a", "b", None]}, r"span #2 .*name: Input should be a valid string"),
        ({"sequence_id": [0, -1, 2]}, r"span #1 .*sequence_id: Input should be greater than or equal to 0"),
        ({"kind": ["llm_call", "message", "llm_call"]}, r"span #1 .*only llm_call and demonstration spans carry"),
        ({"kind": ["llm_call", "reward", "llm_call"], "model": ["m", None, "m"]}, r"span #1 .*reward.value: Input"),
        ({"reward_value": [None, None, 0.5]}, r"span #2 .*only reward spans carry `reward`"),
        ({"kind": ["llm_call", "reward", "llm_call"], "model": ["m", None, "m"],
          "reward_value": [None, float("inf"), None]}, r"span #1 .*reward value must be finite"),
    ],
)
def test_bad_batches_name_the_row_and_store_nothing(store: SpanStore, started, overrides, message) -> None:
    rollout, attempt = started
    with pytest.raises(InvalidSpanError, match=message):
        store.add_span_table(_table(rollout, attempt, **overrides))
    assert store.spans_table().num_rows == 0
    assert store.add_span_table(_table(rollout, attempt)) == 3  # the store is fine afterwards


def test_schema_problems(store: SpanStore, started) -> None:
    rollout, attempt = started
    with pytest.raises(InvalidSpanError, match=r"unknown span columns \['colour'\]"):
        store.add_span_table(_table(rollout, attempt).append_column("colour", pa.array(["r", "g", "b"])))
    with pytest.raises(InvalidSpanError, match="lacks required columns"):
        store.add_span_table(_table(rollout, attempt).drop_columns(["kind"]))
    wrong = _table(rollout, attempt).drop_columns(["prompt_token_ids"]).append_column(
        "prompt_token_ids", pa.array([["a"], ["b"], ["c"]])
    )
    with pytest.raises(InvalidSpanError, match="`prompt_token_ids` has type list<item: string>"):
        store.add_span_table(wrong)
