"""The answer agent's prompt: a POML template with ``{{ question }}`` and ``{{ answer_tags }}``, and the answer
extraction.

Why ``{{ answer_tags }}``: POML 0.0.8 drops a literal ``<`` from template text (``&lt;answer&gt;`` renders as
``answer``), so the tags the model must write reach the prompt as a variable; both variables are required, so
an APO candidate cannot drop the answer format. Why the values are filled in verbatim: a question is data (grids,
code, indentation), which POML would re-flow, and a Node render per distinct question costs seconds. The
template is rendered once with markers (:meth:`~spanlab.prompts.PromptRenderer.skeleton`) and the markers are
replaced by the values, so the model sees the family's question exactly as generated.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from spanlab.prompts import PromptRenderer

REQUIRED_VARIABLES: tuple[str, ...] = ("answer_tags", "question")  # every prompt version must place these
_MARKER = "SPANLABVAR{}X"  # PromptRenderer.skeleton's marker for the i-th sorted variable


def default_template() -> str:
    """The packaged starting prompt (APO's round-0 parent)."""
    return resources.files("spanlab.agents.answer").joinpath("prompt.poml").read_text()


def answer_tags(tag: str) -> str:
    return f"<{tag}></{tag}>"


def render(renderer: PromptRenderer, template: str, question: str, tag: str) -> list[dict[str, Any]]:
    """The chat messages of ``template`` with the question and the answer tags inserted verbatim."""
    values = {"answer_tags": answer_tags(tag), "question": question}
    names = sorted(values)
    skeleton = renderer.skeleton(template, names)
    markers = {_MARKER.format(i): values[n] for i, n in enumerate(names)}
    messages = []
    for message in skeleton:
        content = message.get("content")
        if not isinstance(content, str):
            raise ValueError(f"the prompt renders a {message.get('role')} message that is not plain text")
        for marker, value in markers.items():
            content = content.replace(marker, value)
        messages.append({**message, "content": content})
    return messages


def extract_answer(text: str | None, tag: str = "answer") -> str | None:
    """The text between the last ``<tag>`` and ``</tag>`` (stripped), as reasoning-gym's ``extract_answer``
    reads it; None when the output has no such pair."""
    matches = re.findall(rf"<{re.escape(tag)}>\s?(.*?)\s?</{re.escape(tag)}>", text or "", flags=re.DOTALL)
    return matches[-1].strip() if matches else None
