"""Demonstrations mined from the store: worked examples from the best recorded rollouts, added to a prompt.

Bootstrap few-shot, as DSPy does it: a small model often follows an example better than an instruction,
and choosing examples needs no optimizer model. After the instruction search (beam or GEPA), the winner
gets ``candidates`` variants, each with ``k`` solved examples drawn (seeded) from the highest-reward train
rollouts the search recorded (only rollouts whose last attempt finished with a final reward, and only their
successful calls: the sample rule of :mod:`spanlab.adapters.trainable`): the task's request and what the agent
did (its tool calls with their arguments, then its answer), read back from the rollout's spans. Each variant
is a prompt version like any other: validated, scored on the same validation tasks through the rollout cache;
the best by validation mean wins (the variant without examples competes too, ties go to the older version).

The examples are rendered into the system part of the POML template as ``<cp caption="Example N">``
paragraphs, not as POML ``<example>`` turns: those render as user/assistant chat turns whose
"assistant" text would teach a tool-calling agent to write its tool call as prose.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spanlab.adapters.messages import Conversation, conversations
from spanlab.adapters.trainable import trainable_rollouts
from spanlab.prompts import check_template

if TYPE_CHECKING:
    from spanlab.algos.apo.config import DemosConfig
    from spanlab.algos.apo.search import BeamSearch, Candidate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demo:
    task_id: str
    request: str
    steps: list[str]  # "Call find_rooms with {...}", ..., then the final answer
    reward: float


def _safe(text: str) -> str:
    """Text that stays text in POML: no tags, no ``{{ }}`` (JavaScript there), no entities."""
    return (text.replace("&", " and ").replace("<", "(").replace(">", ")")
            .replace("{{", "{ {").replace("}}", "} }").strip())


def steps_of(conv: Conversation, max_chars: int = 300) -> list[str]:
    """What the agent did: each tool call with its arguments, then its last answer."""
    steps, answer = [], ""
    for msg in conv.messages:
        if msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", {})
            steps.append(f"Call {fn.get('name')} with {fn.get('arguments')}"[:max_chars])
        if isinstance(msg.get("content"), str) and msg["content"].strip():
            answer = msg["content"].strip()[:max_chars]
    return [*steps, answer] if answer else steps


def with_demos(template: str, demos: list[Demo]) -> str:
    """``template`` with the examples as paragraphs before its first ``<human-msg>`` (else before ``</poml>``)."""
    blocks = "\n".join(
        f'<cp caption="Example {i}"><p>Request: {_safe(d.request)}</p>'
        + "".join(f"<p>{_safe(step)}</p>" for step in d.steps) + "</cp>"
        for i, d in enumerate(demos, 1))
    at = template.find("<human-msg")
    at = at if at >= 0 else template.rfind("</poml")
    at = at if at >= 0 else len(template)
    return f"{template[:at]}{blocks}\n{template[at:]}"


def mine(search: BeamSearch, min_reward: float) -> list[Demo]:
    """One demo per train task, from its best recorded trainable rollout at or above ``min_reward``, best first."""
    train = {t["task_id"]: t for t in search.train}
    store = search.runner.collector.store
    candidates = [(task_id, rollout_id, reward) for (_, task_id), (rollout_id, reward) in search.runner.cache.items()
                  if task_id in train and reward >= min_reward]
    usable = trainable_rollouts(store, [rid for _, rid, _ in candidates])
    best: dict[str, tuple[str, float]] = {}
    for task_id, rollout_id, reward in candidates:
        if rollout_id in usable and reward > best.get(task_id, ("", -1.0))[1]:
            best[task_id] = (rollout_id, reward)
    convs = conversations(store, [rid for rid, _ in best.values()])
    demos = []
    for task_id, (rollout_id, reward) in best.items():
        steps = steps_of(convs[rollout_id])
        if steps:
            task = train[task_id]
            demos.append(Demo(task_id, str(task.get("request", task.get("question", ""))), steps, reward))
    return sorted(demos, key=lambda d: (-d.reward, d.task_id))


def add_demos(search: BeamSearch, best: Candidate, config: DemosConfig) -> Candidate:
    """``config.candidates`` variants of ``best`` with mined examples, scored on val; returns the winner."""

    round_ = max((c.round for c in search.lineage), default=0) + 1
    pool = mine(search, config.min_reward)
    if len(pool) < config.k:  # too few: run the winner on more train tasks, then mine again
        extra = [t for t in search.train if not any(d.task_id == t["task_id"] for d in pool)][: config.pool_tasks]
        pairs = [(int(best.version or 0), t) for t in extra]
        if extra and search._affordable(pairs):
            search.runner.score(pairs, mode="train", metadata=search._meta(round_, "demos"))
            pool = mine(search, config.min_reward)
    if len(pool) < config.k:
        logger.info("demos: %d train rollouts reach reward %.2f, fewer than k=%d: no variants", len(pool),
                    config.min_reward, config.k)
        return best
    rng = random.Random(f"spanlab-apo-demos:{search.config.seed}")
    known = {c.version for c in search.lineage if c.version is not None}
    variants: list[Candidate] = []
    for _ in range(config.candidates):
        demos = sorted(rng.sample(pool, config.k), key=lambda d: d.task_id)
        template = with_demos(best.template, demos)
        note = "demos: " + json.dumps([d.task_id for d in demos])
        problems = check_template(template, search.required, renderer=search.renderer)
        if problems:  # the examples' text broke the template: kept in the lineage, never run
            search._new(template, round_, "rejected", parent=best.id, critique=note, problems=problems)
            continue
        version, _ = search.bank.version_of(template, origin="demos", parent_version=best.version,
                                            demos=[d.task_id for d in demos], run_id=search.run_id)
        status = "duplicate" if version in known else "scored"
        cand = search._new(template, round_, status, parent=best.id, version=version, critique=note)
        known.add(version)
        if status == "scored":
            variants.append(cand)
    search._score(variants, round_=round_)
    winner = sorted([c for c in [best, *variants] if c.val is not None], key=lambda c: c.sort_key())[0]
    search.rounds.append({"round": float(round_), "demo_variants": float(len(variants)),
                          "best_val": winner.val.mean if winner.val else float("nan"),
                          "best_version": float(winner.version or 0), "rollouts_run": float(search.runner.ran)})
    logger.info("demos: %d variants of %s with %d examples each; winner %s=%s", len(variants), best.id, config.k,
                winner.id, winner.val)
    return winner

