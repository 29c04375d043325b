"""The calc agent's prompt as POML: APO's starting version is exactly the agent's own prompt."""

from __future__ import annotations

import asyncio

from spanlab.agents import calc
from spanlab.agents.calc.agent import prompt_input
from spanlab.prompts import DEFAULT_RENDERER, check_template


def test_default_template_renders_to_the_system_prompt_and_the_question() -> None:
    question = {"role": "user", "content": "What is 2 + 3?"}
    messages = asyncio.run(DEFAULT_RENDERER.arender(calc.default_template(), {"question": question["content"]}))
    assert messages == [{"role": "system", "content": calc.SYSTEM_PROMPT}, question]
    assert prompt_input(messages) == (calc.SYSTEM_PROMPT, [question])


def test_default_template_passes_the_validator_apo_applies() -> None:
    assert calc.REQUIRED_VARIABLES == ("question",)
    assert check_template(calc.default_template(), list(calc.REQUIRED_VARIABLES)) == []
