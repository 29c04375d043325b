"""Demonstrations of reasoning_gym tasks, for warm starts and SFT replay: the answer agent's packaged prompt, then
the family's reference answer between the tags.

Only a reference answer that the family's own ``score_answer`` scores 1.0 is demonstrated: in some families the
``answer`` field is not a scored solution (reasoning-gym 0.1.25: boxnet, graph_color, propositional_logic,
rubiks_cube, rush_hour score it below 1.0), and a warm start on it would teach wrong answers.
"""

from __future__ import annotations

from typing import Any

from spanlab.agents.answer.prompt import answer_tags, default_template, render
from spanlab.prompts import DEFAULT_RENDERER
from spanlab.tasksets.reasoning_gym.scoring import score

ANSWER_TAG = "answer"  # the answer agent's default answer_tag


def demonstration(task: dict[str, Any]) -> dict[str, Any]:
    """``{"messages", "tools"}``: the prompt the answer agent sends by default and the reference answer."""
    graded = score(task["answer"], task)
    if graded["reward"] != 1.0:
        raise ValueError(f"family {task['family']}: its reference answer scores {graded['reward']:.2f}, not 1.0 "
                         "(the family checks answers another way); leave it out of warm starts")
    messages = render(DEFAULT_RENDERER, default_template(), task["question"], ANSWER_TAG)
    reply = answer_tags(ANSWER_TAG).replace("></", f">{task['answer']}</")
    return {"messages": [*messages, {"role": "assistant", "content": reply}], "tools": []}
