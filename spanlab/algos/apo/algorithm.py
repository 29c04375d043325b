"""``algorithm: apo``: automatic prompt optimization of an agent's POML prompt, by beam search or GEPA.

Run: ``spanlab train tutorials/rooms/apo.yaml`` (config section ``apo:``, see ``config.py``). No torch.

Before the framework's base evaluation, the starting prompt is stored as version 1 of the ``prompt``
resource. The search runs in between: the beam search with textual gradients (``search.py``: critiques
from real rollouts' spans, edits by an optimizer LLM, validation, scoring on val) or GEPA
(``gepa_search.py``, ``apo.search: gepa``: spanlab is GEPA's adapter). The framework's held-out
evaluation then scores the starting prompt (base) and the winner (final) on the same ``eval`` tasks,
through the same rollout cache as the search: every rollout pins the prompt version it ran with
(``rollouts.resources_version``) and no (version, task) pair runs twice (``rollouts.py``). Reported on
top: the paired difference with bootstrap intervals, the lineage of every candidate
(``run_dir/apo.json``), and the budget (rollouts run, cache hits, optimizer calls and tokens, seconds).
Left out vs Agent Lightning's APO: async/parallel optimizer calls, a separate "apply gradient" prompt
per example, and LLM-judge rewards.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from spanlab.algos.apo.config import APOConfig
from spanlab.errors import ConfigError
from spanlab.jobs.algorithm import Algorithm
from spanlab.jobs.tasks import TASK_SETS
from spanlab.progress import running_mean

if TYPE_CHECKING:
    from spanlab.algos.apo.search import Candidate
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.job import Evaluator, Job
    from spanlab.jobs.rollouts import RolloutBatch
    from spanlab.progress import Phase

logger = logging.getLogger(__name__)


class APO(Algorithm[APOConfig]):
    config_model = APOConfig
    steps_key = "rounds"

    def check(self) -> None:
        if self.config.eval.split != "test":
            raise ConfigError("eval.split: APO selects prompts on val, so its held-out split must be test")
        if not self.config.eval.base:
            raise ConfigError("eval.base: APO's paired difference needs the start prompt's evaluation; remove it")
        if self.settings.search == "gepa":
            from spanlab.algos.apo.gepa_search import gepa_available

            if not gepa_available():
                raise ConfigError("apo.search: gepa needs the gepa package: pip install 'spanlab[apo]' "
                                  "(scripts/setup.sh installs it)")
        _start(self.config)

    def train_tasks(self) -> int:
        """Train tasks to draw: the critiques' batches, and the pool demonstrations are mined from."""
        n = self.settings.gradient_tasks * 2  # the framework draws twice this many: the batches critiques use
        demos = self.settings.demos
        return n if demos is None else max(n, demos.pool_tasks)

    def prepare(self, job: Job) -> None:
        """Store the starting prompt (the base evaluation runs it) and open the search."""
        from spanlab.algos.apo.gepa_search import GEPASearch
        from spanlab.algos.apo.optimizer import Optimizer
        from spanlab.algos.apo.rollouts import PromptBank, RolloutRunner
        from spanlab.algos.apo.search import BeamSearch

        apo, config = self.settings, self.config
        template, required = _start(config)
        temperature = config.eval.temperature if config.rollouts.temperature is None else config.rollouts.temperature
        bank = PromptBank(job.rig.store, apo.resource)
        self.runner = RolloutRunner(job.rig.collector, bank, overrides={"model": job.served_name,
                                    "temperature": temperature}, max_rollouts=apo.max_rollouts)
        self.optimizer = Optimizer(apo.optimizer, default_base_url=f"{job.rig.root_url}/v1",
                                   default_model=job.served_name)
        job.stack.callback(self.optimizer.close)
        val = job.task_set.make_tasks("val", n=apo.val_tasks, seed=config.dataset.seed, levels=config.dataset.levels,
                                      **config.dataset.kwargs)  # the task set's own options, as every split has
        search = GEPASearch if apo.search == "gepa" else BeamSearch
        self.search = search(apo, self.runner, self.optimizer, bank, required=required,
                                 train=job.splits["train"], val=val, run_id=job.report.run_id)
        self.run_id = job.report.run_id
        self.root = self.best = self.search.root(template)
        self.held_out: dict[str, list[float]] = {}
        self.held_out_rollouts = 0
        logger.info("APO: beam %d x branch %d, %d rounds, %d val / %d test tasks; optimizer %s / %s at %s",
                    apo.beam_width, apo.branch_factor, apo.rounds, len(val), len(job.splits["eval"]),
                    self.optimizer.critique_model, self.optimizer.edit_model, self.optimizer.client.base_url)

    def evaluator(self) -> Evaluator:
        """The held-out evaluation runs the current best prompt through the search's cache."""
        return self._evaluate

    def run(self, job: Job) -> None:
        self.best = self.search.run(self.root)
        if self.settings.demos is not None:
            from spanlab.algos.apo.demos import add_demos

            self.best = add_demos(self.search, self.best, self.settings.demos)
        for metrics in self.search.rounds:
            job.log_step(metrics)

    def _evaluate(self, tasks: list[dict[str, Any]], phase: str, split: str, bar: Phase) -> RolloutBatch:
        """The current best prompt on the held-out tasks, through the cache; not charged to the search budget.

        The base evaluation also runs the rollouts the search starts with, in the same batch (its ``failed``
        and ``seconds`` are the whole batch's, and ``bar`` counts them too: cached pairs at once, the rest as
        each rollout ends)."""
        from spanlab.jobs.rollouts import RolloutBatch

        runner = self.runner
        pairs = [(int(self.best.version or 0), t) for t in tasks]
        metadata = {"run_id": self.run_id, "algorithm": "apo", "purpose": "test", "phase": phase, "split": split}
        held = len(runner.missing(pairs))
        failed, seconds = runner.failed, runner.seconds
        ahead = self.search.first_requests(self.root) if phase == "base" and split == self.config.eval.split else []
        extra = sum(len(runner.missing(p)) for p, _, _ in ahead)
        note = "reward {:.2f}" if extra else "accuracy {:.1%}"  # a batch with the search's rollouts: not accuracy
        cached = runner.cached_rewards(pairs)
        bar.extend(extra)
        if cached:
            bar.skip(len(cached), note=note.format(sum(cached) / len(cached)))
        runner.on_finished = running_mean(bar, note, done=cached)
        try:
            runner.run_ahead([(pairs, "test", metadata), *ahead])
        finally:
            runner.on_finished = None
        results = runner.score(pairs, mode="test", metadata=metadata)
        self.held_out_rollouts += held
        if runner.max_rollouts is not None:
            runner.max_rollouts += held
        rewards = [r for _, r in results]
        if split == self.config.eval.split:  # the paired before/after difference is the headline split's
            self.held_out[phase] = rewards
        return RolloutBatch([rid for rid, _ in results], rewards, runner.seconds - seconds, runner.failed - failed)

    def summarize(self, job: Job) -> None:
        """The paired test difference with bootstrap intervals, the budget, and the lineage (``apo.json``)."""
        before = self.held_out["base"]
        after = self.held_out.get("final", before)
        summary = _summary(self, before, after)
        job.log_step(summary)
        data = {"run_id": job.report.run_id, "summary": summary, "rounds": self.search.rounds,
                "candidates": [c.summary() for c in self.search.lineage]}
        (self.config.run_dir / "apo.json").write_text(json.dumps(data, indent=2) + "\n")
        # The search leaves its last *candidate* as the latest version, which is what every unpinned rollout
        # (a later GRPO or SFT run on this store, a served agent) would read: make it the winner instead.
        from spanlab.jobs.prompt import store_prompt

        store_prompt(job.rig.store, self.best.template, self.settings.resource, origin="apo winner",
                     run_id=job.report.run_id, candidate=self.best.id)
        job.progress.console.print(lineage_table(self.search.lineage, self.best))
        job.progress.console.print(
            f"test mean reward {summary['test_base']:.3f} -> {summary['test_final']:.3f} (paired diff "
            f"{summary['test_diff']:+.3f} [{summary['test_diff_low']:+.3f}, {summary['test_diff_high']:+.3f}], "
            f"n={len(before)}); winner {self.best.id} = {self.settings.resource}@{self.best.version}")


