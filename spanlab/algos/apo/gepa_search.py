"""APO through GEPA: reflective prompt evolution with a Pareto frontier (``apo.search: gepa``).

GEPA (the ``gepa`` package, DSPy's default optimizer) owns the search: which candidate to mutate
(Pareto frontier over validation tasks), which train minibatch to reflect on, when to accept a child
and when to stop. spanlab supplies what GEPA calls its adapter, so every number is a real rollout:

* ``evaluate``: a candidate is a POML template; it must pass the validator (safe POML subset,
  required variables, renders) before it may cost a rollout, else it scores 0 on every task and is
  kept in the lineage as ``rejected``. A valid one becomes a prompt version in the store and runs
  through the gateway into the store, each (version, task) pair at most once (``RolloutRunner``).
* ``make_reflective_dataset``: the rollouts' conversations read back from their spans (the messages
  adapter), with the reward and the grader's notes, which GEPA hands to the reflection model.
* the reflection model is APO's optimizer endpoint (any OpenAI-compatible server, its ``edit_model``),
  asked with a POML-aware version of GEPA's instruction-proposal prompt.

Budget: ``rounds * branch_factor`` proposals, and ``max_rollouts`` new rollouts (checked before each
evaluation; an evaluation that does not fit is skipped and the search stops).
"""

from __future__ import annotations

import logging
from typing import Any

from spanlab.adapters.messages import conversations, transcript
from spanlab.algos.apo.rollouts import Request
from spanlab.algos.apo.search import BeamSearch, Candidate, Task
from spanlab.prompts import check_template

logger = logging.getLogger(__name__)
COMPONENT = "prompt"  # the one text GEPA evolves: the agent's POML template

REFLECTION_TEMPLATE = """You improve the prompt template of an LLM agent. The template is written in POML, an XML-like \
prompt markup; the agent sees it rendered, with its variables filled in. The current template:
```poml
<curr_param>
```

Below are tasks the agent ran with this template: its conversation (read back from recorded spans), the reward \
it earned (1.0 is perfect) and the grader's notes:
```
<side_info>
```

Find what in the template makes the agent fail and write a better template. Rules:
- Keep these variables exactly once each: <variables>. Write no other {{ }}: POML runs them as JavaScript, and \
templates with expressions are rejected.
- Use only these tags: <tags>; the only attribute allowed is caption.
- Text outside <human-msg> becomes the system message; keep the request in a <human-msg>.

Reply with the complete new template in one ```poml code block."""


