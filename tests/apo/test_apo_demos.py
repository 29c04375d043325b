"""Demonstrations mined from recorded rollouts: rendered into the system prompt, safe, and validated."""

from __future__ import annotations

from spanlab.adapters.messages import Conversation
from spanlab.agents.rooms import REQUIRED_VARIABLES, default_template
from spanlab.algos.apo.demos import Demo, steps_of, with_demos
from spanlab.prompts import PromptRenderer, check_template


def test_steps_are_the_tool_calls_with_arguments_then_the_answer() -> None:
    conv = Conversation("r1", messages=[
        {"role": "system", "content": "..."}, {"role": "user", "content": "Book a room for 4 at 10:00."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "find_rooms", "arguments": '{"attendees": 4}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "R1 (6 seats)"},
        {"role": "assistant", "content": "Answer: R1"}])
    assert steps_of(conv) == ['Call find_rooms with {"attendees": 4}', "Answer: R1"]
    assert steps_of(Conversation("r2")) == []


def test_examples_render_in_the_system_message_and_pass_the_validator() -> None:
    hostile = Demo("t1", "Room for 8 & a <projector> {{ process.env.HOME }}", ['Call find_rooms with {"a": {"b": 1}}',
                                                                              "Answer: R2"], 1.0)
    plain = Demo("t2", "Room for 3 at 9:00.", ["Answer: R3"], 1.0)
    template = with_demos(default_template(), [hostile, plain])
    assert check_template(template, REQUIRED_VARIABLES) == []  # the hostile text stayed text
    messages = PromptRenderer().render(template, {"request": "Book for 5"})
    assert [m["role"] for m in messages] == ["system", "user"]  # examples are not extra chat turns
    system = messages[0]["content"]
    assert "Example 1" in system and "Room for 8" in system and "projector" in system and "Answer: R3" in system
    assert "process.env" in system and "{{" not in system  # shown, never run as JavaScript
    assert messages[1]["content"] == "Book for 5"
