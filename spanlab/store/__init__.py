"""The span store: DuckDB tables and views, the store interface, and the read-only SQL surface."""

from spanlab.store.base import StoreAPI
from spanlab.store.duckdb_store import SpanStore

__all__ = ["SpanStore", "StoreAPI"]
