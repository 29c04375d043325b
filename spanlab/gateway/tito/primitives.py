"""vLLM's own TITO primitives, as the gateway uses them: render, generate, derender.

vLLM started with ``--enable-scale-out`` serves, next to the chat route and on the same engine:

* ``POST /v1/chat/completions/render``: a chat request -> a ``GenerateRequest`` (the prompt's ``token_ids``
  exactly as the chat route would render them, and the ``sampling_params`` the chat route would sample with);
* ``POST /inference/v1/generate``: token IDs in -> sampled ``token_ids``, ``logprobs`` (integer token IDs)
  and ``weight_versions`` (which weights sampled which output tokens) out;
* ``POST /v1/chat/completions/derender``: the generate response + the chat request -> the
  ``chat.completion`` the chat route would have answered, through the server's configured tool parser and
  reasoning parser (any format vLLM parses: hermes, llama3_json, mistral, qwen3_xml, ...).

Why the gateway uses them when they are there: the prompt delta, the sampling parameters and the parsed
answer then come from the engine's own code, so nothing of ours (jinja sandbox, a hermes parser) can drift
from what the chat route does, and no local tokenizer is needed. Why not the whole conversation rendered by
the engine each call: re-rendering sampled turns gives other IDs than were sampled (REFERENCE §1); the
engine renders, the buffer keeps the sampled IDs and appends only the delta of the new messages.

:func:`detect_routes` asks once per upstream at startup (an empty body: 422 = the route is there, 404 = no
such route, 403 = vLLM without ``--enable-scale-out``). Without all three the gateway falls back to its own
renderer and hermes parser (see :mod:`.mode`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.responses import Response

from spanlab.gateway.outcomes import CallOutcomes
from spanlab.gateway.recording import CallContext
from spanlab.tito.prefix import first_mismatch
from spanlab.tito.readiness import TitoUnavailableError

logger = logging.getLogger(__name__)

RENDER, GENERATE, DERENDER = "/v1/chat/completions/render", "/inference/v1/generate", "/v1/chat/completions/derender"
ROUTES = (RENDER, GENERATE, DERENDER)
RENDER_OMITTED_MAX_TOKENS = 16  # vllm.SamplingParams' default, which its omit_defaults JSON leaves out
Message = dict[str, Any]


class EngineCallError(Exception):
    """An engine primitive gave no usable answer; :meth:`.EnginePath.serve` records it once and
    answers the agent.

    ``upstream``/``content``: the engine's error response, passed through; else ``message``: a bad answer (502).
    """

    def __init__(self, route: str, upstream: Any = None, content: bytes = b"", message: str = "") -> None:
        super().__init__(message or f"{route} failed")
        self.upstream, self.content, self.message = upstream, content, message or f"the engine's {route} sent no JSON"

    def response(self, outcomes: CallOutcomes, ctx: CallContext) -> Response:
        if self.upstream is not None:
            return outcomes.upstream_error(ctx, self.upstream, self.content)
        return outcomes.fail(ctx, 502, "upstream_bad_response", self.message)


def detect_routes(base_url: str, timeout_s: float) -> bool:
    """Whether the upstream serves render, generate and derender (one probe each, at startup)."""
    found = {}
    for route in ROUTES:
        try:
            found[route] = httpx.post(f"{base_url}{route}", json={}, timeout=timeout_s).status_code
        except httpx.HTTPError as exc:
            raise TitoUnavailableError(f"TITO refused: cannot reach the engine at {base_url}: {exc}") from exc
    have = all(code in (200, 400, 422) for code in found.values())
    if not have:
        logger.info("TITO: the engine has no scale-out routes (%s); the gateway renders and parses itself",
                    ", ".join(f"{r} {c}" for r, c in found.items()))
    return have


def render_body(model: str | None, messages: list[Message], tools: list[Message] | None, *,
                add_generation_prompt: bool = True) -> dict[str, Any]:
    """A render request for ``messages`` alone (no sampling fields): the prefix renders of the buffer."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools:
        body["tools"] = tools
    return body


