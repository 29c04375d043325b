"""The span store: a hot write store (SQLite) copied into DuckDB tables and views, the store interface,
the server and client.

``add_spans``, from the API to the COMMIT, passes through four files: ``base.py`` (``StoreAPI.add_spans``,
the contract), ``duckdb_store.py`` (``SpanStore.add_spans`` checks the batch and hands it to the writer),
``spans.py`` (spans validated as ``Span`` models and turned into one Arrow table, the store's limits, then
the insert: attempts checked, repeats skipped, sequence numbers filled in) and ``hot.py`` (its ``Writer``
runs the insert in a SQLite transaction of its own, COMMITted with an fsync before the call returns; a
read first copies what DuckDB lacks, so it sees every write that returned). Arrow input (the server's wire
format, ``wire.py``) is validated row by row as ``Span`` models in ``spans.py`` too: one set of span rules.
The queue, resources and metrics are ``queue.py``; DuckDB's tables, views and opening the file ``schema.py``;
user SQL ``sql.py`` (on a file: ``file_query.py``); ``StoreClient`` (``client.py``) is the same interface over the
store server's HTTP.
"""

from spanlab.store.base import StoreAPI
from spanlab.store.client import StoreClient
from spanlab.store.duckdb_store import SpanStore

__all__ = ["SpanStore", "StoreAPI", "StoreClient"]
