"""The store interface every component programs against.

``SpanStore`` (DuckDB, in-process) implements it; the HTTP client of the store server implements the
same methods, so a gateway, runner or algorithm works with either without knowing which.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

from spanlab.types import (
    Attempt,
    FinishedAttemptStatus,
    Resource,
    ResourceKind,
    Rollout,
    RolloutConfig,
    RolloutMode,
    Span,
)


class StoreAPI(ABC):
    """Queue, spans and resources. Token-heavy reads return Arrow, never lists of Python ints."""

    # --- rollout queue -------------------------------------------------------------------------
    @abstractmethod
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Add rollouts (status ``queuing``); an existing ``rollout_id`` is an error."""

    def enqueue_one(
        self,
        input: Any,
        *,
        mode: RolloutMode = "train",
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        resources_version: str | None = None,
    ) -> Rollout:
        rollout = Rollout(
            input=input,
            mode=mode,
            config=config or RolloutConfig(),
            metadata=metadata or {},
            resources_version=resources_version,
        )
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
    def list_rollouts(
        self, *, status: str | None = None, mode: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[Rollout]: ...

    @abstractmethod
    def list_attempts(self, rollout_id: str) -> list[Attempt]: ...

    # --- spans ---------------------------------------------------------------------------------
    @abstractmethod
    def add_spans(self, spans: Sequence[Span]) -> int:
        """Validate and store a batch atomically; returns how many were new (a repeated span_id is skipped).

        When this returns, the spans are durable: a SIGKILL afterwards loses none of them.
        """

    def add_span(self, span: Span) -> int:
        return self.add_spans([span])

    @abstractmethod
    def spans_reader(
        self,
        *,
        rollout_ids: Sequence[str] | None = None,
        attempt_ids: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
    ) -> pa.RecordBatchReader:
        """Stream matching rows of the ``spans`` table, ordered by attempt and sequence."""

    def spans_table(self, **filters: Any) -> pa.Table:
        """All matching spans as one Arrow table (materializes them; prefer ``spans_reader``)."""
        return self.spans_reader(**filters).read_all()

    def spans_df(self, **filters: Any) -> pd.DataFrame:
        """Matching spans as a pandas DataFrame (token columns hold NumPy arrays; materializes them)."""
        return self.spans_table(**filters).to_pandas()

    def iter_spans(self, **filters: Any) -> Iterator[Span]:
        """Typed spans, streamed batch by batch."""
        from spanlab.store.arrow import batches_to_spans

        yield from batches_to_spans(self.spans_reader(**filters))

    # --- resources -----------------------------------------------------------------------------
    @abstractmethod
    def add_resource(self, name: str, payload: dict[str, Any], kind: ResourceKind = "other") -> Resource:
        """Store a new version of resource ``name`` (versions count up from 1)."""

    @abstractmethod
    def get_resource(self, name: str, version: int | None = None) -> Resource:
        """A given version, or the latest when ``version`` is None."""

    @abstractmethod
    def list_resources(self, name: str | None = None) -> list[Resource]: ...

    # --- SQL -----------------------------------------------------------------------------------
    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """SQL against the tables and views; small results (use LIMIT). In-process this is the owner's
        connection (writes work); ``StoreClient`` goes through the server's SELECT-only ``/sql``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the store's resources."""

    def __enter__(self) -> StoreAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
