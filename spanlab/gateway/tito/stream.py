"""A streamed TITO call on the engine path: generate's SSE chunks through streaming derender, token by token.

Why not synthesize the stream after generation (as the fallback path does): the agent then waits for the
whole turn before its first token. vLLM's ``/v1/chat/completions/derender`` takes one ``/inference/v1/generate``
SSE chunk at a time (``stream: true``) with the ``stream_state`` the previous call returned, and answers the
chat.completion.chunk the chat route would have sent, through the server's tool and reasoning parsers. The
gateway relays each as it comes, and keeps what the span and the buffer need: every sampled ID (the stop token
too), their logprobs, the weight versions (on the last chunk), and the message the deltas add up to.

The span is stored and the sampled turn committed to the buffer before the agent gets ``[DONE]`` (once it
has, it may send the next call of the attempt). A stream that breaks (engine error, cut connection, the agent
going away) rolls the buffer back and is recorded as an error span, as a failed unary call is.

Costs, from vLLM's side: with a parser configured derender replays every earlier token per chunk (its parser
state cannot be carried), so a long turn costs O(n^2) parse work; and the parsed path gives no logprobs to
the agent's chunks (the span still has them, from generate).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

from spanlab.gateway.outcomes import CallOutcomes
from spanlab.gateway.protocol import dumps, loads
from spanlab.gateway.recording import CallContext
from spanlab.gateway.tito.primitives import DERENDER, GENERATE, EngineCallError, ended_on_stop_token, generate_body
from spanlab.gateway.upstream import UpstreamError

if TYPE_CHECKING:  # engine_path imports this module to run a stream; only the types point back
    from spanlab.gateway.tito.engine_path import EnginePath
    from spanlab.gateway.tito.sessions import Session, TitoTurn

Message = dict[str, Any]


@dataclass
class StreamedTurn:
    """What the generate chunks and the derendered deltas add up to."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    weight_versions: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add_generated(self, chunk: dict[str, Any]) -> None:
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = [int(t) for t in chunk["prompt_token_ids"]]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            self.ids.extend(int(t) for t in choice.get("token_ids") or ())
            self.logprobs.extend((choice.get("logprobs") or {}).get("content") or ())
            if choice.get("finish_reason") is not None:
                self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
            if choice.get("weight_versions"):
                self.weight_versions = choice["weight_versions"]

    def add_delta(self, delta: dict[str, Any]) -> None:
        if delta.get("content"):
            self.content.append(delta["content"])
        if reasoning := delta.get("reasoning") or delta.get("reasoning_content"):
            self.reasoning.append(reasoning)
        for tc in delta.get("tool_calls") or ():
            call = self.calls.setdefault(int(tc.get("index") or 0),
                                         {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = call["id"] or tc.get("id")
            fn = tc.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> Message:
        """The assistant message the deltas add up to, in the form of a non-streamed derender's message."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        return {"role": "assistant", "content": "".join(self.content) or None,
                "reasoning": "".join(self.reasoning) or None, "tool_calls": calls}

    def generate_response(self) -> dict[str, Any]:
        """The turn as a non-streamed generate response (what :meth:`EnginePath.settle` reads)."""
        choice = {"index": 0, "token_ids": self.ids, "finish_reason": self.finish_reason,
                  "stop_reason": self.stop_reason, "logprobs": {"content": self.logprobs},
                  "weight_versions": self.weight_versions}
        return {"choices": [choice], "usage": self.usage, "prompt_token_ids": self.prompt_token_ids}


def _without_stop_token(chunk: dict[str, Any]) -> dict[str, Any]:
    """The chunk the turn ends on, less the stop token (derender would decode it into the content)."""
    choices = []
    for choice in chunk.get("choices") or ():
        ids = list(choice.get("token_ids") or ())
        if ended_on_stop_token(choice) and ids:
            content = (choice.get("logprobs") or {}).get("content")
            choice = {**choice, "token_ids": ids[:-1],
                      "logprobs": None if content is None else {"content": content[:-1]}}
        choices.append(choice)
    return {**chunk, "choices": choices}


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + dumps(event) + b"\n\n"


class EngineStream:
    """One streamed call: open generate's stream, relay each derendered chunk, settle the turn at the end."""

    def __init__(self, path: EnginePath, outcomes: CallOutcomes, ctx: CallContext, session: Session, turn: TitoTurn,
                 headers: dict[str, str], call_id: Callable[[int, str], str], prep_s: float) -> None:
        self.path, self.outcomes, self.ctx, self.session, self.turn = path, outcomes, ctx, session, turn
        self.headers = headers
        self.client = ctx.engine()
        self.acc = StreamedTurn()
        self.ids: dict[int, str] = {}  # tool-call index -> the ID the agent was given
        self._call_id = call_id
        self.own_s = prep_s  # the gateway's own work: renders before, derender calls and settling after

    async def open(self, rendered: dict[str, Any]) -> Response:
        """Start generate's stream; an error status is raised before the agent gets any event."""
        body = generate_body(rendered, self.turn.prompt_ids, max_model_len=self.path.max_model_len)
        body.update(stream=True, stream_options={"include_usage": True})
        upstream = await self.client.send("POST", GENERATE, body=dumps(body), headers=self.headers)
        if upstream.status >= 300:
            raise EngineCallError(GENERATE, upstream, await self.client.read(upstream))
        return StreamingResponse(self._relay(upstream), media_type="text/event-stream",
                                 headers={"x-spanlab-span-ids": self.ctx.span_ids[0]})

    async def _derender(self, chunk: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
        chat = {k: v for k, v in self.ctx.body.items() if k not in ("stream", "stream_options")}
        body = {"stream": True, "model": self.ctx.body.get("model"), "generate_chunk": _without_stop_token(chunk),
                "stream_state": state, "prompt_token_ids": self.turn.prompt_ids,
                "prompt_tokens": len(self.turn.prompt_ids), "chat_request": chat}
        t0 = time.perf_counter()
        try:
            return await self.path.post(self.client, DERENDER, body, self.headers)
        finally:
            self.own_s += time.perf_counter() - t0

    def _for_agent(self, out: dict[str, Any], first: bool) -> dict[str, Any] | None:
        """A derendered chunk as the agent gets it: stable tool-call IDs, token IDs / logprobs only if asked."""
        asked = self.ctx.asked
        choices = []
        for choice in out.get("choices") or ():
            delta = dict(choice.get("delta") or {})
            if delta.get("tool_calls"):
                calls = []
                for tc in delta["tool_calls"]:
                    i = int(tc.get("index") or 0)
                    if i not in self.ids:
                        self.ids[i] = self._call_id(i, (tc.get("function") or {}).get("name") or "")
                    calls.append({**tc, "id": self.ids[i]} if tc.get("id") is not None else tc)
                delta["tool_calls"] = calls
            self.acc.add_delta(delta)
            kept = {**choice, "delta": delta, "logprobs": choice.get("logprobs") if asked.logprobs else None}
            if not asked.token_ids:
                kept.pop("token_ids", None)
            choices.append(kept)
        if not choices and not (out.get("usage") and self._include_usage()):
            return None
        event = {**out, "id": self._reply_id(out), "object": "chat.completion.chunk", "choices": choices}
        if not self._include_usage() or choices:
            event.pop("usage", None)
        if first and asked.token_ids:
            event["prompt_token_ids"] = self.turn.prompt_ids
        return event

    def _include_usage(self) -> bool:
        return bool((self.ctx.body.get("stream_options") or {}).get("include_usage"))

    def _reply_id(self, out: dict[str, Any]) -> str:
        return "chatcmpl-" + str(out.get("id") or "").removeprefix("generate-tokens-").removeprefix("chatcmpl-")

    async def _relay(self, upstream: Any) -> AsyncIterator[bytes]:
        state: dict[str, Any] | None = None
        first, done, settled = True, False, False
        try:
            async for lines in self.client.line_batches(upstream):
                for line in lines:
                    data = line[5:].strip() if line.startswith(b"data:") else b""
                    if data == b"[DONE]":
                        done = True
                    if not data or done:
                        continue
                    chunk = loads(data)
                    if not isinstance(chunk, dict) or "error" in chunk:
                        raise ValueError(f"the engine's generate stream sent an error: {data[:300]!r}")
                    self.acc.add_generated(chunk)
                    answer = await self._derender(chunk, state)
                    state = answer["stream_state"]
                    if (event := self._for_agent(answer["chunk"], first)) is not None:
                        first = False
                        yield _sse(event)
            upstream.release()
            if self.acc.finish_reason is None:
                raise ValueError("the engine's generate stream ended before the turn finished")
            settled = True
            if (refused := await self.path.settle(self.outcomes, self.ctx, self.turn, self.session,
                                                  self.acc.generate_response(), self.acc.message(),
                                                  self.own_s)) is not None:
                yield _sse(json.loads(refused.body))
            yield b"data: [DONE]\n\n"
        except BaseException as exc:
            upstream.close()  # closing tells vLLM to stop generating
            if not settled:
                self.path.sessions.abort(self.turn, self.session)
                if not isinstance(exc, Exception):  # cancelled: the agent went away; record it, then re-raise
                    self.outcomes.fail(self.ctx, 499, "client_disconnected",
                                       "the agent closed the stream before it ended")
                    raise
                code = exc.code if isinstance(exc, UpstreamError) else "upstream_stream_broken"
                failed = self.outcomes.fail(self.ctx, 502, code, f"TITO stream: {exc}")
                yield _sse(json.loads(failed.body))
                return
            raise
