"""APO's beam search with textual gradients, over prompt versions scored by real rollouts.

Round 0 scores the starting prompt on the validation tasks (with the first round's train batch, these
run in the base evaluation's batch: :meth:`BeamSearch.first_requests`). Each round, for every prompt in the beam:
run it on a seeded batch of train tasks, show the optimizer's critique model the lowest- and
highest-reward conversations (read back from the store's spans), let the edit model write
``branch_factor`` candidates from that critique, and validate each before it may cost a rollout (safe
POML subset, required variables kept, renders). All surviving candidates are scored on the same
validation tasks; the beam keeps the ``beam_width`` best of parents and children (ties: older version).
Every candidate, rejected ones included, is kept in the lineage with its parent, critique and problems.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from spanlab.adapters.messages import conversations
from spanlab.algos.apo.config import APOConfig
from spanlab.algos.apo.optimizer import Optimizer
from spanlab.algos.apo.rollouts import PromptBank, Request, RolloutRunner, Task
from spanlab.prompts import PromptRenderer, check_template
from spanlab.stats import Interval, bootstrap
from spanlab.types import RolloutMode

logger = logging.getLogger(__name__)

Status = Literal["root", "scored", "rejected", "duplicate", "over_budget", "not_accepted"]


@dataclass
class Candidate:
    id: str
    template: str
    round: int
    status: Status
    parent: str | None = None
    version: int | None = None
    critique: str | None = None
    problems: list[str] = field(default_factory=list)
    val_rewards: list[float] = field(default_factory=list)
    val: Interval | None = None

    def sort_key(self) -> tuple[float, int]:
        return (-(self.val.mean if self.val else -1.0), self.version or 0)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "parent": self.parent, "round": self.round, "status": self.status,
                "version": self.version, "val": self.val.as_dict() if self.val else None,
                "problems": self.problems, "critique": self.critique, "template": self.template}


class BeamSearch:
    """One APO search; :meth:`run` returns the best candidate, ``lineage`` holds every candidate."""

    def __init__(self, config: APOConfig, runner: RolloutRunner, optimizer: Optimizer, bank: PromptBank, *,
                 required: Sequence[str], train: list[Task], val: list[Task], run_id: str,
                 renderer: PromptRenderer | None = None) -> None:
        self.config, self.runner, self.optimizer, self.bank = config, runner, optimizer, bank
        self.required, self.train, self.val, self.run_id = list(required), train, val, run_id
        self.renderer = renderer
        self.lineage: list[Candidate] = []
        self.rounds: list[dict[str, float]] = []
        self.rng = random.Random(f"spanlab-apo:{config.seed}")
        self._batches: dict[tuple[str, int], list[Task]] = {}

    def _new(self, template: str, round_: int, status: Status, **kw: Any) -> Candidate:
        cand = Candidate(id=f"c{len(self.lineage)}", template=template, round=round_, status=status, **kw)
        self.lineage.append(cand)
        return cand

    def root(self, start: str) -> Candidate:
        """The starting prompt, validated and stored as a version (the base evaluation runs it)."""
        problems = check_template(start, self.required, renderer=self.renderer)
        if problems:
            raise ValueError("the starting prompt fails validation:\n  " + "\n  ".join(problems))
        version, _ = self.bank.version_of(start, origin="start", run_id=self.run_id)
        return self._new(start, 0, "root", version=version)

    def run(self, root: Candidate) -> Candidate:
        """Beam search from ``root``; returns the best candidate by validation score."""
        self._score([root], round_=0)
        if root.val is None:
            raise ValueError(f"apo.max_rollouts={self.config.max_rollouts} cannot even score the starting prompt")
        beam = [root]
        for round_ in range(1, self.config.rounds + 1):
            children = [c for parent in beam for c in self._expand(parent, round_)]
            self._score(children, round_=round_)
            pool = {c.version: c for c in [*beam, *children] if c.val is not None}
            beam = sorted(pool.values(), key=Candidate.sort_key)[: self.config.beam_width]
            self._log_round(round_, children, beam)
        return beam[0]

    def first_requests(self, root: Candidate) -> list[Request]:
        """The rollouts :meth:`run` starts with, as far as the budget allows: the root on the validation
        tasks, then (a beam's first parent is the root) on its first critique batch."""
        requests = [self._request(root, self.val, "val", 0, "validation")]
        if self.config.rounds:
            requests.append(self._request(root, self._batch(root, 1), "train", 1, "gradient"))
        return self._within_budget(requests)

    def _request(self, cand: Candidate, tasks: list[Task], mode: RolloutMode, round_: int, purpose: str) -> Request:
        """What :meth:`_expand` and :meth:`_score` run, so that rollouts run ahead are the ones they look up."""
        return _pairs([cand], tasks), mode, self._meta(round_, purpose)

    def _within_budget(self, requests: list[Request]) -> list[Request]:
        """The longest prefix of ``requests`` whose rollouts the budget allows together."""
        for n in range(len(requests), 0, -1):
            if self._affordable([pair for pairs, _, _ in requests[:n] for pair in pairs]):
                return requests[:n]
        return []

    def _batch(self, parent: Candidate, round_: int) -> list[Task]:
        """The train tasks ``parent`` is critiqued on in ``round_``: drawn (seeded) once, when first asked for."""
        if (parent.id, round_) not in self._batches:
            n = min(self.config.gradient_tasks, len(self.train))
            self._batches[(parent.id, round_)] = self.rng.sample(self.train, n)
        return self._batches[(parent.id, round_)]

    def _expand(self, parent: Candidate, round_: int) -> list[Candidate]:
        """Critique ``parent`` on a train batch and propose ``branch_factor`` validated children."""
        batch = self._batch(parent, round_)
        pairs, mode, metadata = self._request(parent, batch, "train", round_, "gradient")
        if not self._affordable(pairs):
            logger.info("round %d: no budget left to critique %s", round_, parent.id)
            return []
        results = self.runner.score(pairs, mode=mode, metadata=metadata)
        convs = conversations(self.runner.collector.store, [rid for rid, _ in results])
        order = sorted(range(len(batch)), key=lambda i: (results[i][1], i))
        k = self.config.critique_examples
        low = [i for i in order if results[i][1] < 1.0][:k]
        high = [i for i in reversed(order) if results[i][1] > 0.0 and i not in low][:k]
        examples = [[(convs[results[i][0]], str(batch[i].get("request", batch[i]))) for i in idx]
                    for idx in (low, high)]
        seed = self.config.seed * 1_000_003 + round_ * 1009 + int(parent.version or 0)
        critique = self.optimizer.critique(parent.template, examples[0], examples[1], seed=seed)
        children = []
        known = {c.version for c in self.lineage if c.version is not None}
        for b in range(self.config.branch_factor):
            text = self.optimizer.edit(parent.template, critique, self.required, seed=seed + 7919 * (b + 1))
            problems = check_template(text, self.required, renderer=self.renderer)
            if problems:
                self._new(text, round_, "rejected", parent=parent.id, critique=critique, problems=problems)
                logger.info("round %d: candidate from %s rejected: %s", round_, parent.id, "; ".join(problems))
                continue
            version, _ = self.bank.version_of(text, origin="apo", parent_version=parent.version, round=round_,
                                              run_id=self.run_id)
            status: Status = "duplicate" if version in known else "scored"
            cand = self._new(text, round_, status, parent=parent.id, version=version, critique=critique)
            known.add(version)
            if status == "scored":
                children.append(cand)
        return children

    def _score(self, cands: list[Candidate], *, round_: int) -> None:
        """Score candidates on the validation tasks, as many as the budget allows, in one batch."""
        affordable = []
        for cand in cands:
            if self._affordable(_pairs([*affordable, cand], self.val)):
                affordable.append(cand)
            else:
                cand.status = "over_budget"
        pairs = _pairs(affordable, self.val)
        results = self.runner.score(pairs, mode="val", metadata=self._meta(round_, "validation"))
        for i, cand in enumerate(affordable):
            cand.val_rewards = [r for _, r in results[i * len(self.val):(i + 1) * len(self.val)]]
            cand.val = bootstrap(cand.val_rewards, level=self.config.confidence, seed=self.config.seed)

    def _affordable(self, pairs: list[tuple[int, Task]]) -> bool:
        left = self.runner.budget_left()
        return left is None or len(self.runner.missing(pairs)) <= left

    def _meta(self, round_: int, purpose: str) -> dict[str, Any]:
        return {"run_id": self.run_id, "algorithm": "apo", "round": round_, "purpose": purpose}

    def _log_round(self, round_: int, children: list[Candidate], beam: list[Candidate]) -> None:
        made = [c for c in self.lineage if c.round == round_]
        metrics = {
            "round": float(round_),
            "candidates": float(len(made)),
            "rejected": float(sum(c.status == "rejected" for c in made)),
            "duplicates": float(sum(c.status == "duplicate" for c in made)),
            "over_budget": float(sum(c.status == "over_budget" for c in made)),
            "scored": float(len(children)),
            "best_val": beam[0].val.mean if beam and beam[0].val else float("nan"),
            "best_version": float(beam[0].version or 0) if beam else float("nan"),
            "rollouts_run": float(self.runner.ran),
            "cache_hits": float(self.runner.hits),
            "optimizer_calls": float(self.optimizer.usage.calls),
        }
        self.rounds.append(metrics)
        logger.info("APO round %d: %d candidates (%d rejected, %d duplicate), beam %s", round_, len(made),
                    metrics["rejected"], metrics["duplicates"], [f"{c.id}={c.val}" for c in beam])


def _pairs(cands: list[Candidate], tasks: list[Task]) -> list[tuple[int, Task]]:
    """The (prompt version, task) pairs that score ``cands`` on ``tasks``, candidate by candidate."""
    return [(int(c.version or 0), t) for c in cands for t in tasks]
