"""TITO mode of the gateway: attributed chat calls served from one token buffer per attempt.

Two paths. When the engine serves vLLM's render / generate / derender (``--enable-scale-out``), every render,
the sampling and the parse of the answer are the engine's own (:mod:`.engine_path`). The rest of this
module is the **fallback** for an upstream without those routes, described below: our renderer, our hermes
parser, vLLM's ``/v1/completions`` with token IDs.

A chat call of an attempt whose messages extend the previous call (same messages + the assistant message
the gateway returned + new tool/user messages) gets the prompt ``buffer + stop gap + delta``, sent as token
IDs to vLLM's ``/v1/completions``; the sampled IDs go into the buffer verbatim (loss mask 1), and the text
is parsed into an OpenAI chat message (Hermes tool calls) for the agent. Any other chat call of the attempt
starts a new segment, prompted with the engine's own render (``/tokenize``), so its IDs are what the
chat route would have used. The span of a TITO call is an ordinary ``llm_call`` span whose
``prompt_token_ids`` is the segment so far (as vLLM read it), ``loss_mask`` covers prompt + response and
``attributes.tito`` says segment, offset and event; the ``tito_sessions`` view picks each segment's last
span. What stays per call (marked ``attributes.tito.mode = "per_call"`` with a reason): unattributed calls,
``n > 1``, forced ``tool_choice``, JSON ``response_format``, template options, non-text content, and a call
of an attempt whose previous call is still running. See docs/tito.md.

Startup (:meth:`TitoMode.load`): load the served model's tokenizer, check its template (a known fix is
applied and logged; otherwise :class:`TitoUnavailableError`), and check that the tokenizer renders the
same IDs as the engine, so deltas rendered here fit prompts rendered there.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.responses import Response

from spanlab.gateway.config import GatewayConfig
from spanlab.gateway.outcomes import CallOutcomes
from spanlab.gateway.protocol import dumps, loads
from spanlab.gateway.recording import CallContext
from spanlab.gateway.records import ChoiceRecord, ResponseRecord, clean_message, sampled_logprobs
from spanlab.gateway.tito.engine_path import EnginePath
from spanlab.gateway.tito.primitives import check_engine_template, detect_routes
from spanlab.gateway.tito.protocol import (
    chat_response,
    completion_body,
    parses_tools,
    per_call_reason,
    record_and_answer,
)
from spanlab.gateway.tito.sessions import Session, TitoSessions, TitoTurn
from spanlab.gateway.upstream import UpstreamError
from spanlab.tito.hermes import ParsedTurn, parse_hermes
from spanlab.tito.messages import engine_form
from spanlab.tito.readiness import TitoUnavailableError, prepare_template
from spanlab.tito.render import TemplateError, render_ids
from spanlab.tito.templates import load_tokenizer

logger = logging.getLogger(__name__)

_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]
_PROBE = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "probe0001", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}]},
    {"role": "tool", "tool_call_id": "probe0001", "name": "calc", "content": "5"},
]
# vLLM's chat message carries these as null; an agent sees the same keys in both gateway modes.
_NULL_MESSAGE_FIELDS = {"refusal": None, "annotations": None, "audio": None, "function_call": None}


def _engine_model(config: GatewayConfig) -> tuple[str, str, int | None]:
    """(served name, model root, max_model_len) from the engine's ``/v1/models``."""
    try:
        data = httpx.get(f"{config.upstream_base_url}/v1/models", timeout=config.connect_timeout_s + 5).json()
        model = data["data"][0]
        max_len = model.get("max_model_len")
        return str(model["id"]), str(model.get("root") or model["id"]), int(max_len) if max_len else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise TitoUnavailableError(
            f"TITO refused: cannot ask the engine at {config.upstream_base_url} which model it serves: {exc}"
        ) from exc


def _check_engine_render(config: GatewayConfig, model: str, tokenizer: Any, template: str, path: Path) -> None:
    """The tokenizer must render a tool conversation to the IDs the engine renders (its ``/tokenize``)."""
    local = render_ids(tokenizer, engine_form(_PROBE), add_generation_prompt=True, tools=_PROBE_TOOLS,
                       chat_template=template)
    try:
        resp = httpx.post(f"{config.upstream_base_url}/tokenize", timeout=config.connect_timeout_s + 30, json={
            "model": model, "messages": _PROBE, "tools": _PROBE_TOOLS, "add_generation_prompt": True})
    except httpx.HTTPError as exc:
        raise TitoUnavailableError(f"TITO refused: cannot reach the engine's /tokenize: {exc}") from exc
    if resp.status_code == 404:
        raise TitoUnavailableError("TITO refused: the engine has no /tokenize route (TITO needs vLLM)")
    engine = resp.json().get("tokens") if resp.status_code == 200 else None
    if engine != local:
        at = next((i for i, (a, b) in enumerate(zip(local, engine or [], strict=False)) if a != b), None)
        raise TitoUnavailableError(
            f"TITO refused: the tokenizer at {path} renders other token IDs than the engine serving {model!r} "
            f"(HTTP {resp.status_code}; first difference at token {at}): give tokenizer=<the folder the engine serves>"
        )


