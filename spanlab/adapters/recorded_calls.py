"""The drift report's calls read from a store file: successful ``llm_call`` spans with sampled IDs.

Why an adapter: :mod:`spanlab.tito.drift` is token logic that takes the calls given to it; which rows of which
store it reads (and in what order: by attempt, agent role, then call order, as the report walks them) is here.
"""

from __future__ import annotations

from pathlib import Path

from spanlab.store.file_query import run_query
from spanlab.tito.drift import RecordedCall, recorded_calls

_CALLS_SQL = """
SELECT span_id, attempt_id, sequence_id, request_messages, request_tools, response_message, finish_reason,
       prompt_token_ids, response_token_ids, loss_mask, attributes->>'$.tito.mode' AS tito_mode, agent
FROM llm_calls WHERE status = 'ok' AND len(response_token_ids) > 0
ORDER BY attempt_id NULLS LAST, agent NULLS FIRST, sequence_id
"""


def load_calls(db: str | Path) -> list[RecordedCall]:
    """The successful ``llm_call`` spans of a store file with sampled IDs, by attempt and call order."""
    return recorded_calls(run_query(db, _CALLS_SQL))
