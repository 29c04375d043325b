"""One exception root for spanlab.

Each subclass also inherits the matching built-in, so callers that only know Python's own
exceptions (``ValueError``, ``KeyError``) still catch them. Library errors (DuckDB, pydantic) are
translated at the boundary into these, with a message that names what is wrong.
"""

from __future__ import annotations


class SpanlabError(Exception):
    """Root of every error spanlab raises on purpose."""


class ConfigError(SpanlabError, ValueError):
    """A config file or option is invalid; the message names the bad key."""


class StoreError(SpanlabError, RuntimeError):
    """The span store cannot do what was asked (I/O, corrupt file, DuckDB failure)."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file read-write."""


class InvalidSpanError(SpanlabError, ValueError):
    """A span (or rollout, attempt, resource) failed validation; nothing of its batch was stored."""


class NotFoundError(SpanlabError, KeyError):
    """An ID (rollout, attempt, resource) does not exist in the store."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class QueryError(SpanlabError, ValueError):
    """A user SQL query failed or tried something the read-only surface forbids."""


class RolloutWorkersError(SpanlabError, RuntimeError):
    """The workers running a job's rollouts in the background stopped with an error."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as one line of at most ``limit`` characters (type and message), for errors that quote another's."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
