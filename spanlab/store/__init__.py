"""The span store: DuckDB tables and views, one writer thread, the store interface, the server and client.

A write, from the API to the COMMIT, passes through four files: ``duckdb_store.py`` (``SpanStore.add_spans``
checks the batch and hands it to the writer), ``arrow.py`` (typed spans become one Arrow table),
``spans.py`` (the limits, then the insert: attempts checked, repeats skipped, sequence numbers filled in)
and ``writer.py`` (the writer thread runs it in a transaction with whatever else arrived, COMMITs, then
answers). Arrow input (the store server's wire format) is validated row by row as ``Span`` models in
``arrow.py`` too: one set of span rules. The queue's writes are ``queue.py``; resources, metrics, summaries
``records.py``.
"""

from spanlab.store.base import StoreAPI
from spanlab.store.duckdb_store import SpanStore

__all__ = ["SpanStore", "StoreAPI"]
