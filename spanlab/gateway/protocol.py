"""What the gateway changes in OpenAI/vLLM bodies on the way up, and undoes on the way back.

Upstream, every generation request gets ``return_token_ids: true`` (so vLLM returns the exact prompt
and sampled IDs) and sampled-token logprobs. The agent must not notice: fields it did not ask for are
removed from what it gets back, so it sees an ordinary OpenAI response. Everything else the agent
sent is forwarded untouched. Pure functions on JSON dicts; no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from spanlab.errors import SpanlabError
from spanlab.jsonpolicy import JSONPolicyError, decode

Endpoint = Literal["chat", "completions"]

ENDPOINT_PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

# Keys of the agent's body that are payload, not sampling parameters; everything else is kept in the
# span's ``attributes.request_params`` (temperature etc. matter for importance weights later).
_PAYLOAD_KEYS = frozenset({"messages", "tools", "prompt"})


# The most choices one call may ask for (OpenAI's own bound): the gateway makes a span ID per choice before it
# calls the engine, so an unbounded ``n`` (2**31) would exhaust memory before any engine refused it.
MAX_N = 128
_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


def parse_request(raw: bytes) -> dict[str, Any]:
    """An agent's request body, decoded by the JSON policy (:mod:`spanlab.jsonpolicy`, as on every surface):
    400 for a body that is not JSON or not an object, 422 for JSON the policy refuses (nesting, NaN, surrogates)."""
    try:
        body = decode(raw, what="the request body")
    except JSONPolicyError as exc:
        if exc.syntax:
            raise BadRequestError(f"the request body is not valid JSON: {exc.reason}", code="invalid_json") from None
        raise BadRequestError(str(exc), 422, code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError(f"the request body must be a JSON object, not {type(body).__name__}",
                              code="invalid_json")
    return body


def check_model(body: dict[str, Any], served: tuple[str, ...]) -> None:
    """A request naming a model the engines do not serve gets the gateway's own 404, listing the names they serve
    (vLLM's would list the engine's aliases, e.g. a folder's path). ``served`` empty: not checked (the gateway was
    not told the names; the engine answers). A request without ``model`` gets the engine's default."""
    model = body.get("model")
    if served and isinstance(model, str) and model not in served:
        names = ", ".join(repr(name) for name in served)
        raise BadRequestError(f"model {model!r} is not served here; this gateway serves {names}", 404,
                              code="model_not_found")


def loads(raw: bytes) -> Any:
    """Parse JSON from the engine (an agent's body goes through :func:`parse_request`). msgspec is 3-10x faster
    than ``json`` on vLLM responses (every call is parsed and re-encoded, often per SSE chunk); ``json`` is the
    fallback for what msgspec refuses (NaN, Infinity, huge ints) and gives the error message for invalid input."""
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (non-finite floats become ``null``)."""
    return _ENCODER.encode(obj)


class BadRequestError(SpanlabError, ValueError):
    """The agent's request cannot be forwarded; ``status_code`` is what the agent gets."""

    def __init__(self, message: str, status_code: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code


def error_body(message: str, *, code: str, err_type: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI-shaped error object, so SDKs raise their usual exception with our message."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


@dataclass(frozen=True, slots=True)
class AgentAsked:
    """Which of the fields the gateway adds the agent asked for itself (those are left in replies)."""

    logprobs: bool
    token_ids: bool
    stream: bool
    n: int


def prepare_upstream(endpoint: Endpoint, body: dict[str, Any]) -> tuple[dict[str, Any], AgentAsked]:
    """The body to send upstream and a note of what the agent asked, for undoing our additions.

    Chat ``logprobs`` is a bool; legacy completions ``logprobs`` is an int where 0 means "only the
    sampled token", so "asked" differs per endpoint.
    """
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise BadRequestError(f"`n` must be an integer from 1 to {MAX_N}, not {n!r}")
    if endpoint == "chat":
        if not isinstance(body.get("messages"), list):
            raise BadRequestError("a chat completion request needs `messages` (a list)")
        asked_logprobs = bool(body.get("logprobs"))
    else:
        if "prompt" not in body:
            raise BadRequestError("a completion request needs `prompt`")
        asked_logprobs = body.get("logprobs") is not None
    asked = AgentAsked(
        logprobs=asked_logprobs,
        token_ids=bool(body.get("return_token_ids")),
        stream=bool(body.get("stream")),
        n=n,
    )
    upstream = dict(body)
    upstream["return_token_ids"] = True
    if not asked_logprobs:
        upstream["logprobs"] = True if endpoint == "chat" else 0
    return upstream, asked


def needs_rewrite(asked: AgentAsked) -> bool:
    """False when the agent asked for everything we add: upstream bytes can go back unchanged."""
    return not (asked.logprobs and asked.token_ids)


def strip_for_agent(payload: dict[str, Any], endpoint: Endpoint, asked: AgentAsked) -> dict[str, Any]:
    """Remove what the gateway added from a response or a stream chunk (mutates and returns it)."""
    if not asked.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or ():
        if not asked.token_ids:
            choice.pop("token_ids", None)
            if endpoint == "completions":
                choice.pop("prompt_token_ids", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return payload


def request_params(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's sampling parameters (its body minus messages/tools/prompt), as it sent them, with the ``seed``
    the gateway gave a seeded rollout's call (:mod:`spanlab.gateway.seeding`)."""
    return {k: v for k, v in body.items() if k not in _PAYLOAD_KEYS}
