"""``StoreClient``: the store API over HTTP, for workers in other processes or on other machines.

Span batches go as Arrow IPC. Calls that are safe to repeat (reads, span writes, which the server
deduplicates by span_id, heartbeats, finishing an attempt) are retried across connection failures and
server restarts; the others only when the request never reached the server. HTTP is urllib3's connection
pool: a runner makes two calls per rollout, and a lighter client than httpx keeps each call cheap.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import pyarrow as pa
import pyarrow.ipc as ipc
import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError

from spanlab.errors import InvalidSpanError, NotFoundError, QueryError, StoreError
from spanlab.store.base import Metric, RolloutSummary, StoreAPI
from spanlab.store.schema import MAX_JSON_BYTES
from spanlab.store.spans import spans_to_arrow
from spanlab.store.sql_answer import SqlRows, read_answer
from spanlab.store.wire import ARROW_STREAM, SQL_COLUMNS_HEADER, table_to_bytes
from spanlab.types import Attempt, FinishedAttemptStatus, Resource, ResourceKind, Rollout, Span

logger = logging.getLogger(__name__)

_ERRORS = {400: QueryError, 404: NotFoundError, 413: InvalidSpanError, 422: InvalidSpanError}


class StoreClient(StoreAPI):
    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 60.0,
                 retry_for_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        try:
            parts = urlsplit(self.url)
            _ = parts.port  # raises on a port past 65535 or not a number
        except ValueError as exc:
            raise StoreError(f"store URL {url!r} is not http(s)://host[:port]: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"store URL {url!r} is not http(s)://host[:port]")
        self._prefix = parts.path
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = urllib3.connection_from_url(self.url, maxsize=8, block=False, retries=False, timeout=
                                                     urllib3.Timeout(connect=min(timeout_s, 10.0), read=timeout_s))
        except (ValueError, urllib3.exceptions.LocationParseError) as exc:
            raise StoreError(f"store URL {url!r} is not http(s)://host[:port]: {exc}") from None
        self.retry_for_s = retry_for_s
        self._max_json_bytes: int | None = None

    @property  # type: ignore[override]  # StoreAPI's is a class attribute; the server's store says its own
    def max_json_bytes(self) -> int:
        """The server's store's largest JSON column of a span (its ``/health`` says it), asked once; a server that
        does not say has the default."""
        if self._max_json_bytes is None:
            limit = self._json("GET", "/health").get("max_json_bytes")
            self._max_json_bytes = limit if isinstance(limit, int) and limit > 0 else MAX_JSON_BYTES
        return self._max_json_bytes

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: bytes | None = None,
                 headers: dict[str, str] | None = None, stream: bool = False) -> urllib3.BaseHTTPResponse:
        url = self._prefix + path + ("?" + urlencode(params, doseq=True) if params else "")
        return self._http.urlopen(method, url, body=body, headers={**self._headers, **(headers or {})},
                                  preload_content=not stream, redirect=False)

    def _call(self, method: str, path: str, *, idempotent: bool, **kw: Any) -> urllib3.BaseHTTPResponse:
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.05
        while True:
            try:
                resp = self._request(method, path, **kw)
            except NewConnectionError as exc:  # never reached the server: always safe to retry
                err: Exception = exc
            except HTTPError as exc:  # may have reached it
                if not idempotent:
                    raise StoreError(f"store server {self.url}: {exc}") from exc
                err = exc
            else:
                if resp.status < 500 or not idempotent:
                    return self._check(resp)
                err = StoreError(f"store server {self.url} answered {resp.status}: {_detail(resp)}")
            if time.monotonic() + delay > deadline:
                if isinstance(err, StoreError):  # it answered, with an error
                    raise err
                raise StoreError(f"store server {self.url} unreachable: {_reason(err)}") from err
            logger.warning("store server call %s %s failed (%s); retrying", method, path, err)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    @staticmethod
    def _check(resp: urllib3.BaseHTTPResponse) -> urllib3.BaseHTTPResponse:
        if 200 <= resp.status < 300:
            return resp
        detail = _detail(resp)
        if resp.status == 401:
            raise StoreError(f"store server refused the request: {detail}")
        raise _ERRORS.get(resp.status, StoreError)(detail)

    def _json(self, method: str, path: str, *, idempotent: bool = True, json_body: Any = None, **kw: Any) -> Any:
        if json_body is not None:
            kw |= {"body": json.dumps(json_body).encode(), "headers": {"Content-Type": "application/json"}}
        data = self._call(method, path, idempotent=idempotent, **kw).data
        try:
            return json.loads(data)
        except ValueError:
            raise StoreError(f"{self.url} answered {path} with a body that is not JSON ({_one_line(data[:80])}): "
                             "is it a spanlab store server?") from None

    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        body = [Rollout.model_validate(r).model_dump(mode="json") for r in rollouts]
        return [Rollout.model_validate(r) for r in self._json("POST", "/rollouts", idempotent=False, json_body=body)]

    def dequeue(self, worker_id: str | None = None, mode: str | None = None) -> tuple[Rollout, Attempt] | None:
        got = self._json("POST", "/dequeue", idempotent=False, json_body={"worker_id": worker_id, "mode": mode})
        return None if got is None else (Rollout.model_validate(got["rollout"]), Attempt.model_validate(got["attempt"]))

    def heartbeat(self, attempt_id: str) -> Attempt:
        return Attempt.model_validate(self._json("POST", f"/attempts/{attempt_id}/heartbeat"))

    def finish_attempt(self, attempt_id: str, status: FinishedAttemptStatus, spans: Sequence[Span] = ()) -> Rollout:
        if not spans:
            return Rollout.model_validate(self._json("POST", f"/attempts/{attempt_id}/finish",
                                                     json_body={"status": status}))
        got = self._json("POST", f"/attempts/{attempt_id}/finish/arrow", params={"status": status},
                         body=table_to_bytes(spans_to_arrow(spans)), headers={"Content-Type": ARROW_STREAM})
        return Rollout.model_validate(got)

    def expire_stale_attempts(self) -> list[Attempt]:
        return [Attempt.model_validate(a) for a in self._json("POST", "/expire")]

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._json("POST", f"/rollouts/{rollout_id}/cancel"))

    def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._json("GET", f"/rollouts/{rollout_id}"))

    def get_attempt(self, attempt_id: str) -> Attempt:
        return Attempt.model_validate(self._json("GET", f"/attempts/{attempt_id}"))

    def list_rollouts(self, *, status: str | None = None, mode: str | None = None, limit: int = 1000,
                      offset: int = 0) -> list[Rollout]:
        params = {k: v for k, v in {"status": status, "mode": mode, "limit": limit, "offset": offset}.items()
                  if v is not None}
        return [Rollout.model_validate(r) for r in self._json("GET", "/rollouts", params=params)]

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        return [Attempt.model_validate(a) for a in self._json("GET", f"/rollouts/{rollout_id}/attempts")]

    def last_attempts(self, rollout_ids: Sequence[str]) -> list[tuple[Rollout, Attempt]]:
        if not rollout_ids:
            return []
        got = self._json("POST", "/rollouts/last-attempts", json_body={"rollout_ids": list(rollout_ids)})
        return [(Rollout.model_validate(g["rollout"]), Attempt.model_validate(g["attempt"])) for g in got]

    def rollout_summaries(self, rollout_ids: Sequence[str] | None = None, *, statuses: Sequence[str] | None = None,
                          metadata: dict[str, str] | None = None) -> list[RolloutSummary]:
        body = {"rollout_ids": None if rollout_ids is None else list(rollout_ids),
                "statuses": None if statuses is None else list(statuses), "metadata": metadata}
        return [RolloutSummary.model_validate(r) for r in self._json("POST", "/rollouts/summaries", json_body=body)]

    def count_rollouts(self, statuses: Sequence[str] | None = None) -> int:
        params = {} if statuses is None else {"statuses": list(statuses)}
        return int(self._json("GET", "/rollout-count", params=params))

    def add_spans(self, spans: Sequence[Span]) -> int:
        return self.add_span_table(spans_to_arrow(spans)) if spans else 0

    def add_span_table(self, tbl: pa.Table) -> int:
        resp = self._json("POST", "/spans/arrow", body=table_to_bytes(tbl), headers={"Content-Type": ARROW_STREAM})
        return int(resp["inserted"])

    def spans_reader(self, *, rollout_ids: Sequence[str] | None = None, attempt_ids: Sequence[str] | None = None,
                     kinds: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                     batch_size: int = 1024, span_ids: Sequence[str] | None = None) -> pa.RecordBatchReader:
        lists = {"rollout_ids": rollout_ids, "attempt_ids": attempt_ids, "kinds": kinds, "columns": columns,
                 "span_ids": span_ids}
        params = {"batch_size": batch_size} | {k: list(v) for k, v in lists.items() if v is not None}
        resp = self._call("GET", "/spans/arrow", idempotent=True, params=params, stream=True)
        return ipc.open_stream(resp)  # urllib3 reads exactly what pyarrow asks for, across HTTP chunks

    def add_resource(self, name: str, payload: dict[str, Any], kind: ResourceKind = "other") -> Resource:
        body = {"name": name, "payload": payload, "kind": kind}
        return Resource.model_validate(self._json("POST", "/resources", idempotent=False, json_body=body))

    def get_resource(self, name: str, version: int | None = None) -> Resource:
        params = {"version": version} if version is not None else {}
        return Resource.model_validate(self._json("GET", f"/resources/{name}", params=params))

    def list_resources(self, name: str | None = None) -> list[Resource]:
        params = {"name": name} if name else {}
        return [Resource.model_validate(r) for r in self._json("GET", "/resources", params=params)]

    def add_metrics(self, run_id: str, algorithm: str, step: int, metrics: dict[str, float]) -> None:
        body = {"run_id": run_id, "algorithm": algorithm, "step": int(step),
                "metrics": {str(k): None if v is None else float(v) for k, v in metrics.items()}}
        self._json("POST", "/metrics", idempotent=False, json_body=body)

    def metrics(self, run_id: str | None = None) -> list[Metric]:
        params = {} if run_id is None else {"run_id": run_id}
        return [Metric.model_validate(m) for m in self._json("GET", "/metrics", params=params)]

    def query(self, sql: str, max_rows: int | None = None) -> pa.Table:
        """Rows of one read-only query; an empty result keeps its columns (from the server's header), as a file's
        query does; a server with no ``/sql`` of the store server's shape is named as such."""
        return self.query_rows(sql, max_rows).to_arrow()

    def query_rows(self, sql: str, max_rows: int | None = None) -> SqlRows:
        """:meth:`query`'s answer as the JSON the server sent (what ``spanlab sql --url`` prints), checked to be a
        store's (:func:`~spanlab.store.sql_answer.read_answer`)."""
        body: dict[str, Any] = {"query": sql} | ({} if max_rows is None else {"max_rows": max_rows})
        try:
            resp = self._call("POST", "/sql", idempotent=True, body=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json"})
        except NotFoundError:
            raise StoreError(f"{self.url} has no /sql route (404): is it a spanlab store server?") from None
        return read_answer(self.url, resp.data, resp.headers.get(SQL_COLUMNS_HEADER))


def _text(resp: urllib3.BaseHTTPResponse) -> str:
    return (resp.data or b"").decode(errors="replace")


def _detail(resp: urllib3.BaseHTTPResponse) -> str:
    """An error answer's reason in one line: the store server's JSON ``detail``, else the start of the body."""
    try:
        detail = json.loads(resp.data).get("detail", _text(resp))
    except (ValueError, AttributeError):
        return f"{_one_line(_text(resp), 120)} (not JSON: is it a spanlab store server?)"
    return _one_line(str(detail))


def _one_line(text: str | bytes, limit: int = 300) -> str:
    """An error body (HTML pages included) as one line of at most ``limit`` characters."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(err: Exception) -> str:
    """Why a call failed, without urllib3's connection repr: ``[Errno 111] Connection refused``."""
    if isinstance(err, NewConnectionError):
        return _one_line(str(err).rsplit("): ", 1)[-1])
    return _one_line(str(err))
