"""The store interface every component programs against, and the typed rows its reads return.

``SpanStore`` (DuckDB, in-process) and ``StoreClient`` (the store server over HTTP) implement it with the
same behaviour (the adapter and loop tests run on both), so a gateway, runner, adapter or algorithm works with
either. Programs read through the typed methods, never SQL with parameters: ``query`` is for a user's SQL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import pandas as pd

from spanlab.store.schema import MAX_JSON_BYTES
from spanlab.types import (
    Attempt,
    FinishedAttemptStatus,
    Resource,
    ResourceKind,
    Rollout,
    RolloutConfig,
    RolloutMode,
    Span,
    StrictModel,
)


class RolloutSummary(BaseModel):
    """One row of the ``rollout_summary`` view: calls, tokens and rewards are those of the last attempt."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    mode: str
    status: str
    attempts: int
    last_attempt_id: str | None = None
    worker_id: str | None = None
    llm_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    total_reward: float | None = None
    final_reward: float | None = None
    resources_version: str | None = None
    enqueue_time: float
    start_time: float | None = None
    end_time: float | None = None
    input: Any = None
    metadata: dict[str, Any] = {}


class Metric(StrictModel):
    """One training metric of one step (a row of ``train_metrics``)."""

    run_id: str
    algorithm: str
    step: int
    name: str
    value: float | None
    time: float


class StoreAPI(ABC):
    """Queue, spans and resources. Token-heavy reads return Arrow, never lists of Python ints."""

    # The largest JSON column of a span this store takes (``SpanStore(max_json_bytes=...)``; a store server's store
    # has the default): the gateway's body limit follows it.
    max_json_bytes: int = MAX_JSON_BYTES

    # --- rollout queue -------------------------------------------------------------------------
    @abstractmethod
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Add rollouts (status ``queuing``); an existing ``rollout_id`` is an error."""

    def enqueue_one(self, input: Any, *, mode: RolloutMode = "train", config: RolloutConfig | None = None,
                    metadata: dict[str, Any] | None = None, resources_version: str | None = None) -> Rollout:
        rollout = Rollout(input=input, mode=mode, config=config or RolloutConfig(), metadata=metadata or {},
                          resources_version=resources_version)
        return self.enqueue([rollout])[0]

    @abstractmethod
    def dequeue(self, worker_id: str | None = None, mode: RolloutMode | None = None) -> tuple[Rollout, Attempt] | None:
        """Atomically take the oldest waiting rollout and open a new attempt on it; None if none waits."""

    @abstractmethod
    def heartbeat(self, attempt_id: str) -> Attempt:
        """Mark the attempt alive; the returned status tells a worker whether it was timed out meanwhile."""

    @abstractmethod
    def finish_attempt(self, attempt_id: str, status: FinishedAttemptStatus, spans: Sequence[Span] = ()) -> Rollout:
        """End the attempt and apply the rollout's retry policy; returns the rollout's new state.

        ``spans`` are the attempt's last spans (its reward, an error): stored in the same transaction, so
        an attempt never ends succeeded without its reward, and one call does what ``add_spans`` then
        ``finish_attempt`` would. Repeating the call is safe (span IDs already stored are skipped).
        """

    @abstractmethod
    def expire_stale_attempts(self) -> list[Attempt]:
        """Apply ``timeout_s`` and ``unresponsive_s`` now; returns the attempts it ended."""

    @abstractmethod
    def cancel_rollout(self, rollout_id: str) -> Rollout: ...

    @abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout: ...

    @abstractmethod
    def get_attempt(self, attempt_id: str) -> Attempt: ...

    @abstractmethod
    def list_rollouts(self, *, status: str | None = None, mode: str | None = None, limit: int = 1000,
                      offset: int = 0) -> list[Rollout]: ...

    @abstractmethod
    def list_attempts(self, rollout_id: str) -> list[Attempt]: ...

    @abstractmethod
    def last_attempts(self, rollout_ids: Sequence[str]) -> list[tuple[Rollout, Attempt]]:
        """Each rollout with its latest attempt, in the order given; rollouts never dequeued are left out."""

    @abstractmethod
    def rollout_summaries(self, rollout_ids: Sequence[str] | None = None, *, statuses: Sequence[str] | None = None,
                          metadata: dict[str, str] | None = None) -> list[RolloutSummary]:
        """Rows of ``rollout_summary`` in enqueue order: of the given rollouts (None: all), in ``statuses``,
        whose ``metadata[key]`` equals each given string value."""

    @abstractmethod
    def count_rollouts(self, statuses: Sequence[str] | None = None) -> int:
        """How many rollouts have one of ``statuses`` (None: all)."""

    # --- spans ---------------------------------------------------------------------------------
    @abstractmethod
    def add_spans(self, spans: Sequence[Span]) -> int:
        """Validate and store a batch atomically; returns how many were new (a repeated span_id is skipped).

        When this returns, the spans are durable: a SIGKILL afterwards loses none of them.
        """

    def add_span(self, span: Span) -> int:
        return self.add_spans([span])

    @abstractmethod
    def add_span_table(self, tbl: pa.Table) -> int:
        """``add_spans`` for a batch given as an Arrow table with the ``spans`` columns (any subset of the
        optional ones): the bulk and wire path, no Python object per span, the same rules."""

    @abstractmethod
    def spans_reader(self, *, rollout_ids: Sequence[str] | None = None, attempt_ids: Sequence[str] | None = None,
                     kinds: Sequence[str] | None = None, columns: Sequence[str] | None = None, batch_size: int = 1024,
                     span_ids: Sequence[str] | None = None) -> pa.RecordBatchReader:
        """Stream matching rows of the ``spans`` table, ordered by rollout, attempt and sequence."""

    def spans_table(self, **filters: Any) -> pa.Table:
        """All matching spans as one Arrow table (materializes them; prefer ``spans_reader``)."""
        return self.spans_reader(**filters).read_all()

    def spans_df(self, **filters: Any) -> pd.DataFrame:
        """Matching spans as a pandas DataFrame (token columns hold NumPy arrays; materializes them)."""
        return self.spans_table(**filters).to_pandas()

    def iter_spans(self, **filters: Any) -> Iterator[Span]:
        """Typed spans, streamed batch by batch."""
        from spanlab.store.spans import row_to_span

        for batch in self.spans_reader(**filters):
            yield from map(row_to_span, batch.to_pylist())

    # --- resources -----------------------------------------------------------------------------
    @abstractmethod
    def add_resource(self, name: str, payload: dict[str, Any], kind: ResourceKind = "other") -> Resource:
        """Store a new version of resource ``name`` (versions count up from 1)."""

    @abstractmethod
    def get_resource(self, name: str, version: int | None = None) -> Resource:
        """A given version, or the latest when ``version`` is None."""

    @abstractmethod
    def list_resources(self, name: str | None = None) -> list[Resource]: ...

    # --- training metrics ----------------------------------------------------------------------
    @abstractmethod
    def add_metrics(self, run_id: str, algorithm: str, step: int, metrics: dict[str, float]) -> None:
        """Record one training step's metrics (long format: ``train_metrics`` is queryable with SQL)."""

    @abstractmethod
    def metrics(self, run_id: str | None = None) -> list[Metric]:
        """Metrics of one run (None: every run), in the order they were recorded."""

    # --- SQL -----------------------------------------------------------------------------------
    @abstractmethod
    def query(self, sql: str, max_rows: int | None = None) -> pa.Table:
        """One read-only SELECT against the tables and views (a user's SQL; programs use the typed reads)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the store's resources."""

    def __enter__(self) -> StoreAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