class TitoMode:
    """The TITO request path; the :class:`~spanlab.gateway.proxy.Gateway` hands it every chat call (``serve``)."""

    def __init__(self, sessions: TitoSessions, engine: EnginePath | None = None) -> None:
        self.sessions = sessions
        self.engine = engine  # None: the fallback path (our renderer and hermes parser, /v1/completions)
        self._limiter = anyio.CapacityLimiter(1)  # one tokenizer user at a time (HF tokenizers are not re-entrant)
        self._call_ids = 0

    @classmethod
    def load(cls, config: GatewayConfig) -> TitoMode:
        """Pick the path and check the template; raises TitoUnavailableError with the reason.

        ``tito_render: auto`` uses the engine's render / generate / derender when the upstream serves them
        (vLLM with ``--enable-scale-out``, detected once here) and checks the template through the engine's own
        render; otherwise (or with ``local``) the fallback: load the tokenizer (seconds: imports transformers),
        check and fix its template locally, render deltas and parse hermes tool calls here.
        """
        model, root, max_len = _engine_model(config)
        timeout = config.connect_timeout_s + 30
        has_routes = config.tito_render != "local" and detect_routes(config.upstream_base_url, timeout)
        if config.tito_render == "engine" and not has_routes:
            raise TitoUnavailableError(
                f"TITO refused: tito_render is 'engine' but {config.upstream_base_url} serves no render / generate / "
                "derender routes (start vLLM with --enable-scale-out, or set tito_render: auto)")
        if has_routes:
            try:
                checked = check_engine_template(config.upstream_base_url, model, _PROBE_TOOLS, timeout)
            except TitoUnavailableError as exc:  # a known fix may still make the fallback path work
                if config.tito_render == "engine":
                    raise
                logger.warning("%s; trying the gateway's own renderer (it applies known template fixes)", exc)
            else:
                sessions = TitoSessions(None, None, config.tito_max_sessions, close_ids=checked.close_ids)
                parsers = {"tool_call_parser": config.tool_call_parser, "reasoning_parser": config.reasoning_parser}
                logger.info("TITO on: the engine's render / generate / derender (%s)", model)
                return cls(sessions, EnginePath(sessions, max_model_len=max_len, parsers=parsers))
        path = config.tokenizer or Path(root)
        if not path.is_dir():
            raise TitoUnavailableError(
                f"TITO refused: the engine serves {root!r}, not a local folder; set the gateway's tokenizer option "
                "to the model folder (tokenizer + chat template)"
            )
        try:
            tokenizer = load_tokenizer(path)
        except TemplateError as exc:
            raise TitoUnavailableError(f"TITO refused: {exc}") from exc
        template = prepare_template(tokenizer, name=str(path))
        _check_engine_render(config, model, tokenizer, template.original, path)
        tokenizer.chat_template = template.text  # this copy renders the deltas; the engine is never changed
        logger.info("TITO on: tokenizer %s, %s", path, "template fixed" if template.changes else "template ok")
        return cls(TitoSessions(tokenizer, template, config.tito_max_sessions))

    def _new_call_id(self) -> str:
        self._call_ids += 1
        return f"chatcmpl-tool-{time.time_ns() & 0xFFFFFFFFFF:010x}{self._call_ids & 0xFFFFFF:06x}"

    async def serve(self, outcomes: CallOutcomes, ctx: CallContext, headers: dict[str, str]) -> Response | None:
        """Answer the call from the attempt's buffer; None: serve it per call (``ctx`` says why)."""
        reason = "unattributed" if ctx.rollout_id is None else per_call_reason(ctx.body)
        session = None
        if reason is None:
            assert ctx.attempt_id is not None
            session = self.sessions.acquire((ctx.rollout_id, ctx.attempt_id, ctx.agent or ""))
            reason = "another call of this attempt is in flight" if session is None else None
        if session is None:
            ctx.extra_attributes = {"tito": {"mode": "per_call", "reason": reason}}
            return None
        t0 = time.perf_counter()
        if self.engine is not None:
            return await self.engine.serve(outcomes, ctx, session, headers, t0)
        turn: TitoTurn | None = None
        messages, tools = ctx.body["messages"], ctx.body.get("tools") or None
        try:
            turn = await anyio.to_thread.run_sync(self.sessions.plan, session, messages, tools, limiter=self._limiter)
            if not turn.prompt_ids:
                rendered = await self._engine_render(outcomes, ctx, headers, turn)
                if isinstance(rendered, Response):
                    self.sessions.abort(turn, session)
                    return rendered
                self.sessions.start_segment(turn, rendered, messages, tools)
            prep_s = time.perf_counter() - t0
            ctx.extra_attributes = {"tito": turn.attributes()}
            body = dumps(completion_body(ctx.body, turn.prompt_ids))
            client = ctx.engine()
            upstream = await client.send("POST", "/v1/completions", body=body, headers=headers)
            if upstream.status >= 300:
                self.sessions.abort(turn, session)
                return outcomes.upstream_error(ctx, upstream, await client.read(upstream))
            raw = await client.read(upstream)
        except UpstreamError as exc:
            self.sessions.abort(turn, session)
            return outcomes.fail(ctx, exc.status_code, exc.code, str(exc))
        except BaseException:
            self.sessions.abort(turn, session)
            raise
        return await self._answer(outcomes, ctx, turn, session, raw, prep_s)

    async def _engine_render(self, outcomes: CallOutcomes, ctx: CallContext, headers: dict[str, str],
                             turn: TitoTurn) -> list[int] | Response:
        """The engine's own render of the request (a new segment's prompt), or the error response."""
        ctx.extra_attributes = {"tito": turn.attributes()}
        body = {"model": ctx.body.get("model"), "messages": ctx.body["messages"], "add_generation_prompt": True}
        if ctx.body.get("tools"):
            body["tools"] = ctx.body["tools"]
        client = ctx.engine()
        upstream = await client.send("POST", "/tokenize", body=dumps(body), headers=headers)
        content = await client.read(upstream)
        if upstream.status >= 300:
            return outcomes.upstream_error(ctx, upstream, content)
        try:
            tokens = loads(content).get("tokens")
        except (ValueError, AttributeError):
            tokens = None
        if not isinstance(tokens, list) or not tokens:
            return outcomes.fail(ctx, 502, "upstream_bad_response", "the engine's /tokenize returned no tokens")
        return [int(t) for t in tokens]

    async def _answer(self, outcomes: CallOutcomes, ctx: CallContext, turn: TitoTurn, session: Session, raw: bytes,
                      prep_s: float) -> Response:
        """Commit the sampled turn, store the span, answer the agent as the chat route would have."""
        t1 = time.perf_counter()
        try:
            data = loads(raw)
            choice = data["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
        except (ValueError, KeyError, IndexError, TypeError):
            self.sessions.abort(turn, session)
            return outcomes.fail(ctx, 502, "upstream_bad_response",
                                 "the engine's completion has no choice with token_ids")
        text = choice.get("text") or ""
        parsed = parse_hermes(text, self._new_call_id) if parses_tools(ctx.body) else ParsedTurn(text)
        message = {"role": "assistant", "content": parsed.content, **_NULL_MESSAGE_FIELDS,
                   "tool_calls": parsed.tool_calls, "reasoning": None}
        finish = "tool_calls" if parsed.tool_calls else choice.get("finish_reason")
        kept = clean_message(message)
        mask = self.sessions.commit(turn, token_ids, kept, choice.get("finish_reason"))
        engine_prompt = choice.get("prompt_token_ids")
        attrs = turn.attributes()
        if engine_prompt is not None and engine_prompt != turn.prompt_ids:
            logger.error("TITO call %s: vLLM read other prompt IDs than the gateway sent", ctx.span_ids[0])
            attrs["prompt_mismatch"] = True
        record = ResponseRecord(
            response_id=data.get("id"), model=data.get("model"), prompt_token_ids=engine_prompt or turn.prompt_ids,
            usage=data.get("usage"),
            choices=[ChoiceRecord(0, kept, finish, token_ids, sampled_logprobs("completions", choice.get("logprobs")),
                                  loss_mask=mask)],
        )
        reply = chat_response(data, message, finish, ctx.asked)
        attrs["gateway_ms"] = round((prep_s + time.perf_counter() - t1) * 1000, 3)
        return await record_and_answer(outcomes, ctx, record, reply, attrs)