class PromptAdapter:
    """GEPA's adapter for one APO run (structurally a ``gepa.GEPAAdapter``; GEPA imports lazily)."""

    propose_new_texts = None  # GEPA's reflective proposer, with our reflection prompt

    def __init__(self, search: GEPASearch) -> None:
        self.search = search
        self.val_ids = {t["task_id"] for t in search.val}

    def evaluate(self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch

        cand = self.search.candidate_for(candidate[COMPONENT])
        zeros = [0.0] * len(batch)
        if cand.version is None:  # rejected by the validator, or over the budget: no rollout
            traces = [{"rollout_id": None, "task": t, "reward": 0.0, "problems": cand.problems} for t in batch]
            return EvaluationBatch(outputs=[None] * len(batch), scores=zeros,
                                   trajectories=traces if capture_traces else None)
        purpose = "validation" if all(t["task_id"] in self.val_ids for t in batch) else "gradient"
        pairs = [(cand.version, t) for t in batch]
        if not self.search._affordable(pairs):
            self.search.out_of_budget = True
            return EvaluationBatch(outputs=[None] * len(batch), scores=zeros, trajectories=None)
        results = self.search.runner.score(pairs, mode="val" if purpose == "validation" else "train",
                                           metadata=self.search._meta(self.search.proposals, purpose))
        traces = [{"rollout_id": rid, "task": t, "reward": r, "problems": []}
                  for (rid, r), t in zip(results, batch, strict=True)]
        return EvaluationBatch(outputs=[rid for rid, _ in results], scores=[r for _, r in results],
                               trajectories=traces if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        traces = eval_batch.trajectories or []
        convs = conversations(self.search.runner.collector.store, [t["rollout_id"] for t in traces if t["rollout_id"]])
        records = []
        for t in traces:
            task = t["task"]
            conv = convs.get(t["rollout_id"]) if t["rollout_id"] else None
            verdict = (conv.notes.get("grade") if conv else None) or {}
            notes = ", ".join(f"{k}: {verdict[k]}" for k in ("answer", "expected", "met", "missed") if k in verdict)
            records.append({
                "Inputs": str(task.get("request", task.get("question", task))),
                "Generated Outputs": transcript(conv) if conv else "(no rollout: " + "; ".join(t["problems"]) + ")",
                "Feedback": f"reward {t['reward']:.2f}; grader: {notes or 'no details'}",
            })
        return {name: records for name in components_to_update}


class GEPASearch(BeamSearch):
    """One GEPA search; same interface as :class:`BeamSearch` (``root``, ``run``, ``lineage``, ``rounds``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by_template: dict[str, Candidate] = {}
        self.proposals = 0
        self.out_of_budget = False

    def root(self, start: str) -> Candidate:
        cand = super().root(start)
        self.by_template[start] = cand
        return cand

    def first_requests(self, root: Candidate) -> list[Request]:
        """Only the root's validation rollouts: GEPA draws its train minibatches itself."""
        return self._within_budget([self._request(root, self.val, "val", 0, "validation")])

    def candidate_for(self, template: str) -> Candidate:
        """The lineage entry of ``template``: validated, and stored as a version if valid, on first sight."""
        if template in self.by_template:
            return self.by_template[template]
        self.proposals += 1
        problems = check_template(template, self.required, renderer=self.renderer)
        if problems:
            cand = self._new(template, self.proposals, "rejected", problems=problems)
            logger.info("GEPA proposal %d rejected: %s", self.proposals, "; ".join(problems))
        else:
            # A new text is a new version: versions are keyed by the text's hash, and repeats of a text are
            # answered from by_template above.
            version, _ = self.bank.version_of(template, origin="gepa", proposal=self.proposals, run_id=self.run_id)
            cand = self._new(template, self.proposals, "scored", version=version)
        self.by_template[template] = cand
        return cand

    def _reflect(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        seed = self.config.seed * 1_000_003 + 7919 * (self.proposals + 1)
        return self.optimizer.reflect(messages, seed=seed)

    def run(self, root: Candidate) -> Candidate:
        """GEPA from ``root``; returns the candidate with the best validation mean (ties: older version)."""
        import gepa
        from gepa.utils import MaxCandidateProposalsStopper

        from spanlab.prompts.poml_template import ALLOWED_TAGS

        self._score([root], round_=0)
        if root.val is None:
            raise ValueError(f"apo.max_rollouts={self.config.max_rollouts} cannot even score the starting prompt")
        template = (REFLECTION_TEMPLATE.replace("<variables>", ", ".join("{{ " + v + " }}" for v in self.required))
                    .replace("<tags>", ", ".join(sorted(ALLOWED_TAGS))))
        proposals = self.config.rounds * self.config.branch_factor
        if proposals > 0:
            gepa.optimize(
                seed_candidate={COMPONENT: root.template}, trainset=self.train, valset=self.val,
                adapter=PromptAdapter(self), reflection_lm=self._reflect, reflection_prompt_template=template,
                reflection_minibatch_size=min(self.config.gradient_tasks, len(self.train)),
                candidate_selection_strategy="pareto", seed=self.config.seed, display_progress_bar=False,
                stop_callbacks=[MaxCandidateProposalsStopper(proposals), lambda state: self.out_of_budget],
                logger=_GEPALog(), raise_on_exception=True,
            )
        for cand in self.lineage:  # GEPA scored accepted children on every val task: those are cache hits now
            if cand.status == "scored" and cand.val is None:
                if self.runner.missing([(int(cand.version or 0), t) for t in self.val]):
                    cand.status = "not_accepted"  # it lost GEPA's minibatch comparison with its parent
                else:
                    self._score([cand], round_=cand.round)
        scored = [c for c in self.lineage if c.val is not None]
        best = sorted(scored, key=Candidate.sort_key)[0]
        self._log_summary(best)
        return best

    def _log_summary(self, best: Candidate) -> None:
        count = {s: float(sum(c.status == s for c in self.lineage)) for s in
                 ("rejected", "not_accepted", "scored")}
        self.rounds.append({"round": 1.0, "candidates": float(len(self.lineage) - 1), **count,
                            "best_val": best.val.mean if best.val else float("nan"),
                            "best_version": float(best.version or 0), "rollouts_run": float(self.runner.ran),
                            "cache_hits": float(self.runner.hits),
                            "optimizer_calls": float(self.optimizer.usage.calls)})
        logger.info("GEPA: %d proposals (%d rejected, %d not accepted, %d scored on val), best %s=%s",
                    self.proposals, count["rejected"], count["not_accepted"], count["scored"], best.id, best.val)


class _GEPALog:
    """GEPA's progress lines into our logger (its default prints to stdout)."""

    def log(self, message: str) -> None:
        logger.info("gepa: %s", message)


def gepa_available() -> bool:
    try:
        import gepa  # noqa: F401
    except ImportError:
        return False
    return True
