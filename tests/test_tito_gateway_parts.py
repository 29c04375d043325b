"""The parts of TITO mode that need no engine: Hermes parsing (against vLLM's own parser), request mapping,
the startup template check, session bookkeeping, the ``tito_sessions`` view and the drift report.

Real tokenizers throughout: SmolLM2 with spanlab's template (``default_model_dir``), and the Qwen fixtures of
../shared/fixtures (skipped when absent) for a template that needs a fix, one that cannot be fixed, and the
``H``+``AVING`` split that re-encoding does not reproduce.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from spanlab.engine.template import render_ids
from spanlab.gateway.tito.primitives import generate_body
from spanlab.gateway.tito.protocol import completion_body, per_call_reason
from spanlab.gateway.tito.sessions import TitoSessions
from spanlab.store import SpanStore
from spanlab.tito.drift import RecordedCall, drift_report
from spanlab.tito.hermes import parse_hermes
from spanlab.tito.readiness import TitoUnavailableError, prepare_template
from spanlab.types import LLMCall, Span
from tests.conftest import SHARED

FIXTURES = SHARED / "fixtures"
CALC = {"type": "function", "function": {"name": "calc", "description": "evaluate arithmetic", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}


def _tok(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def smol(default_model_dir: Path) -> Any:
    return _tok(default_model_dir)


def _fixture(*parts: str) -> Path:
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"fixture not found: {path} (../shared/fixtures)")
    return path


# --- Hermes parsing -------------------------------------------------------------------------------
HERMES_OUTPUTS = [
    "The answer is 7.",
    '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>',
    'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>',
    '<tool_call>{"name":"calc","arguments":{"expr":"é"}}</tool_call>\n<tool_call>{"name":"f","arguments":{}}</tool_call>',
    '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}',  # cut before the closing tag
    '<tool_call>\n{"name": "calc", "arguments": {"expr": ',  # broken JSON: all content
    '<tool_call>\n{"name": "calc"}\n</tool_call>',  # no arguments: all content
]


@pytest.mark.parametrize("text", HERMES_OUTPUTS)
def test_hermes_parse_matches_vllms_parser(text: str, smol: Any) -> None:
    parser_mod = pytest.importorskip("vllm.tool_parsers.hermes_tool_parser", reason="vLLM is not installed")
    want = parser_mod.Hermes2ProToolParser(smol).extract_tool_calls(text, None)
    got = parse_hermes(text, lambda: "id0")
    assert got.content == want.content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got.tool_calls] == [
        (c.function.name, c.function.arguments) for c in want.tool_calls]


# --- request mapping -----------------------------------------------------------------------------
def test_chat_requests_map_to_token_in_completions() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [CALC], "temperature": 0.7,
            "max_completion_tokens": 9, "logprobs": True, "top_logprobs": 2, "stream": True, "seed": 1,
            "stop_token_ids": [5]}
    up = completion_body(body, [1, 2, 3])
    assert up == {"model": "m", "temperature": 0.7, "seed": 1, "stop_token_ids": [5], "prompt": [1, 2, 3],
                  "max_tokens": 9, "logprobs": 2, "return_token_ids": True, "skip_special_tokens": False}
    assert completion_body({"messages": []}, [1])["logprobs"] == 0  # sampled-token logprobs, always
    assert per_call_reason(body) is None
    assert per_call_reason({**body, "n": 2}).startswith("n > 1")
    assert "tool_choice" in per_call_reason({**body, "tool_choice": "required"})
    assert per_call_reason({**body, "tool_choice": "none"}) is None
    assert per_call_reason({**body, "response_format": {"type": "json_object"}}) is not None
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert per_call_reason({**body, "messages": [image]}) == "non-text content parts"


def test_a_render_that_left_max_tokens_out_generates_the_default_16_not_the_whole_context() -> None:
    """vLLM's render writes SamplingParams with omit_defaults: max_tokens=16 (the struct's default) is missing
    from its JSON, and generate would read that as unset and sample up to max_model_len."""
    rendered = {"token_ids": [1, 2, 3], "sampling_params": {"temperature": 1.0}, "model": "m", "stream": False}
    body = generate_body(rendered, [1, 2, 3], max_model_len=4096)
    assert body["sampling_params"] == {"temperature": 1.0, "max_tokens": 16, "logprobs": 0}
    assert body["token_ids"] == [1, 2, 3] and body["return_token_ids"] is True
    kept = generate_body({**rendered, "sampling_params": {"max_tokens": 40}}, [1, 2, 3], max_model_len=4096)
    assert kept["sampling_params"]["max_tokens"] == 40
    grown = generate_body({**rendered, "sampling_params": {"max_tokens": 40}}, list(range(4090)), max_model_len=4096)
    assert grown["sampling_params"]["max_tokens"] == 6  # a longer buffer prompt than the render: what is left


# --- startup template check ----------------------------------------------------------------------
def test_smollm2_template_is_ready_with_im_end_newline_closing(smol: Any) -> None:
    ready = prepare_template(smol, name="smol")
    assert ready.changes == [] and ready.text == smol.chat_template and ready.close_ids == [2, 198]


def test_qwen3_template_gets_the_known_fix_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    tok = _tok(_fixture("tokenizers", "qwen3"))
    with caplog.at_level(logging.WARNING, logger="spanlab.tito.readiness"):
        ready = prepare_template(tok, name="qwen3")
    assert [c.fix for c in ready.changes] == ["qwen3-think-loop-last"] and ready.text != ready.original
    assert any("applied known chat-template fix qwen3-think-loop-last" in r.getMessage() for r in caplog.records)
    assert ready.report.tool_append_prefix_preserving and ready.close_ids == [151645, 198]


def test_a_template_without_known_fix_is_refused_with_the_reason() -> None:
    tok = _tok(_fixture("tokenizers", "qwen2.5"))
    command_r = "llamacpp__CohereForAI-c4ai-command-r-plus-tool_use.jinja"
    tok.chat_template = _fixture("chat_templates", command_r).read_text()
    with pytest.raises(TitoUnavailableError, match=r"not prefix-preserving .* no known fix applies"):
        prepare_template(tok, name="command-r")


def test_qwen3_stock_template_renders_a_tool_call_turn_with_null_content_locally() -> None:
    """The fallback's startup probe has ``content: None`` on the call turn (as agents send it); Qwen3's stock
    template tests ``'</think>' in message.content`` and fails on None. vLLM hands it ``""`` instead, so the
    local render must too (engine_form), and then renders what a content of ``""`` renders."""
    tok = _tok(_fixture("tokenizers", "qwen3"))
    template = _fixture("chat_templates", "llamacpp__Qwen-Qwen3-0.6B.jinja").read_text()
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
    conv = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "5"}]
    got = render_ids(tok, conv, add_generation_prompt=True, tools=[CALC], chat_template=template)
    empty = [conv[0], {**conv[1], "content": ""}, conv[2]]
    assert got == render_ids(tok, empty, add_generation_prompt=True, tools=[CALC], chat_template=template)
    missing = [conv[0], {k: v for k, v in conv[1].items() if k != "content"}, conv[2]]
    assert got == render_ids(tok, missing, add_generation_prompt=True, tools=[CALC], chat_template=template)
    assert '{"expr": "2+3"}' in tok.decode(got)  # the call is rendered (arguments as an object, tojson spacing)


# --- session bookkeeping -------------------------------------------------------------------------
def test_sessions_extend_refuse_a_second_caller_and_roll_back_failed_calls(smol: Any) -> None:
    sessions = TitoSessions(smol, prepare_template(smol), max_sessions=2)
    conv: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    session = sessions.acquire(("r", "a", ""))
    assert session is not None and sessions.acquire(("r", "a", "")) is None  # busy: the 2nd call goes per call
    turn = sessions.plan(session, conv, [CALC])
    assert turn.event == "start" and turn.prompt_ids == []
    sessions.start_segment(turn, render_ids(smol, conv, add_generation_prompt=True, tools=[CALC]), conv, [CALC])
    sampled = [*smol.encode('<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>'), 2]
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
    mask = sessions.commit(turn, sampled, {"role": "assistant", "content": None, "tool_calls": [call]}, "stop")
    assert mask == [0] * len(turn.prompt_ids) + [1] * len(sampled)
    before = list(session.buffer.ids), list(session.buffer.mask), list(session.buffer.messages)
    conv2 = [*conv, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    assert sessions.acquire(("r", "a", "")) is session
    turn2 = sessions.plan(session, conv2, [CALC])
    assert turn2.event == "extend" and turn2.prompt_ids[: len(before[0])] == before[0]
    assert turn2.prompt_ids[len(before[0])] == 198  # the stop gap the model never samples
    sessions.abort(turn2, session)  # the engine call failed: the buffer is as before, the session free
    assert (session.buffer.ids, session.buffer.mask, session.buffer.messages) == before and not session.busy
    assert sessions.acquire(("r", "b", "")) and sessions.acquire(("r", "c", "")) and len(sessions) == 2  # LRU cap


# --- the tito_sessions view ----------------------------------------------------------------------
def _span(attempt: tuple[Any, Any], tito: dict[str, Any], prompt: list[int], resp: list[int],
          mask: list[int] | None, status: str = "ok") -> Span:
    return Span(rollout_id=attempt[0].rollout_id, attempt_id=attempt[1].attempt_id, name="chat.completions",
                kind="llm_call", status=status, attributes={"tito": tito},
                llm=LLMCall(model="m", prompt_token_ids=prompt, response_token_ids=resp, loss_mask=mask,
                            response_logprobs=[-0.5] * len(resp)))


def test_view_keeps_each_segments_last_call(store: SpanStore, started: tuple[Any, Any]) -> None:
    seg = {"mode": "tito", "segment": 0, "offset": 0}
    store.add_spans([
        _span(started, {**seg, "call": 0}, [1, 2], [3, 4], [0, 0, 1, 1]),
        _span(started, {**seg, "call": 1}, [1, 2, 3, 4, 9], [5], [0, 0, 1, 1, 0, 1]),
        _span(started, {**seg, "call": 2}, [1, 2, 3, 4, 9, 5, 9], [], None, status="error"),  # failed: not kept
        _span(started, {"mode": "tito", "segment": 1, "offset": 6, "call": 3}, [7, 7], [8], [0, 0, 1]),
        _span(started, {"mode": "per_call", "reason": "n > 1"}, [7], [8], None),
    ])
    rows = store.query("SELECT segment, segment_start, calls, token_ids, loss_mask, len(logprobs) AS n_lp, "
                       "num_tokens, num_sampled FROM tito_sessions ORDER BY segment").to_pylist()
    assert rows == [
        {"segment": 0, "segment_start": 0, "calls": 2, "token_ids": [1, 2, 3, 4, 9, 5],
         "loss_mask": [0, 0, 1, 1, 0, 1], "n_lp": 3, "num_tokens": 6, "num_sampled": 3},
        {"segment": 1, "segment_start": 6, "calls": 1, "token_ids": [7, 7, 8], "loss_mask": [0, 0, 1], "n_lp": 1,
         "num_tokens": 3, "num_sampled": 1},
    ]


# --- drift ---------------------------------------------------------------------------------------
def _pair(tok: Any, conv: list[dict[str, Any]], sampled: list[int], message: dict[str, Any],
          new: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[RecordedCall]:
    """Two per-call recorded calls: the second's prompt is the engine's render, as vLLM records it."""
    nxt = [*conv, message, *new]
    render = render_ids(tok, nxt, add_generation_prompt=True, tools=tools)
    return [
        RecordedCall("s1", "a1", conv, tools, message, render_ids(tok, conv, add_generation_prompt=True, tools=tools),
                     sampled),
        RecordedCall("s2", "a1", nxt, tools, {"role": "assistant", "content": "ok"}, render, [*tok.encode("ok"), 2]),
    ]


def test_drift_finds_non_canonical_bpe_in_responses_and_next_prompts() -> None:
    tok = _tok(_fixture("tokenizers", "qwen2.5"))
    sampled = [39, 83722, *tok.encode(" COUNT(*) > 1"), 151645]  # H + AVING: not how HAVING encodes
    conv = [{"role": "user", "content": "Which SQL clause filters groups?"}]
    calls = _pair(tok, conv, sampled, {"role": "assistant", "content": "HAVING COUNT(*) > 1"},
                  [{"role": "user", "content": "And WHERE?"}])
    calls[1] = RecordedCall(**{**calls[1].__dict__, "response_token_ids": [*tok.encode("ok"), 151645]})
    report = drift_report(calls, tok)
    assert (report.response.checked, report.response.differs) == (2, 1)
    assert report.next_prompt.checked == 1 and report.next_prompt.by_cause["non_canonical_bpe"].count == 1
    assert report.next_prompt.by_cause["template"].count == 0
    example = next(e for e in report.examples if e.check == "next_prompt")
    assert example.span_id == "s2" and example.recorded_ids[:2] != example.rerendered_ids[:2]


def test_drift_finds_tool_call_reserialization(smol: Any) -> None:
    text = '<tool_call>\n{"name":"calc","arguments":{"expr":"2+3"}}\n</tool_call>'  # no spaces: json.dumps adds them
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
    conv = [{"role": "user", "content": "What is 2+3?"}]
    calls = _pair(smol, conv, [*smol.encode(text), 2], {"role": "assistant", "content": None, "tool_calls": [call]},
                  [{"role": "tool", "tool_call_id": "c1", "content": "5"}], tools=[CALC])
    report = drift_report(calls, smol)
    assert report.response.differs == 0
    assert report.next_prompt.differs == 1
    assert {c: v.count for c, v in report.next_prompt.by_cause.items()} == {
        "non_canonical_bpe": 0, "tool_call_reserialization": 1, "template": 0}
    assert json.loads(report.model_dump_json())["next_prompt"]["rate"] == 1.0


def test_drift_cli_reads_a_store_file(tmp_path: Path, smol: Any, default_model_dir: Path) -> None:
    from typer.testing import CliRunner

    from spanlab.cli import app

    text = '<tool_call>\n{"name":"calc","arguments":{"expr":"2+3"}}\n</tool_call>'
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
    conv = [{"role": "user", "content": "What is 2+3?"}]
    calls = _pair(smol, conv, [*smol.encode(text), 2], {"role": "assistant", "content": None, "tool_calls": [call]},
                  [{"role": "tool", "tool_call_id": "c1", "content": "5"}], tools=[CALC])
    db = tmp_path / "spans.duckdb"
    with SpanStore(db) as store:
        store.enqueue_one({"q": 1})
        rollout, attempt = store.dequeue(worker_id="w")
        store.add_spans([
            Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat.completions",
                 kind="llm_call", llm=LLMCall(model="m", request_messages=c.request_messages,
                                              request_tools=c.request_tools, response_message=c.response_message,
                                              prompt_token_ids=c.prompt_token_ids,
                                              response_token_ids=c.response_token_ids))
            for c in calls
        ])
    plot = importlib.util.find_spec("matplotlib") is not None  # --plot is optional: only with matplotlib
    args = ["drift", "--db", str(db), "--tokenizer", str(default_model_dir), "--json"]
    done = CliRunner().invoke(app, [*args, "--plot", str(tmp_path / "drift.png")] if plot else args)
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["next_prompt"]["by_cause"]["tool_call_reserialization"] == {"count": 1, "rate": 1.0}
    assert not plot or (tmp_path / "drift.png").stat().st_size > 0
