"""Demonstrations render with the default model's real chat template into a Hermes tool-call round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spanlab.agents.calc.agent import score
from spanlab.agents.calc.demos import SYSTEM_PROMPT, calculator_tools, demonstration
from spanlab.agents.calc.tasks import make_tasks


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], **kw: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, **kw)["input_ids"])


def test_demo_renders_a_tool_call_round_trip(tokenizer: Any) -> None:
    tasks = make_tasks("train", 9, seed=0)
    for task in tasks:
        demo = demonstration(task)
        assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert json.loads(json.dumps(demo)) == demo
        text = tokenizer.apply_chat_template(demo["messages"], tools=demo["tools"], tokenize=False)
        assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "\n\n# Tools")
        call = json.dumps({"name": "calculator", "arguments": {"expression": task["expression"]}})
        assert f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n" in text
        assert f"<tool_response>\n{task['answer']}\n</tool_response>" in text
        assert text.endswith(f"<|im_start|>assistant\nThe answer is {task['answer']}.<|im_end|>\n")
        assert score(demo["messages"][-1]["content"], task) == 1.0


def test_demo_prompt_is_a_prefix_of_the_demo(tokenizer: Any) -> None:
    """Training on the demo trains the prompt the agent sends: every generation prompt is a token prefix."""
    demo = demonstration(make_tasks("train", 3, seed=1)[2])
    full = _render(tokenizer, demo["messages"], demo["tools"])
    for k in (2, 4):
        prompt = _render(tokenizer, demo["messages"][:k], demo["tools"], add_generation_prompt=True)
        assert full[: len(prompt)] == prompt


def test_tools_schema() -> None:
    (tool,) = calculator_tools()
    assert tool["function"]["name"] == "calculator" and tool["function"]["strict"] is False
    assert tool["function"]["parameters"]["required"] == ["expression"]
    (strict,) = calculator_tools(strict=True)
    assert strict["function"]["strict"] is True and strict["function"]["parameters"]["additionalProperties"] is False
    assert "additionalProperties" not in calculator_tools()[0]["function"]["parameters"], "copies, not shared"


def test_demo_rejects_a_wrong_expression() -> None:
    task = {**make_tasks("train", 1)[0], "expression": "1 + 1"}
    with pytest.raises(ValueError, match="does not evaluate"):
        demonstration(task)


@pytest.mark.parametrize(
    ("text", "reward"),
    [("The answer is 85.", 1.0), ("85", 1.0), ("It is 84, no, 85.0", 1.0), ("85 or 86", 0.0), ("", 0.0), (None, 0.0)],
)
def test_score(text: str | None, reward: float) -> None:
    assert score(text, {"answer": 85}) == reward
    assert score("The answer is 1,080.", {"answer": 1080}) == 1.0
    assert score("90-81 = 9", {"answer": 9}) == 1.0 and score("It is -9", {"answer": -9}) == 1.0
