"""The shipped ChatML+tools template: Hermes rendering, list content, token-level prefix checks.

The prefix property is what a TITO session buffer relies on: appending a tool message (or any
later message) must never change the tokens already rendered. Checked with the converted SmolLM2
tokenizer and, through ``chat_template=...``, with a real Qwen2.5 BPE from the shared fixtures.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from spanlab.engine.template import (
    DUMMY_TOOL,
    check_tool_append_prefix,
    dummy_tool_conversation,
    load_template,
    render_ids,
)

QWEN25_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "tokenizers" / "qwen2.5"
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"],
        },
    },
}


@pytest.fixture(scope="module")
def smol_tok(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _agent_conversation() -> list[list[dict[str, Any]]]:
    """Successive states of a tool-using conversation; each extends the previous one."""
    steps: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": "What is 12 + 30, then times 2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "calculator", "arguments": '{"expression": "12 + 30"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "calculator", "content": [{"type": "text", "text": "42"}]},
        {"role": "assistant", "content": "Now double it.", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "42 * 2"}}},
            {"id": "c3", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "84"}}}]},
        {"role": "tool", "tool_call_id": "c2", "name": "calculator", "content": "84"},
        {"role": "tool", "tool_call_id": "c3", "name": "calculator", "content": [{"type": "text", "text": "84"}]},
        {"role": "assistant", "content": "The answer is 84."},
        {"role": "user", "content": "Thanks"},
    ]
    return [steps[: i + 1] for i in range(1, len(steps))]


def test_dummy_tool_append_is_prefix_preserving_with_converted_tokenizer(smol_tok: Any) -> None:
    result = check_tool_append_prefix(smol_tok)
    assert result.ok, f"first mismatch at {result.first_mismatch}"
    assert smol_tok.decode(result.delta_ids) == (
        "<|im_start|>tool\n<tool_response>\ndummy\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_dummy_tool_append_is_prefix_preserving_with_autotokenizer_and_shipped_template() -> None:
    """Any HF tokenizer applying the shipped template (here: the real Qwen2.5 BPE) passes too."""
    from transformers import AutoTokenizer

    if not QWEN25_DIR.is_dir():
        pytest.skip(f"shared fixture {QWEN25_DIR} missing")
    tok = AutoTokenizer.from_pretrained(QWEN25_DIR)
    assert check_tool_append_prefix(tok, chat_template=load_template()).ok
    assert check_tool_append_prefix(tok).ok  # Qwen2.5's own template passes as well (REFERENCE §7)


@pytest.mark.parametrize("with_tools", [True, False])
def test_every_append_in_an_agent_conversation_is_prefix_preserving(smol_tok: Any, with_tools: bool) -> None:
    tools = [CALC_TOOL] if with_tools else None
    states = _agent_conversation()
    for before, after in itertools.pairwise(states):
        ids_before = render_ids(smol_tok, before, add_generation_prompt=False, tools=tools)
        ids_after = render_ids(smol_tok, after, add_generation_prompt=after[-1]["role"] != "assistant", tools=tools)
        assert ids_after[: len(ids_before)] == ids_before, f"append of {after[-1]['role']} broke the prefix"


def test_hermes_tool_call_and_response_rendering(smol_tok: Any) -> None:
    conv, tool_msg = dummy_tool_conversation()
    text = smol_tok.apply_chat_template([*conv, tool_msg], tools=[DUMMY_TOOL], tokenize=False,
                                        add_generation_prompt=True)
    assert "<tools>\n" + json.dumps(DUMMY_TOOL) + "\n</tools>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "dummy", "arguments": {}}\n</tool_call><|im_end|>\n' in text
    assert text.endswith(
        "<|im_start|>tool\n<tool_response>\ndummy\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_list_content_is_flattened_like_vllm(smol_tok: Any) -> None:
    listed = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
              {"role": "tool", "content": [{"type": "text", "text": "42"}]}]
    flat = [{"role": "user", "content": "a\nb"}, {"role": "tool", "content": "42"}]
    assert smol_tok.apply_chat_template(listed, tokenize=False) == smol_tok.apply_chat_template(flat, tokenize=False)


def test_without_tools_matches_smollm2_stock_format(smol_tok: Any) -> None:
    text = smol_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_installed_in_both_places(default_model_dir: Path) -> None:
    shipped = load_template()
    assert (default_model_dir / "chat_template.jinja").read_text() == shipped
    assert json.loads((default_model_dir / "tokenizer_config.json").read_text())["chat_template"] == shipped
