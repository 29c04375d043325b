"""Responses and streams reduced to the few fields spans need.

A non-streaming vLLM response goes through :func:`record_from_response`; a stream's chunks through
:class:`StreamAccumulator`, which folds them back into the same :class:`ResponseRecord`. Everything
downstream (``recording.spans_from_record``) sees one shape, so a streamed call and the same call
unstreamed are recorded identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spanlab.gateway.protocol import Endpoint


@dataclass(slots=True)
class ChoiceRecord:
    index: int
    message: dict[str, Any]
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None  # completions: per choice; chat: on the response
    loss_mask: list[int] | None = None  # TITO calls: the segment's mask over prompt + response


@dataclass(slots=True)
class ResponseRecord:
    """The parts of a response the spans need, whichever way it arrived."""

    response_id: str | None = None
    model: str | None = None
    prompt_token_ids: list[int] | None = None
    usage: dict[str, Any] | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)


def clean_message(message: dict[str, Any]) -> dict[str, Any]:
    """Drop vLLM's null placeholders (refusal, audio, ...) but keep ``content`` even when null."""
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def sampled_logprobs(endpoint: Endpoint, lp: dict[str, Any] | None) -> list[float] | None:
    if not lp:
        return None
    if endpoint == "chat":
        content = lp.get("content")
        return None if content is None else [e["logprob"] for e in content]
    return lp.get("token_logprobs")


def record_from_response(endpoint: Endpoint, response: dict[str, Any]) -> ResponseRecord:
    """A non-streaming vLLM response as a record."""
    choices = []
    for c in response.get("choices") or ():
        if endpoint == "chat":
            message = clean_message(c.get("message") or {})
        else:
            message = {"role": "assistant", "content": c.get("text")}
        choices.append(
            ChoiceRecord(
                index=c.get("index", 0),
                message=message,
                finish_reason=c.get("finish_reason"),
                token_ids=c.get("token_ids") or [],
                logprobs=sampled_logprobs(endpoint, c.get("logprobs")),
                prompt_token_ids=c.get("prompt_token_ids"),
            )
        )
    return ResponseRecord(
        response_id=response.get("id"),
        model=response.get("model"),
        prompt_token_ids=response.get("prompt_token_ids"),
        usage=response.get("usage"),
        choices=sorted(choices, key=lambda c: c.index),
    )


class StreamAccumulator:
    """Folds SSE chunks (already JSON-decoded) into a :class:`ResponseRecord`.

    Content, reasoning and other string deltas are concatenated; tool-call deltas are merged by their
    ``index`` (name once, arguments appended); ``token_ids`` and logprobs are appended per chunk;
    ``prompt_token_ids`` is taken from the first chunk that carries it. An ``error`` object inside the
    stream (vLLM sends one when generation fails midway) is kept in :attr:`error`.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.record = ResponseRecord()
        self.error: dict[str, Any] | None = None
        self._choices: dict[int, ChoiceRecord] = {}
        self._tool_calls: dict[int, dict[int, dict[str, Any]]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        rec = self.record
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
        rec.response_id = rec.response_id or chunk.get("id")
        rec.model = rec.model or chunk.get("model")
        if rec.prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
            rec.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            rec.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            self._add_choice(c)

    def _add_choice(self, c: dict[str, Any]) -> None:
        idx = c.get("index", 0)
        choice = self._choices.get(idx)
        if choice is None:
            choice = self._choices[idx] = ChoiceRecord(index=idx, message={"role": "assistant"})
        if self.endpoint == "chat":
            self._add_delta(idx, choice.message, c.get("delta") or {})
        else:
            choice.message["content"] = (choice.message.get("content") or "") + (c.get("text") or "")
            if choice.prompt_token_ids is None and c.get("prompt_token_ids") is not None:
                choice.prompt_token_ids = c["prompt_token_ids"]
        if c.get("token_ids"):
            choice.token_ids.extend(c["token_ids"])
        lps = sampled_logprobs(self.endpoint, c.get("logprobs"))
        if lps is not None:
            choice.logprobs = (choice.logprobs or []) + lps
        if c.get("finish_reason") is not None:
            choice.finish_reason = c["finish_reason"]

    def _add_delta(self, idx: int, message: dict[str, Any], delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key == "tool_calls":
                calls = self._tool_calls.setdefault(idx, {})
                for tc in value or ():
                    self._merge_tool_call(calls, tc)
            elif key == "role":
                message["role"] = value or message.get("role")
            elif isinstance(value, str):
                message[key] = (message.get(key) or "") + value
            elif value is not None:
                message[key] = value

    @staticmethod
    def _merge_tool_call(calls: dict[int, dict[str, Any]], tc: dict[str, Any]) -> None:
        call = calls.setdefault(
            tc.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if tc.get("id"):
            call["id"] = tc["id"]
        if tc.get("type"):
            call["type"] = tc["type"]
        fn = tc.get("function") or {}
        if fn.get("name") and not call["function"]["name"]:
            call["function"]["name"] = fn["name"]
        if fn.get("arguments"):
            call["function"]["arguments"] += fn["arguments"]

    def result(self) -> ResponseRecord:
        for idx, calls in self._tool_calls.items():
            self._choices[idx].message["tool_calls"] = [calls[k] for k in sorted(calls)]
        for choice in self._choices.values():
            choice.message.setdefault("content", None)
            choice.message = clean_message(choice.message)
        self.record.choices = [self._choices[k] for k in sorted(self._choices)]
        return self.record