def render_sync(base_url: str, body: dict[str, Any], timeout_s: float) -> list[int]:
    """The engine's render of ``body`` (startup checks); raises TitoUnavailableError with the engine's reason."""
    try:
        resp = httpx.post(f"{base_url}{RENDER}", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TitoUnavailableError(f"TITO refused: cannot reach the engine's render route: {exc}") from exc
    if resp.status_code != 200:
        raise TitoUnavailableError(f"TITO refused: the engine cannot render the probe conversation "
                                   f"(HTTP {resp.status_code}): {resp.text[:300]}")
    return [int(t) for t in resp.json()["token_ids"]]


def generate_body(rendered: dict[str, Any], prompt_ids: Sequence[int], *, max_model_len: int | None) -> dict[str, Any]:
    """The generate request: the engine's render of the chat request with the buffer's prompt as ``token_ids``.

    Logprobs of the sampled tokens are always asked for (the span stores them for training), at least 0 top
    alternatives. When the agent set no ``max_tokens``, the engine filled in what is left of the context for
    its own render; the buffer's prompt can be a few tokens longer (sampled IDs are kept verbatim), so the
    budget is taken down by the difference.

    A render always resolves ``max_tokens`` to a number, but vLLM 0.32 writes its ``SamplingParams`` with
    ``omit_defaults``, so a budget equal to the struct's default (16) is left out of the JSON, and the
    generate route reads a missing ``max_tokens`` as "not set" and fills in the rest of the context: an agent
    asking for 16 tokens got up to ``max_model_len`` (thousands on CPU, minutes per call). A missing value is
    therefore put back as that default.
    """
    params = dict(rendered.get("sampling_params") or {})
    params.setdefault("max_tokens", RENDER_OMITTED_MAX_TOKENS)
    if params.get("logprobs") is None:
        params["logprobs"] = 0
    grown = len(prompt_ids) - len(rendered.get("token_ids") or ())
    if grown > 0 and params.get("max_tokens") is not None and max_model_len is not None:
        params["max_tokens"] = max(1, min(int(params["max_tokens"]), max_model_len - len(prompt_ids)))
    body = {k: v for k, v in rendered.items() if k not in ("token_ids", "token_offsets", "stream", "stream_options")}
    return {**body, "token_ids": list(prompt_ids), "sampling_params": params, "stream": False, "return_token_ids": True}


def ended_on_stop_token(choice: dict[str, Any]) -> bool:
    """The turn ended on an end-of-turn / stop token (not cut at max_tokens, not by a stop string)."""
    return choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str)


def derender_body(body: dict[str, Any], generated: dict[str, Any], prompt_ids: Sequence[int]) -> dict[str, Any]:
    """The derender request: the generate response with the agent's own chat request (parsers read its tools).

    The stop token the turn ended on is left out, as the chat route leaves it out of the text: derender decodes
    every ID it is given, special tokens kept when a parser is configured, so ``<|im_end|>`` would otherwise
    end up in the agent's content. The buffer keeps it (the model sampled it).
    """
    chat = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    choices = []
    for choice in generated.get("choices") or ():
        ids = list(choice.get("token_ids") or ())
        if ended_on_stop_token(choice) and len(ids) > 1:
            lp = choice.get("logprobs") or {}
            content = lp.get("content")
            choice = {**choice, "token_ids": ids[:-1],
                      "logprobs": None if content is None else {**lp, "content": content[:-1]}}
        choices.append(choice)
    return {"model": body.get("model"), "generate_response": {**generated, "choices": choices},
            "prompt_token_ids": list(prompt_ids), "prompt_tokens": len(prompt_ids), "chat_request": chat}


@dataclass(frozen=True)
class EngineTemplate:
    """What the startup check learned about the served template through the engine's own render.

    ``close_ids``: end-of-turn token + stop gap, to close a turn the model did not end (cut at ``max_tokens``).
    """

    close_ids: list[int] | None


_Q, _A1, _A2 = "spanlab probe question", "first spanlab answer.", "second spanlab reply?"


def _probe(tool_result: str = "5", expr: str = "2+3") -> list[Message]:
    call = {"id": "probe0001", "type": "function", "function": {"name": "calc", "arguments": f'{{"expr": "{expr}"}}'}}
    return [{"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "probe0001", "name": "calc", "content": tool_result}]


def check_engine_template(base_url: str, model: str, tools: list[Message], timeout_s: float,
                          extra: dict[str, Any] | None = None) -> EngineTemplate:
    """The tool-append test on the engine's own render; raises TitoUnavailableError naming the problem.

    Token level, as the engine renders: ``render([user, assistant(call)])`` must be a prefix of
    ``render([..., tool(result)], generation prompt)``; the template must render the tool result at all (two
    results must give two prompts; if not, a tool agent's model never sees what its tools answered).
    ``extra``: more render fields (benchmarks/tito_engine.py sends ``chat_template`` to check many templates).
    """
    conv = _probe()

    def render(messages: list[Message], gen: bool) -> list[int]:
        body = render_body(model, messages, tools, add_generation_prompt=gen)
        return render_sync(base_url, {**body, **(extra or {})}, timeout_s)

    before, after = render(conv[:2], False), render(conv, True)
    if (at := first_mismatch(before, after)) is not None:
        raise TitoUnavailableError(
            f"TITO refused: the chat template the engine serves is not prefix-preserving when a tool result is "
            f"appended (the engine's renders diverge at token {at}). Fix the template (`spanlab template check` / "
            "`spanlab template fix`) and serve it, or run the gateway with tito off (per-call recording).")
    if render(_probe("spanlab-other-result"), True) == after:
        raise TitoUnavailableError(
            "TITO refused: the chat template the engine serves renders no tool result (not usable for tool calls): "
            "serve a tool-capable template, or run the gateway with tito off.")
    user = [{"role": "user", "content": _Q}]
    opened = render(user, True)
    tails = [render([*user, {"role": "assistant", "content": a}], False)[len(opened):] for a in (_A1, _A2)]
    n = 0
    while n < min(map(len, tails)) and tails[0][-1 - n] == tails[1][-1 - n]:
        n += 1
    close = tails[0][len(tails[0]) - n:] if n else None
    return EngineTemplate(close_ids=close)


__all__ = ["DERENDER", "GENERATE", "RENDER", "EngineTemplate", "check_engine_template", "derender_body",
           "detect_routes", "generate_body", "render_body", "render_sync"]
