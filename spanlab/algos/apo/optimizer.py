"""APO's optimizer LLM: a critique ("textual gradient") from graded rollouts, then edits of the prompt.

Two calls to any OpenAI-compatible endpoint, each with its own model: the critique model reads the
parent template and transcripts of low- and high-reward rollouts and says what to change; the edit
model rewrites the template from that critique. Its answer is untrusted text: :func:`extract_poml`
only cuts the template out, validation (``spanlab.prompts.check_template``) decides whether it may
ever be rendered. Calls, tokens and seconds are counted for the run's budget report.

The meta-prompts are plain Python strings, not POML: they are ours, and the rollout transcripts they
carry would cost a Node render per call for nothing.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from openai import OpenAI, OpenAIError

from spanlab.adapters.messages import Conversation, transcript
from spanlab.algos.apo.config import OptimizerConfig
from spanlab.errors import ConfigError, SpanlabError
from spanlab.prompts.poml_template import ALLOWED_TAGS

logger = logging.getLogger(__name__)

CRITIQUE_SYSTEM = (
    "You review the prompt of an LLM agent. You see the prompt template and conversations the agent had with "
    "it, each with a grader's verdict. Find what in the prompt makes the agent fail, and say concretely what "
    "to change. Be brief: at most 8 bullet points."
)
EDIT_SYSTEM = (
    "You rewrite prompt templates written in POML (an XML-like prompt markup). Reply with the complete new "
    "template in one ```poml code block and nothing else."
)
_FENCE = re.compile(r"```(?:poml|xml)?[ \t]*\n(.*?)```", re.DOTALL)
_POML = re.compile(r"<poml\b.*?</poml\s*>", re.DOTALL | re.IGNORECASE)


class OptimizerError(SpanlabError, RuntimeError):
    """The optimizer endpoint failed (after the client's retries)."""


@dataclass
class OptimizerUsage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    by_model: dict[str, int] = field(default_factory=dict)


def extract_poml(answer: str) -> str:
    """The template in an edit answer: a fenced block, else the ``<poml>...</poml>`` span, else all of it."""
    fenced = _FENCE.findall(answer)
    if fenced:
        return fenced[-1].strip()
    tagged = _POML.findall(answer)
    return (tagged[-1] if tagged else answer).strip()


def _example(i: int, conv: Conversation, task_text: str) -> str:
    verdict = conv.notes.get("grade") or {}
    feedback = ", ".join(f"{k}: {verdict[k]}" for k in ("answer", "expected", "met", "missed") if k in verdict)
    reward = "none" if conv.reward is None else f"{conv.reward:.2f}"
    return (f"### Example {i} (reward {reward})\nTask: {task_text}\nGrader: {feedback or 'no details'}\n"
            f"Conversation:\n{transcript(conv)}\n")


def critique_messages(template: str, low: Sequence[tuple[Conversation, str]],
                      high: Sequence[tuple[Conversation, str]]) -> list[dict[str, str]]:
    """The critique request: the template, then low- and high-reward examples as (conversation, task text)."""
    parts = [f"## Prompt template\n```poml\n{template}\n```\n", "## Conversations that went wrong\n"]
    parts += [_example(i + 1, c, t) for i, (c, t) in enumerate(low)] or ["(none)\n"]
    parts += ["## Conversations that went well\n"]
    parts += [_example(i + 1, c, t) for i, (c, t) in enumerate(high)] or ["(none)\n"]
    parts.append("What in the prompt causes the failures, and what exactly should change?")
    return [{"role": "system", "content": CRITIQUE_SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def edit_messages(template: str, critique: str, required: Sequence[str]) -> list[dict[str, str]]:
    variables = ", ".join("{{ " + v + " }}" for v in required)
    rules = (
        f"- Keep these variables exactly once each: {variables}. Write no other {{{{ }}}}: POML runs them as "
        "JavaScript, and templates with expressions are rejected.\n"
        f"- Use only these tags: {', '.join(sorted(ALLOWED_TAGS))}; the only attribute allowed is caption.\n"
        "- Text outside <human-msg> becomes the system message; keep the request in a <human-msg>."
    )
    user = f"## Template\n```poml\n{template}\n```\n\n## Critique\n{critique}\n\n## Rules\n{rules}\n"
    return [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": user}]


class Optimizer:
    """The critique and edit calls of one APO run (synchronous: APO waits for them anyway)."""

    def __init__(self, config: OptimizerConfig, *, default_base_url: str, default_model: str) -> None:
        self.config = config
        self.critique_model = config.critique_model or default_model
        self.edit_model = config.edit_model or self.critique_model
        try:
            base_url, api_key = config.resolved_base_url() or default_base_url, config.api_key()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=config.timeout_s,
                             max_retries=config.max_retries)
        self.usage = OptimizerUsage()

    def close(self) -> None:
        self.client.close()

    def _complete(self, model: str, messages: list[dict[str, str]], seed: int) -> str:
        started = time.monotonic()
        try:
            resp = self.client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                                       temperature=self.config.temperature,
                                                       max_tokens=self.config.max_tokens, seed=seed)
        except OpenAIError as exc:
            raise OptimizerError(f"optimizer call to {model} at {self.client.base_url} failed: {exc}") from exc
        u = self.usage
        u.calls += 1
        u.seconds += time.monotonic() - started
        u.by_model[model] = u.by_model.get(model, 0) + 1
        if resp.usage is not None:
            u.prompt_tokens += resp.usage.prompt_tokens
            u.completion_tokens += resp.usage.completion_tokens
        return resp.choices[0].message.content or ""

    def critique(self, template: str, low: Sequence[tuple[Conversation, str]],
                 high: Sequence[tuple[Conversation, str]], *, seed: int) -> str:
        return self._complete(self.critique_model, critique_messages(template, low, high), seed).strip()

    def reflect(self, messages: list[dict[str, str]], *, seed: int) -> str:
        """GEPA's reflection call (its own prompt, ``gepa_search.py``), answered by the edit model."""
        return self._complete(self.edit_model, messages, seed)

    def edit(self, template: str, critique: str, required: Sequence[str], *, seed: int) -> str:
        """One edited template (extracted, not yet validated)."""
        return extract_poml(self._complete(self.edit_model, edit_messages(template, critique, required), seed))
