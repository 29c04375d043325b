"""The TITO session buffer against real tokenizers and chat templates, token for token.

SmolLM2 (``default_model_dir``: converts once, then cached) carries spanlab's ChatML+tools template; the
Qwen2.5 tokenizer from ../shared/fixtures shows retokenization drift (``H``+``AVING`` vs ``HAV``+``ING``).
Sampled IDs are simulated: without drift they are ``encode(assistant text) + [<|im_end|>]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spanlab.engine.template import render_ids
from spanlab.tito.buffer import (
    BufferStateError,
    SessionBuffer,
    compare_with_render,
    normalize_message,
)
from spanlab.tito.jinja import compile_template
from spanlab.tito.prefix import find_stop_gap
from tests.conftest import SHARED

QWEN_DIR = SHARED / "fixtures" / "tokenizers" / "qwen2.5"
CALC_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "calc", "description": "evaluate arithmetic",
                 "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}},
}


@pytest.fixture(scope="module")
def smol(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


@pytest.fixture(scope="module")
def qwen() -> Any:
    if not (QWEN_DIR / "tokenizer.json").exists():
        pytest.skip(f"Qwen2.5 tokenizer fixture not found at {QWEN_DIR}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN_DIR))


def _sample(tok: Any, text: str) -> list[int]:
    """What a drift-free engine returns for ``text``: its canonical encoding plus the stop token."""
    return [*tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]


def _call(call_id: str, args: str | dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "calc", "arguments": args}}


def _call_text(expr: str) -> str:
    return f'<tool_call>\n{{"name": "calc", "arguments": {{"expr": "{expr}"}}}}\n</tool_call>'


def _assert_mask(buf: SessionBuffer) -> None:
    """Mask 1 exactly on the sampled spans."""
    expected = [0] * len(buf.ids)
    for lo, hi in buf.sampled:
        expected[lo:hi] = [1] * (hi - lo)
    assert buf.mask == expected


def test_three_turn_tool_session_matches_chat_template(smol: Any) -> None:
    tools = [CALC_TOOL]
    conv: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3, then times 7?"}]
    buf = SessionBuffer.start(render_ids(smol, conv, add_generation_prompt=True, tools=tools), conv, tools)
    turns = [  # (sampled text, message returned to the agent, message the agent sends back, next messages)
        (_call_text("2+3"),
         {"role": "assistant", "content": None, "tool_calls": [_call("c1", '{"expr": "2+3"}')]},
         {"role": "assistant", "content": "", "refusal": None,  # the client reformats the JSON
          "tool_calls": [_call("c1", '{ "expr":"2+3" }')]},
         [{"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "5"}]),
        (_call_text("5*7"),
         {"role": "assistant", "content": None, "tool_calls": [_call("c2", '{"expr": "5*7"}')]},
         {"role": "assistant", "tool_calls": [{**_call("c2", {"expr": "5*7"}), "type": None}]},  # dict args
         [{"role": "tool", "tool_call_id": "c2", "name": "calc", "content": "35"}]),
        ("It is 35.", {"role": "assistant", "content": "It is 35."}, {"role": "assistant", "content": "It is 35."},
         [{"role": "user", "content": "Thanks!"}]),
    ]
    for text, returned, echoed, new in turns:
        buf.append_sampled(_sample(smol, text), returned)
        conv = [*conv, echoed, *new]
        prompt = buf.extend(conv, smol, tools)
        assert prompt is not None and prompt == buf.ids
        assert buf.ids == render_ids(smol, buf.messages, add_generation_prompt=True, tools=tools)
        _assert_mask(buf)
    assert [m["role"] for m in buf.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]
    assert buf.messages[1] == turns[0][1]  # the buffer keeps the message as returned, not the client's echo
    assert sum(buf.mask) == sum(len(_sample(smol, t[0])) for t in turns)
    cmp = compare_with_render(buf, smol)
    assert cmp.ok and cmp.drift == [] and cmp.render_ids == buf.ids


def test_having_sampled_ids_survive_verbatim(qwen: Any) -> None:
    assert qwen.encode("HAVING", add_special_tokens=False) == [72239, 1718]  # the canonical split
    conv: list[dict[str, Any]] = [{"role": "user", "content": "Which SQL clause filters groups?"}]
    buf = SessionBuffer.start(render_ids(qwen, conv, add_generation_prompt=True), conv)
    sampled = [39, 83722, *qwen.encode(" COUNT(*) > 1", add_special_tokens=False), 151645]  # H + AVING
    text = qwen.decode(sampled[:-1])
    assert text == "HAVING COUNT(*) > 1"
    buf.append_sampled(sampled, {"role": "assistant", "content": text})
    conv = [*conv, {"role": "assistant", "content": text}, {"role": "user", "content": "And WHERE?"}]
    assert buf.extend(conv, qwen) is not None
    lo, hi = buf.sampled[0]
    assert buf.ids[lo:hi] == sampled and buf.ids[lo : lo + 2] == [39, 83722]
    assert buf.ids[hi] == 198  # Qwen's ChatML stop gap
    render = render_ids(qwen, buf.messages, add_generation_prompt=True)
    assert render != buf.ids
    assert render[lo : lo + 2] == [72239, 1718]  # re-rendering the text gives the canonical split
    assert render[:lo] + sampled + render[hi:] == buf.ids  # ...and that is the only difference
    cmp = compare_with_render(buf, qwen)
    assert cmp.ok and len(cmp.drift) == 1
    assert cmp.drift[0].sampled_ids[:2] == [39, 83722] and cmp.drift[0].render_ids[:2] == [72239, 1718]
    assert cmp.drift[0].buffer_span == (lo, hi)


def test_rewritten_history_starts_new_segment(smol: Any) -> None:
    conv: list[dict[str, Any]] = [{"role": "user", "content": "Tell me a fact."}]
    buf = SessionBuffer.start(render_ids(smol, conv, add_generation_prompt=True), conv)
    fact = "Water boils at 100 C."
    buf.append_sampled(_sample(smol, fact), {"role": "assistant", "content": fact})
    before_ids, before_mask = list(buf.ids), list(buf.mask)
    more = {"role": "user", "content": "More"}
    edited = [{"role": "user", "content": "Tell me a short fact."}, buf.messages[1], more]
    assert buf.extend(edited, smol) is None
    assert buf.ids == before_ids and buf.mask == before_mask  # a refused extend changes nothing
    assert buf.extend([*buf.messages, more], smol, tools=[CALC_TOOL]) is None  # the tools changed
    prompt = render_ids(smol, edited, add_generation_prompt=True)
    buf.new_segment(prompt, edited)
    assert buf.segments == [0, len(before_ids)]
    assert buf.segment(0) == (before_ids, before_mask)  # the old segment keeps its sampled mask
    assert buf.segment(-1) == (prompt, [0] * len(prompt))  # the rewritten history is frozen prompt
    assert compare_with_render(buf, smol).ok
    buf.append_sampled(_sample(smol, "Ice melts at 0 C."), {"role": "assistant", "content": "Ice melts at 0 C."})
    _assert_mask(buf)
    with pytest.raises(BufferStateError):
        buf.append_sampled([1, 2], {"role": "assistant", "content": "x"})


def test_smollm2_stop_gap_is_newline_after_im_end(smol: Any) -> None:
    assert find_stop_gap(compile_template(smol.chat_template)) == ("\n", "<|im_end|>")
    assert smol.encode("\n", add_special_tokens=False) == [198]
    conv: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    buf = SessionBuffer.start(render_ids(smol, conv, add_generation_prompt=True), conv)
    sampled = _sample(smol, "Hello!")
    assert sampled[-1] == smol.convert_tokens_to_ids("<|im_end|>")
    buf.append_sampled(sampled, {"role": "assistant", "content": "Hello!"})
    end = len(buf.ids)
    assert buf.extend([*buf.messages, {"role": "user", "content": "Bye"}], smol) is not None
    assert buf.ids[end - 1 : end + 2] == [sampled[-1], 198, smol.convert_tokens_to_ids("<|im_start|>")]
    assert buf.mask[end - 1 : end + 1] == [1, 0]


def test_truncated_turn_has_no_safe_seam(smol: Any) -> None:
    conv: list[dict[str, Any]] = [{"role": "user", "content": "Count"}]
    buf = SessionBuffer.start(render_ids(smol, conv, add_generation_prompt=True), conv)
    cut = smol.encode("one two three", add_special_tokens=False)  # finish_reason=length: no <|im_end|>
    buf.append_sampled(cut, {"role": "assistant", "content": "one two three"})
    assert buf.extend([*buf.messages, {"role": "user", "content": "go on"}], smol) is None


def test_normalize_message_tolerates_client_round_trips() -> None:
    returned = {"role": "assistant", "content": None, "refusal": None,
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": '{"a": 1, "b": [1, 2]}'}}]}
    echoed = {"role": "assistant", "content": "",
              "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"b":[1,2],"a":1}'}}]}
    assert normalize_message(returned) == normalize_message(echoed)
    assert normalize_message({"role": "assistant", "content": None, "tool_calls": []}) == {"role": "assistant"}
    assert normalize_message({"role": "user", "content": "a"}) != normalize_message({"role": "user", "content": "a "})
    broken = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}
    repaired = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}
    assert normalize_message(broken) != normalize_message(repaired)  # repaired JSON is a rewrite
