"""The served model through vLLM's OpenAI API: token IDs in and out, and Hermes tool parsing.

These are the facts the gateway and GRPO build on: ``return_token_ids`` gives the exact prompt
IDs (equal to HF ``apply_chat_template`` of the converted folder), ``/v1/completions`` accepts a
prompt as token IDs, and a ``<tool_call>`` the model emits comes back as ``tool_calls``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from spanlab.engine.template import render_ids

pytestmark = pytest.mark.vllm

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
        "strict": True,
    },
}


@pytest.fixture(scope="module")
def client(vllm_server: Any) -> Any:
    with httpx.Client(base_url=vllm_server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _chat(client: httpx.Client, model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0, "return_token_ids": True, **extra}
    resp = client.post("/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_models_and_health(vllm_server: Any, client: httpx.Client) -> None:
    assert vllm_server.model in [m["id"] for m in client.get("/models").json()["data"]]
    assert httpx.get(f"{vllm_server.root_url}/health", timeout=10).status_code == 200


def test_chat_prompt_token_ids_equal_hf_chat_template(vllm_server: Any, client: httpx.Client, tok: Any) -> None:
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    out = _chat(client, vllm_server.model, messages)
    assert out["prompt_token_ids"] == render_ids(tok, messages, add_generation_prompt=True)
    choice = out["choices"][0]
    assert len(choice["token_ids"]) == out["usage"]["completion_tokens"] <= 4


def test_chat_prompt_ids_match_for_tool_conversation_with_list_content(
    vllm_server: Any, client: httpx.Client, tok: Any
) -> None:
    """A full agent turn (tools, string arguments, MCP-style list content) renders identically."""
    messages = [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": [{"type": "text", "text": "What is 12 + 30?"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression": "12 + 30"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "42"}]},
    ]
    out = _chat(client, vllm_server.model, messages, tools=[CALC_TOOL])
    assert out["prompt_token_ids"] == render_ids(tok, messages, add_generation_prompt=True, tools=[CALC_TOOL])


def test_completions_accepts_token_id_prompt(vllm_server: Any, client: httpx.Client, tok: Any) -> None:
    prompt_ids = render_ids(tok, [{"role": "user", "content": "Say hi"}], add_generation_prompt=True)
    resp = client.post("/completions", json={"model": vllm_server.model, "prompt": prompt_ids, "max_tokens": 3,
                                             "temperature": 0, "return_token_ids": True, "logprobs": 1})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    assert 1 <= len(choice["token_ids"]) <= 3
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])


def test_forced_tool_call_is_parsed_by_hermes_parser(vllm_server: Any, client: httpx.Client, tok: Any) -> None:
    """``tool_choice: required`` makes the model emit ``<tool_call>...</tool_call>`` (checked in the
    sampled token IDs); the hermes parser turns it into ``tool_calls``."""
    out = _chat(client, vllm_server.model, [{"role": "user", "content": "What is 12 + 30?"}],
                tools=[CALC_TOOL], tool_choice="required", max_tokens=48)
    choice = out["choices"][0]
    sampled = tok.decode(choice["token_ids"])
    assert sampled.startswith("<tool_call>\n{")
    calls = choice["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "calculator"
    assert "expression" in json.loads(calls[0]["function"]["arguments"])


def test_hermes_parser_extracts_text_tool_calls(tok: Any) -> None:
    """The same parser vLLM runs, on text in our template's format (the ``tool_choice: auto`` path)."""
    pytest.importorskip("vllm")
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    parser = Hermes2ProToolParser(tok)
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    info = parser.extract_tool_calls(text, request=None)  # type: ignore[arg-type]
    assert info.tools_called and info.content == "Let me compute.\n"
    assert info.tool_calls[0].function.name == "calculator"
    assert json.loads(info.tool_calls[0].function.arguments) == {"expression": "1+1"}
