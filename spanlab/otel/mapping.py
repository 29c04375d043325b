"""OTLP spans as store spans: which rollout and attempt, which kind, which fields.

Attribution: ``spanlab.rollout_id`` and ``spanlab.attempt_id`` on the span, else on its resource (a
process that runs one attempt can set them once on its ``TracerProvider``'s resource; a worker running
many sets them per span, e.g. on the agent's root span and its children). Agent Lightning's names
(``agentlightning.rollout_id``/``attempt_id``, ``agentlightning.reward.0.value``) are read too. Without
them a span is stored unattributed (``rollout_id`` null), as the gateway stores unattributed calls.
``spanlab.agent`` names the role of a multi-agent attempt (``attributes.agent``), as the gateway's
``/agent/{role}`` does.

Kinds: a GenAI call (``gen_ai.operation.name`` chat / text_completion / generate_content, or GenAI request
attributes without an operation) is an ``llm_call`` (:mod:`.genai`); ``execute_tool`` a ``tool_call``; a
span with a numeric ``spanlab.reward`` a ``reward`` (named by ``spanlab.reward_name``); anything else a
``custom`` span. IDs: ``otel-{trace_id}-{span_id}`` (hex), the parent likewise, so an exporter's retry of a
batch stores nothing twice (the store skips a repeated ``span_id``). Every other attribute is kept in
``attributes``; ``attributes.otel`` holds trace and span IDs, kind, scope, resource attributes and events.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from pydantic import ValidationError

from spanlab.errors import InvalidSpanError
from spanlab.otel.genai import consumed, is_llm_call, llm_fields
from spanlab.types import LLMCall, Reward, Span

# Each field's keys in order: spanlab's own, then Agent Lightning's (its OTel tracer's resource attributes
# and reward attributes), so an agent instrumented for Agent Lightning needs no change.
ROLLOUT_KEYS = ("spanlab.rollout_id", "agentlightning.rollout_id")
ATTEMPT_KEYS = ("spanlab.attempt_id", "agentlightning.attempt_id")
AGENT_KEY = "spanlab.agent"
REWARD_KEYS = ("spanlab.reward", "agentlightning.reward.0.value")
REWARD_NAME_KEYS = ("spanlab.reward_name", "agentlightning.reward.0.name")
_ATTRIBUTION = frozenset({*ROLLOUT_KEYS, *ATTEMPT_KEYS, AGENT_KEY, *REWARD_KEYS, *REWARD_NAME_KEYS})
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR
_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value"})


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as plain JSON (bytes as hex)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        values = value.array_value.values
        kind = values[0].WhichOneof("value") if values else None
        if kind in _SCALARS:  # OTLP arrays are homogeneous: one lookup per element (token IDs: thousands)
            return list(map(attrgetter(kind), values))
        return [any_value(v) for v in values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _first(keys: tuple[str, ...], attrs: dict[str, Any], resource: dict[str, Any]) -> Any:
    """The span's value of the first key it has, else the resource's (a span can override its process)."""
    for where in (attrs, resource):
        for key in keys:
            if where.get(key) is not None:
                return where[key]
    return None


def _span_id(trace_id: bytes, span_id: bytes) -> str:
    return f"otel-{trace_id.hex()}-{span_id.hex()}"


def _seconds(nanos: int) -> float | None:
    return nanos / 1e9 if nanos else None


def to_span(span: Any, resource: dict[str, Any], scope: str) -> Span:
    """One OTLP span (protobuf message) under its resource's attributes."""
    attrs = attributes(span.attributes)
    rollout_id, attempt_id = _first(ROLLOUT_KEYS, attrs, resource), _first(ATTEMPT_KEYS, attrs, resource)
    agent = _first((AGENT_KEY,), attrs, resource)
    reward_value = _first(REWARD_KEYS, attrs, {})
    kept: dict[str, Any] = {k: v for k, v in attrs.items() if not consumed(k) and k not in _ATTRIBUTION}
    kept["otel"] = {
        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(), "kind": _KINDS.get(span.kind, span.kind),
        "scope": scope, "resource": resource,
        "events": [{"name": e.name, "time": _seconds(e.time_unix_nano), "attributes": attributes(e.attributes)}
                   for e in span.events],
    }
    if span.status.message:
        kept["otel"]["status_message"] = span.status.message
    if agent is not None:
        kept["agent"] = str(agent)
    llm = reward = None
    if is_llm_call(attrs):
        kind, llm = "llm_call", LLMCall(**llm_fields(attrs))
    elif attrs.get("gen_ai.operation.name") == "execute_tool":
        kind = "tool_call"
    elif isinstance(reward_value, (int, float)) and not isinstance(reward_value, bool):
        kind, reward = "reward", Reward(name=str(_first(REWARD_NAME_KEYS, attrs, {}) or "reward"), value=reward_value)
    else:
        kind = "custom"
    return Span(
        rollout_id=None if rollout_id is None else str(rollout_id),
        attempt_id=None if attempt_id is None else str(attempt_id),
        span_id=_span_id(span.trace_id, span.span_id),
        parent_id=_span_id(span.trace_id, span.parent_span_id) if span.parent_span_id else None,
        name=span.name or kind, kind=kind,
        start_time=_seconds(span.start_time_unix_nano) or 0.0, end_time=_seconds(span.end_time_unix_nano),
        status="error" if span.status.code == _ERROR else "ok",
        attributes=kept, llm=llm, reward=reward,
    )


def to_spans(request: Any) -> list[Span]:
    """Every span of an ``ExportTraceServiceRequest``, by start time (the store numbers them in this order)."""
    out = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                try:
                    out.append(to_span(span, resource, scope))
                except (ValidationError, TypeError, ValueError) as exc:
                    raise InvalidSpanError(f"OTLP span {span.name!r} ({_span_id(span.trace_id, span.span_id)}) "
                                           f"cannot be stored; nothing of this request was: {exc}") from exc
    return sorted(out, key=lambda s: s.start_time)
