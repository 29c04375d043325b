"""TITO mode's translation between the agent's chat API and vLLM's token-in completions route.

In TITO mode the gateway builds the prompt itself (the session buffer) and sends it as token IDs to
``/v1/completions``; the agent still speaks ``/v1/chat/completions``. These pure functions map the chat
request's sampling parameters onto a completions body, and the completion back onto a chat.completion
(or its SSE chunks: on this fallback path a streamed TITO call is generated unstreamed, then sent as
synthesized events, since the tool-call parse needs the whole text; the engine path streams token by token,
:mod:`.stream`). Requests TITO cannot serve faithfully get a reason from
:func:`per_call_reason` and go the per-call way (forwarded to the chat route, recorded as before).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import Response

from spanlab.gateway.outcomes import SPAN_IDS_HEADER, CallOutcomes
from spanlab.gateway.protocol import AgentAsked, dumps
from spanlab.gateway.recording import CallContext, spans_from_record
from spanlab.gateway.records import ResponseRecord

# Chat-only fields: the gateway renders the prompt itself, maps logprobs and max tokens, and parses tool calls.
_CHAT_ONLY = frozenset({
    "messages", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "max_completion_tokens",
    "stream", "stream_options", "return_token_ids", "response_format", "functions", "function_call", "store",
    "metadata", "modalities", "audio", "prediction", "web_search_options", "service_tier", "reasoning_effort",
    "include_reasoning", "add_special_tokens", "mm_processor_kwargs", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "documents", "echo",
})
# Request fields that change what the engine would render; the buffer cannot honour them.
_RENDER_FIELDS = ("chat_template", "chat_template_kwargs", "continue_final_message", "documents", "echo")


def per_call_reason(body: dict[str, Any]) -> str | None:
    """Why this chat request must be served per call (None: TITO can serve it).

    ``n > 1``: several samples cannot all continue one buffer. Forced ``tool_choice`` and JSON
    ``response_format`` are guided decoding on vLLM's chat route (their output is not Hermes text).
    Template options and non-text content parts change the render the buffer would have to match.
    """
    if body.get("n", 1) != 1:
        return "n > 1 (several samples cannot continue one buffer)"
    if body.get("tool_choice") not in (None, "auto", "none"):
        return "tool_choice forces a call (guided decoding on the chat route)"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "response_format needs guided decoding on the chat route"
    if body.get("add_generation_prompt") is False:
        return "add_generation_prompt=false"
    if any(key in body for key in _RENDER_FIELDS):
        return "the request changes how the chat template renders"
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            not isinstance(part, str) and (not isinstance(part, dict) or part.get("type", "text") != "text")
            for part in content
        ):
            return "non-text content parts"
    return None


def parses_tools(body: dict[str, Any]) -> bool:
    """Tool calls are parsed when tools were offered and not switched off, as vLLM's chat route does."""
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


def completion_body(body: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
    """The completions request for a chat request whose prompt the gateway built as ``prompt_ids``."""
    upstream = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
    upstream["prompt"] = prompt_ids
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is None:
        upstream["max_tokens"] = body["max_completion_tokens"]
    upstream["logprobs"] = int(body.get("top_logprobs") or 0) if body.get("logprobs") else 0
    upstream["return_token_ids"] = True
    if parses_tools(body) and "skip_special_tokens" not in body:
        upstream["skip_special_tokens"] = False  # as vLLM's hermes parser asks: tool tags may be special tokens
    return upstream


def chat_logprobs(lp: dict[str, Any] | None) -> dict[str, Any] | None:
    """Completions logprobs (parallel lists) as chat logprobs (one entry per token)."""
    if not lp or lp.get("tokens") is None:
        return None
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    content = []
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], tops, strict=False):
        entry = {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
        for alt, alt_lp in (top or {}).items():
            entry["top_logprobs"].append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode("utf-8"))})
        content.append(entry)
    return {"content": content}


def chat_response(
    completion: dict[str, Any], message: dict[str, Any], finish_reason: str | None, asked: AgentAsked
) -> dict[str, Any]:
    """The chat.completion the agent gets; token IDs and logprobs only when it asked for them."""
    choice_in = completion["choices"][0]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs(choice_in.get("logprobs")) if asked.logprobs else None,
        "finish_reason": finish_reason,
        "stop_reason": choice_in.get("stop_reason"),
    }
    response_id = str(completion.get("id") or "")
    out: dict[str, Any] = {
        "id": "chatcmpl-" + response_id.removeprefix("cmpl-"),
        "object": "chat.completion",
        "created": completion.get("created") or int(time.time()),
        "model": completion.get("model"),
        "choices": [choice],
        "usage": completion.get("usage"),
    }
    if asked.token_ids:
        out["prompt_token_ids"] = choice_in.get("prompt_token_ids")
        choice["token_ids"] = choice_in.get("token_ids")
    return out


def sse_events(response: dict[str, Any], include_usage: bool) -> bytes:
    """A finished chat.completion as the SSE stream vLLM would have sent (role, content, tool calls, finish)."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], **extra: Any) -> bytes:
        event = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}]}
        return b"data: " + dumps(event) + b"\n\n"

    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}]}
    if "prompt_token_ids" in response:
        first["prompt_token_ids"] = response["prompt_token_ids"]
    events = [b"data: " + dumps(first) + b"\n\n"]
    # The sampled IDs and logprobs go with the first chunk that carries output (content, calls, or the finish).
    pending: dict[str, Any] = {"logprobs": choice["logprobs"]}
    if "token_ids" in choice:
        pending["token_ids"] = choice["token_ids"]
    if message.get("content"):
        events.append(chunk({"content": message["content"]}, **pending))
        pending = {}
    calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls") or ())]
    if calls:
        events.append(chunk({"tool_calls": calls}, **pending))
        pending = {}
    events.append(chunk({}, **{"finish_reason": choice["finish_reason"], "stop_reason": choice.get("stop_reason"),
                               **pending}))
    if include_usage:
        events.append(b"data: " + dumps({**base, "choices": [], "usage": response["usage"]}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


async def record_span(outcomes: CallOutcomes, ctx: CallContext, record: ResponseRecord,
                      attrs: dict[str, Any]) -> Response | None:
    """Store the call's span with its ``tito`` attributes; None once stored, else the refusal to send instead."""
    ctx.extra_attributes = {"tito": attrs}
    end = time.time()
    return await outcomes.record(lambda: spans_from_record(ctx, record, end_time=end))


async def record_and_answer(outcomes: CallOutcomes, ctx: CallContext, record: ResponseRecord, reply: dict[str, Any],
                            attrs: dict[str, Any]) -> Response:
    """Store the call's span (a refusal if it could not be), then answer the agent: JSON, or SSE if it streamed.

    Both TITO paths (the fallback's and the engine's) end here, so the span is durable before the agent hears;
    a streamed engine-path call stores it through :func:`record_span` before its ``[DONE]``."""
    if (refused := await record_span(outcomes, ctx, record, attrs)) is not None:
        return refused
    headers = {SPAN_IDS_HEADER: ctx.span_ids[0]}
    if ctx.asked.stream:
        usage = bool((ctx.body.get("stream_options") or {}).get("include_usage"))
        return Response(sse_events(reply, usage), 200, media_type="text/event-stream", headers=headers)
    return Response(dumps(reply), 200, media_type="application/json", headers=headers)
