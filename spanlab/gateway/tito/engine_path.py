"""One TITO call served through vLLM's render / generate / derender (see :mod:`.primitives`).

Per call, against the engine the attempt is pinned to:

1. **prompt**: a call that extends the buffer gets two engine renders at once, the buffer's conversation
   without a generation prompt (``closed``) and the request's conversation with one (``full``, the agent's
   whole chat request, so it also carries the sampling parameters the chat route would use). ``closed`` must
   be a token prefix of ``full``; the prompt is buffer + stop gap + ``full[len(closed):]``. The gap comes from
   the render that prompted the last turn (kept from the previous call) against ``closed``. Any other call
   starts a segment whose prompt is ``full`` itself;
2. **generate**: the prompt IDs with the render's sampling parameters (logprobs always on): the sampled IDs,
   their logprobs and the weight version spans;
3. **derender**: the sampled IDs + the agent's chat request -> the chat.completion the agent gets (tool calls
   and reasoning through the server's own parsers). A call with ``stream: true`` streams generate and derenders
   chunk by chunk instead (:mod:`.stream`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from spanlab.gateway.outcomes import CallOutcomes
from spanlab.gateway.protocol import dumps, loads
from spanlab.gateway.recording import CallContext
from spanlab.gateway.records import ChoiceRecord, ResponseRecord, clean_message
from spanlab.gateway.tito.primitives import (
    DERENDER,
    GENERATE,
    RENDER,
    EngineCallError,
    derender_body,
    ended_on_stop_token,
    generate_body,
    render_body,
)
from spanlab.gateway.tito.protocol import record_and_answer, record_span
from spanlab.gateway.tito.sessions import Session, TitoSessions, TitoTurn
from spanlab.gateway.tito.stream import EngineStream
from spanlab.gateway.upstream import UpstreamClient, UpstreamError

logger = logging.getLogger(__name__)
Message = dict[str, Any]


def call_id_maker(tool_call_parser: str | None) -> Callable[[int, str], str]:
    """Tool-call IDs as the chat route makes them for this parser; derender gives every call a random UUID.

    The next prompt renders the ID back, and some templates insist on their format: Mistral's on 9
    alphanumerics (what vLLM's mistral parser makes), Kimi-K2's on ``functions.<name>:<index>``.
    """
    if tool_call_parser == "mistral":
        return lambda _i, _name: "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    if tool_call_parser == "kimi_k2":
        return lambda i, name: f"functions.{name}:{i}"
    return lambda _i, _name: f"chatcmpl-tool-{secrets.token_hex(16)}"


class EnginePath:
    """The TITO request path on the engine's primitives; :class:`~spanlab.gateway.tito.TitoMode` hands it calls."""

    def __init__(self, sessions: TitoSessions, *, max_model_len: int | None, parsers: dict[str, str | None]) -> None:
        self.sessions = sessions
        self.max_model_len = max_model_len
        self.parsers = parsers  # {"tool_call_parser": ..., "reasoning_parser": ...} as the engine config says
        self._call_id = call_id_maker(parsers.get("tool_call_parser"))

    async def post(self, client: UpstreamClient, route: str, body: dict[str, Any],
                    headers: dict[str, str]) -> dict[str, Any]:
        upstream = await client.send("POST", route, body=dumps(body), headers=headers)
        content = await client.read(upstream)
        if upstream.status >= 300:
            raise EngineCallError(route, upstream, content)
        try:
            data = loads(content)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise EngineCallError(route)
        return data

    async def prompt(self, outcomes: CallOutcomes, ctx: CallContext, session: Session, headers: dict[str, str]
                     ) -> tuple[TitoTurn, dict[str, Any]]:
        """Plan the call's prompt (buffer extended, or a new segment); returns the turn and the ``full`` render."""
        client = ctx.engine()
        messages, tools = ctx.body["messages"], ctx.body.get("tools") or None
        turn = self.sessions.begin(session)
        buf = session.buffer
        chat = {**ctx.body, "stream": False}
        chat.pop("stream_options", None)
        if buf is not None and buf.sampled and buf.extends(messages, tools):
            conv = buf.conversation(messages)
            closed_body = render_body(ctx.body.get("model"), buf.messages, tools, add_generation_prompt=False)
            closed, full = await asyncio.gather(
                self.post(client, RENDER, closed_body, headers),
                self.post(client, RENDER, {**chat, "messages": conv}, headers))
            before = len(buf.ids)
            clean = session.last_turn_closed
            if buf.append_delta(conv, opened=session.opened or [], closed=closed["token_ids"], full=full["token_ids"],
                                close_ids=self.sessions.close_ids, is_gap=lambda _gap: clean) is not None:
                turn.added_tokens = len(buf.ids) - before
                TitoSessions.fill(turn, buf)
                turn.rendered = list(full["token_ids"])
                return turn, full
        if buf is not None:
            turn.event, turn.reason = "new_segment", TitoSessions.why_not(buf, messages, tools,
                                                                          session.last_finish_reason)
        full_render = await self.post(client, RENDER, chat, headers)  # the agent's messages, as sent
        self.sessions.start_segment(turn, full_render["token_ids"], messages, tools)
        turn.rendered = list(full_render["token_ids"])
        return turn, full_render

    async def serve(self, outcomes: CallOutcomes, ctx: CallContext, session: Session, headers: dict[str, str],
                    t0: float) -> Response:
        """Prompt, generate, derender, commit, record; errors roll the buffer back and are recorded."""
        client = ctx.engine()
        turn: TitoTurn | None = None
        try:
            turn, rendered = await self.prompt(outcomes, ctx, session, headers)
            ctx.extra_attributes = {"tito": turn.attributes()}
            prep_s = time.perf_counter() - t0
            if ctx.asked.stream:
                stream = EngineStream(self, outcomes, ctx, session, turn, headers, self._call_id, prep_s)
                return await stream.open(rendered)
            gen = await self.post(client, GENERATE,
                                   generate_body(rendered, turn.prompt_ids, max_model_len=self.max_model_len), headers)
            t1 = time.perf_counter()
            choice = gen["choices"][0]
            sampled = [int(t) for t in choice["token_ids"]]
            chat = await self.post(client, DERENDER, derender_body(ctx.body, gen, turn.prompt_ids), headers)
            t2 = time.perf_counter()
        except EngineCallError as exc:
            self.sessions.abort(turn, session)
            return exc.response(outcomes, ctx)
        except UpstreamError as exc:
            self.sessions.abort(turn, session)
            return outcomes.fail(ctx, exc.status_code, exc.code, str(exc))
        except (KeyError, IndexError, TypeError, ValueError):
            self.sessions.abort(turn, session)
            return outcomes.fail(ctx, 502, "upstream_bad_response", "the engine answered without token_ids")
        except BaseException:
            self.sessions.abort(turn, session)
            raise
        return await self._answer(outcomes, ctx, turn, session, gen, chat, sampled, prep_s + (t2 - t1))

    async def _answer(self, outcomes: CallOutcomes, ctx: CallContext, turn: TitoTurn, session: Session,
                      gen: dict[str, Any], chat: dict[str, Any], sampled: list[int], own_s: float) -> Response:
        t3 = time.perf_counter()
        out = chat["choices"][0]
        message = dict(out.get("message") or {"role": "assistant", "content": ""})
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "id": self._call_id(i, (c.get("function") or {}).get("name", ""))}
                                     for i, c in enumerate(message["tool_calls"])]
        record, attrs, finish = self._commit(ctx, turn, session, gen, message)
        reply = _reply(chat, out, message, finish, gen.get("usage"), ctx, turn.prompt_ids, sampled)
        attrs["gateway_ms"] = round((own_s + time.perf_counter() - t3) * 1000, 3)
        return await record_and_answer(outcomes, ctx, record, reply, attrs)

    async def settle(self, outcomes: CallOutcomes, ctx: CallContext, turn: TitoTurn, session: Session,
                     gen: dict[str, Any], message: Message, own_s: float) -> Response | None:
        """Commit a streamed turn and store its span (before the agent gets ``[DONE]``); None once stored,
        else the refusal to send instead."""
        t3 = time.perf_counter()
        record, attrs, _ = self._commit(ctx, turn, session, gen, message)
        attrs["gateway_ms"] = round((own_s + time.perf_counter() - t3) * 1000, 3)
        attrs["streamed"] = True
        return await record_span(outcomes, ctx, record, attrs)

    def _commit(self, ctx: CallContext, turn: TitoTurn, session: Session, gen: dict[str, Any],
                message: Message) -> tuple[ResponseRecord, dict[str, Any], str | None]:
        """Commit the sampled turn to the buffer; the span's record, its ``tito`` attributes and the finish."""
        choice_in = gen["choices"][0]
        sampled = [int(t) for t in choice_in["token_ids"]]
        finish = "tool_calls" if message.get("tool_calls") else choice_in.get("finish_reason")
        kept = clean_message(message)
        mask = self.sessions.commit(turn, sampled, kept, choice_in.get("finish_reason"))
        session.last_turn_closed = ended_on_stop_token(choice_in)
        session.opened = turn.rendered
        content = (choice_in.get("logprobs") or {}).get("content")
        logprobs = None if content is None else [float(e["logprob"]) for e in content]
        attrs = turn.attributes()
        attrs["engine_render"] = True
        engine_prompt = gen.get("prompt_token_ids")
        if engine_prompt is not None and engine_prompt != turn.prompt_ids:
            logger.error("TITO call %s: vLLM read other prompt IDs than the gateway sent", ctx.span_ids[0])
            attrs["prompt_mismatch"] = True
        attrs.update({k: v for k, v in self.parsers.items() if v})
        if choice_in.get("weight_versions"):
            attrs["weight_versions"] = choice_in["weight_versions"]
        usage = gen.get("usage")
        record = ResponseRecord(response_id=gen.get("request_id"), model=gen.get("model"),
                                prompt_token_ids=engine_prompt or turn.prompt_ids, usage=usage,
                                choices=[ChoiceRecord(0, kept, finish, sampled, logprobs, loss_mask=mask)])
        return record, attrs, finish


def _reply(chat: dict[str, Any], out: dict[str, Any], message: Message, finish: str | None,
           usage: dict[str, Any] | None, ctx: CallContext, prompt_ids: list[int], sampled: list[int]) -> dict[str, Any]:
    """The derendered chat.completion as the chat route answers: finish ``tool_calls``, real usage, and token IDs
    / logprobs only when the agent asked for them."""
    choice = {"index": 0, "message": message, "logprobs": out.get("logprobs") if ctx.asked.logprobs else None,
              "finish_reason": finish, "stop_reason": out.get("stop_reason")}
    reply = {"id": "chatcmpl-" + str(chat.get("id") or "").removeprefix("generate-tokens-").removeprefix("chatcmpl-"),
             "object": "chat.completion", "created": chat.get("created"), "model": chat.get("model"),
             "choices": [choice], "usage": usage}
    if ctx.asked.token_ids:
        reply["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = sampled
    return reply
