"""Candidate validation and the render cache, against the real poml 0.0.8 (Node) renderer.

The premise is checked too: poml really evaluates ``{{ }}`` as JavaScript, so a template with an
expression must never reach it. Static rejections are asserted to happen without any render.
"""

from __future__ import annotations

import pytest

from spanlab.agents.rooms import default_template, make_tasks
from spanlab.prompts import PromptRenderer, check_template, static_problems, variables_of

pytest.importorskip("poml")

GOOD = """<poml>
<role>You book rooms.</role>
<task caption="Rules">Pick the smallest room that fits. Reply: Answer: ROOM</task>
<human-msg>Request: {{ request }}</human-msg>
</poml>"""


@pytest.fixture(scope="module")
def renderer() -> PromptRenderer:
    return PromptRenderer()


def test_poml_evaluates_expressions_as_javascript(renderer: PromptRenderer) -> None:
    """Why validation exists: the expression runs in Node (with ``process`` reachable)."""
    out = renderer._render_now("<poml><p>{{ 6 * 7 }} {{ typeof process }}</p></poml>", {})
    assert out[0]["content"] == "42 object"


@pytest.mark.parametrize(("template", "problem"), [
    ("<poml><p>{{ process.exit(1) }} {{ request }}</p></poml>", "not a plain variable reference"),
    ("<poml><p>{{request.constructor}}</p></poml>", "not a plain variable reference"),
    ("<poml><p>{{ 1 + 1 }} {{request}}</p></poml>", "not a plain variable reference"),
    ("<poml><p>{{`${request}`}}</p></poml>", "not a plain variable reference"),
    ("<poml><p>{{ request }} {{ process }}</p></poml>", "unknown variable {{process}}"),
    ("<poml><p>{{ request }} {{ oops</p></poml>", "unbalanced"),
    ("<poml><p>Book a room.</p></poml>", "required variable {{request}} is missing"),
    ('<poml><p if="process.exit(1)">{{ request }}</p></poml>', "attribute 'if' is not allowed"),
    ('<poml><item for="x in [1,2]">{{ request }}</item></poml>', "attribute 'for' is not allowed"),
    ('<poml><let name="x" value="process.env" />{{ request }}</poml>', "tag <let> is not allowed"),
    ('<poml><document src="/etc/passwd" />{{ request }}</poml>', "tag <document> is not allowed"),
    ('<poml><img src="/etc/passwd" />{{ request }}</poml>', "tag <img> is not allowed"),
    ('<poml>< Document\nsrc="/etc/passwd"/>{{ request }}</poml>', "tag <Document> is not allowed"),
    ('<poml><p caption="x" onload>{{ request }}</p></poml>', "attribute syntax not allowed"),
    ("<!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]><poml>{{ request }}</poml>", "declarations"),
])
def test_unsafe_or_incomplete_templates_are_rejected_before_any_render(template: str, problem: str) -> None:
    renderer = PromptRenderer()
    problems = check_template(template, ["request"], renderer=renderer)
    assert any(problem in p for p in problems), problems
    assert renderer.node_renders == 0  # rejected statically: poml never saw it


def test_good_templates_pass_and_render(renderer: PromptRenderer) -> None:
    assert static_problems(GOOD, ["request"]) == []
    assert check_template(GOOD, ["request"], renderer=renderer) == []
    assert check_template(default_template(), ["request"], renderer=renderer) == []
    assert variables_of(GOOD) == ["request"]


def test_a_variable_that_does_not_render_is_rejected(renderer: PromptRenderer) -> None:
    """``{{ request }}`` in an attribute POML drops: statically present, but the model would never see it."""
    hidden = '<poml><p caption="{{ request }}" captionStyle="hidden">Book a room.</p></poml>'
    assert static_problems(hidden, ["request"]) == []
    problems = check_template(hidden, ["request"], renderer=renderer)
    assert problems and "does not appear in the rendered prompt" in problems[0]


def test_filled_renders_equal_direct_renders_and_are_cached(renderer: PromptRenderer) -> None:
    tasks = make_tasks("val", 6, seed=0)
    before = renderer.node_renders
    filled = [renderer.render(GOOD, {"request": t["request"]}) for t in tasks]
    assert renderer.node_renders - before <= 1  # one skeleton for all six tasks (zero if the check made it)
    for task, messages in zip(tasks[:2], filled[:2], strict=True):  # two direct renders cost ~5 s
        assert messages == renderer._render_now(GOOD, {"request": task["request"]})
    assert filled[0][-1] == {"role": "user", "content": f"Request: {tasks[0]['request']}"}
    n = renderer.node_renders
    renderer.render(GOOD, {"request": tasks[0]["request"]})
    assert renderer.node_renders == n


def test_values_with_markup_characters_render_directly(renderer: PromptRenderer) -> None:
    """Values POML might not insert verbatim skip the skeleton and render as themselves (then cached)."""
    value = "a *starred* <b>x</b> {{ request }}\nsecond line"
    out = renderer.render(GOOD, {"request": value})
    assert out == renderer._render_now(GOOD, {"request": value})