def _start(config: TrainConfig) -> tuple[str, list[str]]:
    """The starting template and the variables every candidate must keep (config, else the task set's)."""
    apo = config.section
    assert isinstance(apo, APOConfig)
    module = importlib.import_module(TASK_SETS.get(config.dataset.name, config.dataset.name))
    if apo.prompt is not None:
        if not apo.prompt.is_file():
            raise ConfigError(f"apo.prompt: {apo.prompt} is not a file")
        template = apo.prompt.read_text()
    elif callable(getattr(module, "default_template", None)):
        template = module.default_template()
    else:
        raise ConfigError(f"apo.prompt: task set {config.dataset.name!r} has no default_template(); give a file")
    required = apo.required_variables or getattr(module, "REQUIRED_VARIABLES", None)
    if not required:
        raise ConfigError("apo.required_variables: the task set declares none; list them")
    return template, list(required)


def _summary(apo: APO, before: list[float], after: list[float]) -> dict[str, float]:
    from spanlab.stats import bootstrap, paired_difference

    search, runner, optimizer, root, best = apo.search, apo.runner, apo.optimizer, apo.root, apo.best
    search_rollouts = runner.ran - apo.held_out_rollouts
    level, seed = apo.settings.confidence, apo.settings.seed
    b, a = bootstrap(before, level=level, seed=seed), bootstrap(after, level=level, seed=seed)
    d = paired_difference(after, before, level=level, seed=seed)
    u = optimizer.usage
    return {
        "test_base": b.mean, "test_base_low": b.low, "test_base_high": b.high,
        "test_final": a.mean, "test_final_low": a.low, "test_final_high": a.high,
        "test_diff": d.mean, "test_diff_low": d.low, "test_diff_high": d.high, "test_n": float(b.n),
        "test_exact_base": sum(r == 1.0 for r in before) / max(len(before), 1),
        "test_exact_final": sum(r == 1.0 for r in after) / max(len(after), 1),
        "val_base": root.val.mean if root.val else float("nan"), "val_best": best.val.mean if best.val else 0.0,
        "best_version": float(best.version or 0), "candidates": float(len(search.lineage) - 1),
        "rollouts_search": float(search_rollouts), "rollouts_total": float(runner.ran),
        "cache_hits": float(runner.hits), "rollouts_failed": float(runner.failed),
        "rollout_s": runner.seconds,
        "optimizer_calls": float(u.calls), "optimizer_prompt_tokens": float(u.prompt_tokens),
        "optimizer_completion_tokens": float(u.completion_tokens), "optimizer_s": u.seconds,
    }


def lineage_table(lineage: Sequence[Candidate], best: Candidate) -> Table:
    """Every candidate: where it came from, what became of it, its validation score."""
    table = Table(title="APO candidates (val: mean reward [bootstrap interval])")
    for col in ("id", "round", "parent", "version", "status", "val", "note"):
        table.add_column(col)
    for c in lineage:
        note = "; ".join(c.problems)[:80] if c.problems else ("winner" if c is best else "")
        table.add_row(c.id, str(c.round), c.parent or "-", str(c.version or "-"), c.status,
                      str(c.val) if c.val else "-", note)
    return table
