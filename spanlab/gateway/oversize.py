"""A call's span that the store refuses for its size, cut to fit and marked, so that no call is lost for its size.

The gateway's door is the store's limit: a request body over ``StoreAPI.max_json_bytes`` is answered 413 before
the engine is called (``GatewayConfig.max_body_bytes`` follows the store). A body under it can still make one JSON
column of its span a little over it: numbers are stored as Python writes them (``1e5`` becomes ``100000.0``), the
gateway's own attributes sit beside the agent's parameters, and an engine's error body may echo the request. The
store refuses such a span whole; the span writer (:mod:`.writer`) then stores this module's copy of it instead.

What is cut: in each JSON column over the limit, strings longer than a cap (characters) keep their head and say how
much was cut, and lists and objects keep their first cap items, with caps of 65,536, then 4,096, then 256, the first
that fits; a column that still does not fit is emptied (``attributes`` keeps its small top-level entries).
``attributes.truncated`` names each cut column with its size in bytes and how it was cut. Token IDs are never cut
(they are not JSON columns), so a cut span still trains; what is cut is text kept for reading.
"""

from __future__ import annotations

from typing import Any

from spanlab.errors import InvalidSpanError
from spanlab.store.schema import dumps
from spanlab.types import Span

CAPS = (65_536, 4_096, 256)
_LLM_COLUMNS = ("request_messages", "request_tools", "response_message")
_EMPTY: dict[str, Any] = {"request_messages": [], "request_tools": None, "response_message": None}
_SMALL_ATTRIBUTE_BYTES = 4_096  # an entry of ``attributes`` kept when the column is emptied
_MARKER_ROOM = 1_024  # bytes kept free in ``attributes`` for the ``truncated`` entry


def json_bytes(value: Any) -> int:
    """The size the store counts for a JSON column: its compact UTF-8 JSON."""
    text = dumps(value)
    return 0 if text is None else len(text.encode())


def fit_span(span: Span, max_json_bytes: int) -> Span | None:
    """A copy of ``span`` whose JSON columns are at most ``max_json_bytes`` each, the cuts named in
    ``attributes.truncated``; None when no column is over (then the store refused it for another reason, which
    cutting cannot mend) or a column cannot be measured."""
    try:
        columns = {"attributes": span.attributes}
        if span.llm is not None:
            columns |= {name: getattr(span.llm, name) for name in _LLM_COLUMNS}
        over = {name: n for name, value in columns.items() if (n := json_bytes(value)) > max_json_bytes}
        if not over:
            return None
        cuts: dict[str, dict[str, Any]] = {}
        llm_update: dict[str, Any] = {}
        for name in _LLM_COLUMNS:
            if name in over:
                llm_update[name], how = _fit(columns[name], max_json_bytes, lambda _, n=name: _EMPTY[n])
                cuts[name] = {"json_bytes": over[name], "cut": how}
        attributes = {k: v for k, v in span.attributes.items() if k != "truncated"}
        if json_bytes(attributes) > max_json_bytes - _MARKER_ROOM:
            attributes, how = _fit(attributes, max_json_bytes - _MARKER_ROOM, _small_entries)
            cuts["attributes"] = {"json_bytes": over.get("attributes", json_bytes(span.attributes)), "cut": how}
    except InvalidSpanError:  # NaN or nesting: not a size the store refused
        return None
    update: dict[str, Any] = {"attributes": {**attributes, "truncated": cuts}}
    if llm_update:
        assert span.llm is not None
        update["llm"] = span.llm.model_copy(update=llm_update)
    return span.model_copy(update=update)


def _fit(value: Any, limit: int, emptied: Any) -> tuple[Any, str]:
    for cap in CAPS:
        cut = _cut(value, cap)
        if json_bytes(cut) <= limit:
            return cut, f"strings, lists and objects over {cap} characters or items cut"
    return emptied(value), "emptied"


def _cut(value: Any, cap: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= cap else f"{value[:cap]}…[{len(value) - cap} characters cut]"
    if isinstance(value, list):
        return [_cut(item, cap) for item in value[:cap]]
    if isinstance(value, dict):
        return {_cut(key, cap): _cut(item, cap) for key, item in list(value.items())[:cap]}
    return value


def _small_entries(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if json_bytes(v) <= _SMALL_ATTRIBUTE_BYTES}
