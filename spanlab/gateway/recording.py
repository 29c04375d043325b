"""Turning one proxied call into ``llm_call`` spans.

Responses and streams arrive here as a :class:`~spanlab.gateway.records.ResponseRecord`; one
function turns a record into spans, another records a call that got no response at all.

``n > 1``: one span per choice, each a complete (prompt IDs, response IDs) sample that shares the
prompt IDs; ``attributes.choice_index`` and ``attributes.n`` tie them together, the span IDs are
allocated up front (the agent gets them in the ``x-spanlab-span-ids`` header).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from spanlab.gateway.protocol import ENDPOINT_PATHS, AgentAsked, Endpoint, request_params
from spanlab.gateway.records import ResponseRecord
from spanlab.gateway.upstream import UpstreamClient
from spanlab.types import LLMCall, Span, SpanStatus

logger = logging.getLogger(__name__)

SPAN_NAMES: dict[Endpoint, str] = {"chat": "chat.completions", "completions": "completions"}


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """The API an agent spoke when the gateway served it through another one (``/v1/responses`` as chat)."""

    name: str  # the span name, e.g. "responses"
    path: str  # ``attributes.endpoint``
    attributes: dict[str, Any] | None = None  # kept as ``attributes[name]``


@dataclass(slots=True)
class CallContext:
    """Everything about one agent call known before the upstream answers."""

    endpoint: Endpoint
    rollout_id: str | None
    attempt_id: str | None
    body: dict[str, Any]
    asked: AgentAsked
    span_ids: list[str]
    start_time: float
    agent: str | None = None  # the role of a multi-agent attempt (``attributes.agent``)
    extra_attributes: dict[str, Any] | None = None  # e.g. ``tito``: the session facts of a TITO call
    route: RouteInfo | None = None  # set when the agent spoke another API (see RouteInfo)
    upstream: UpstreamClient | None = None  # the engine this call went to (:mod:`.routing`)
    policy_version: str | None = None  # the weights (or the policy's adapter) version served when the call was sent
    policy: str | None = None  # with ``policies``: the policy that answered (``base``: the base model)
    requested_model: str | None = None  # with ``policies``: the ``model`` the agent asked, when another was served

    def engine(self) -> UpstreamClient:
        """The engine the proxy picked for this call; it picks one before any handler sends the call on."""
        if self.upstream is None:
            raise RuntimeError(f"call {self.span_ids[0]}: no engine picked before it was sent on")
        return self.upstream


def base_attributes(ctx: CallContext, upstream_status: int | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "endpoint": ENDPOINT_PATHS[ctx.endpoint],
        "stream": ctx.asked.stream,
        "request_params": request_params(ctx.body),
        "upstream_status": upstream_status,
    }
    if ctx.route is not None:
        attrs["endpoint"] = ctx.route.path
        if ctx.route.attributes:
            attrs[ctx.route.name] = ctx.route.attributes
    if ctx.agent is not None:
        attrs["agent"] = ctx.agent
    if ctx.upstream is not None:
        attrs["replica"] = ctx.upstream.base_url
        attrs["policy_version"] = ctx.policy_version
    if ctx.policy is not None:
        attrs["policy"] = ctx.policy
    if ctx.requested_model is not None:
        attrs["requested_model"] = ctx.requested_model
    prompt = ctx.body.get("prompt")
    if ctx.endpoint == "completions" and isinstance(prompt, str):
        attrs["request_prompt"] = prompt  # token-ID prompts are already in prompt_token_ids
    if ctx.extra_attributes:
        attrs.update(ctx.extra_attributes)
    return attrs


def _llm_fields(ctx: CallContext, model: str | None) -> dict[str, Any]:
    return {
        "model": str(model or ctx.body.get("model") or ""),
        "request_messages": (ctx.body.get("messages") or []) if ctx.endpoint == "chat" else [],
        "request_tools": ctx.body.get("tools"),
    }


def spans_from_record(
    ctx: CallContext,
    record: ResponseRecord,
    *,
    end_time: float,
    upstream_status: int = 200,
    error: dict[str, Any] | None = None,
) -> list[Span]:
    """One span per choice; ``error`` marks them all ``status="error"`` (e.g. a stream cut midway)."""
    n = len(record.choices)
    if n == 0:
        return [
            error_span(
                ctx,
                end_time=end_time,
                upstream_status=upstream_status,
                error=error or {"type": "empty_response", "message": "upstream returned no choices"},
            )
        ]
    spans = []
    for choice in record.choices:
        prompt_ids = choice.prompt_token_ids or record.prompt_token_ids or []
        attrs = base_attributes(ctx, upstream_status)
        attrs.update(response_id=record.response_id, choice_index=choice.index, n=n)
        if not choice.token_ids or not prompt_ids:
            attrs["warning"] = "upstream returned no token IDs (is it vLLM >= 0.10.2?)"
        if error is not None:
            attrs["error"] = error
        usage = record.usage or {}
        if n > 1 and usage:
            attrs["upstream_usage"] = usage  # totals over all choices
        prompt_tokens = usage.get("prompt_tokens", len(prompt_ids))
        completion_tokens = (
            usage["completion_tokens"] if n == 1 and "completion_tokens" in usage else len(choice.token_ids)
        )
        fields = _llm_fields(ctx, record.model)
        fields.update(
            response_message=choice.message,
            finish_reason=choice.finish_reason,
            prompt_token_ids=prompt_ids,
            response_token_ids=choice.token_ids,
            response_logprobs=choice.logprobs,
            loss_mask=choice.loss_mask,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        )
        span_id = ctx.span_ids[choice.index] if choice.index < len(ctx.span_ids) else None
        spans.append(_span(ctx, span_id, fields, attrs, "error" if error else "ok", end_time))
    return spans


def error_span(ctx: CallContext, *, end_time: float, upstream_status: int | None, error: dict[str, Any]) -> Span:
    """The span of a call that produced no response: upstream 4xx/5xx, timeout, unreachable engine."""
    attrs = base_attributes(ctx, upstream_status)
    attrs["error"] = error
    return _span(ctx, ctx.span_ids[0] if ctx.span_ids else None, _llm_fields(ctx, None), attrs, "error", end_time)


def _span(
    ctx: CallContext,
    span_id: str | None,
    fields: dict[str, Any],
    attrs: dict[str, Any],
    status: SpanStatus,
    end_time: float,
) -> Span:
    """Build the span; a field that fails validation is dropped (and named), never the whole call."""
    try:
        llm = LLMCall(**fields)
    except ValidationError as exc:
        logger.warning("recording call %s without some fields that failed validation: %s", span_id, exc)
        attrs["recording_error"] = str(exc)[:4000]
        try:
            llm = LLMCall(**{**fields, "response_logprobs": None})
        except ValidationError:
            llm = LLMCall(model=fields["model"])
            status = "error"
    extra = {"span_id": span_id} if span_id else {}
    return Span(
        rollout_id=ctx.rollout_id,
        attempt_id=ctx.attempt_id,
        name=SPAN_NAMES[ctx.endpoint] if ctx.route is None else ctx.route.name,
        kind="llm_call",
        start_time=ctx.start_time,
        end_time=end_time,
        status=status,
        attributes=attrs,
        llm=llm,
        **extra,
    )
