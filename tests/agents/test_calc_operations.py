"""``calc.extra_ops``: counting a calculator expression's operations, and judging an answer's expression against
what its task needs (the habit issue 59 found: ``4 * 33 + 4 * 33`` for ``4 * 33``)."""

from __future__ import annotations

import pytest
from agents import Agent as SDKAgent
from agents.items import MessageOutputItem, ToolCallItem
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from spanlab.agents.calc.agent import calculator_expressions
from spanlab.agents.calc.operations import call_expression, count_operations, extra_operations
from spanlab.agents.calc.tasks import ALL_LEVELS, make_tasks


@pytest.mark.parametrize(("expression", "n"), [
    ("47", 0), ("-47", 0), ("47 + 38", 1), ("-5 + 3", 1), ("-(5 * 3)", 1), ("23 + 4 * 6", 2),
    ("(2 + 3) * 4", 2), ("((2 + 3)) * (4)", 2), ("4 * 33 + 4 * 33", 3), (" 5×7 ÷ 5 ", 2), ("5 * 7 + 5 * 7", 3),
    ("2 ** 3", 1), ("x + 1", 1), ("2 +", None), ("", None), ("1 = 1", None), ("1\x00+1", None),
])
def test_operations_are_binary_operations_not_signs_or_parentheses(expression: str, n: int | None) -> None:
    assert count_operations(expression) == n


def test_each_task_needs_as_many_operations_as_its_level_says() -> None:
    needed = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4}
    for level in ALL_LEVELS:
        for task in make_tasks("train", 40, seed=3, levels=[level], phrasings="all"):
            assert count_operations(task["expression"]) == needed[level], task


@pytest.mark.parametrize(("expressions", "extra"), [
    (["4 * 33"], 0.0),
    (["4 * 33 + 4 * 33"], 1.0),  # the habit, as issue 59 saw it
    (["55 + 6 * 5"], 1.0),
    (["4 * 33 + 4 * 33", "4 * 33"], 0.0),  # corrected: the last call's expression is the answer's
    (["4 * 33", "132 + 132"], 0.0),  # each call alone needs no more than one operation
    (["4 * 33 + 1", "4 ** 33"], 1.0),  # the calculator rejects `**`: the answer came from the call before
    (["4 * 33 + 1", "4 * "], 1.0),
    (["-4 * 33"], 0.0),
    (["4 +"], None),  # nothing the calculator evaluated
    ([], None),
])
def test_the_answers_expression_is_the_last_one_the_calculator_evaluated(expressions: list[str],
                                                                         extra: float | None) -> None:
    assert extra_operations(expressions, {"expression": "4 * 33", "answer": 132}) == extra


def test_a_level_three_answer_may_use_two_operations_and_a_task_without_an_expression_gets_no_value() -> None:
    task = make_tasks("test", 3, seed=0)[2]
    assert task["level"] == 3 and count_operations(task["expression"]) == 2
    assert extra_operations([task["expression"]], task) == 0.0
    assert extra_operations([f"{task['expression']} + 0"], task) == 1.0
    assert extra_operations(["1 + 1"], {"question": "q", "answer": 2}) is None


@pytest.mark.parametrize(("arguments", "expression"), [
    ('{"expression": "2 + 3"}', "2 + 3"), ({"expression": "2 + 3"}, "2 + 3"), ('{"expression": 5}', None),
    ('{"expr": "2 + 3"}', None), ("not json", None), ('["2 + 3"]', None), (None, None),
])
def test_a_calls_expression_is_read_from_its_arguments(arguments: object, expression: str | None) -> None:
    assert call_expression(arguments) == expression


def test_calculator_expressions_come_from_the_runs_calculator_calls_in_order() -> None:
    agent: SDKAgent = SDKAgent(name="calculator")

    def call(name: str, arguments: str) -> ToolCallItem:
        raw = ResponseFunctionToolCall(type="function_call", call_id="c", name=name, arguments=arguments)
        return ToolCallItem(agent=agent, raw_item=raw)

    message = MessageOutputItem(agent=agent, raw_item=ResponseOutputMessage(
        id="m", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text="7", annotations=[])]))
    items = [call("calculator", '{"expression": "3 + 4"}'), message, call("other_tool", '{"expression": "1"}'),
             call("calculator", "{broken"), call("calculator", '{"expression": "3 + 4 + 0"}')]
    assert calculator_expressions(items) == ["3 + 4", "3 + 4 + 0"]
