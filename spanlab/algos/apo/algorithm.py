"""APO: automatic prompt optimization of an agent's POML prompt, by beam search with textual gradients.

Run: ``spanlab train tutorials/rooms/apo.yaml`` (config section ``apo:``, see ``apo_config.py``).

The job: start (or reuse) vLLM, open the store and the recording gateway, store the starting prompt
as version 1 of the ``prompt`` resource, run the beam search (``apo_search.py``: critiques from real
rollouts' spans, edits by an optimizer LLM, validation, scoring on val), then score the starting
prompt and the winner on held-out test tasks. Every rollout pins the prompt version it ran with
(``rollouts.resources_version``), and no (version, task) pair runs twice (``apo_rollouts.py``).
Reported: test mean reward before/after with n and bootstrap intervals, the paired difference, the
lineage of every candidate (``run_dir/apo.json``), and the budget (rollouts run, cache hits, optimizer
calls and tokens, seconds). Left out vs Agent Lightning's APO: async/parallel optimizer calls, a
separate "apply gradient" prompt per example, and LLM-judge rewards (the task's grader is exact).
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from rich.console import Console
from rich.table import Table

from spanlab.algos.apo.optimizer import Optimizer
from spanlab.algos.apo.rollouts import PromptBank, RolloutRunner
from spanlab.algos.apo.search import BeamSearch, Candidate
from spanlab.algos.apo.stats import bootstrap, paired_difference
from spanlab.errors import ConfigError
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.report import Evaluation, TrainReport
from spanlab.jobs.rig import open_rig
from spanlab.jobs.tasks import TASK_SETS, load_task_set

logger = logging.getLogger(__name__)


def train_apo(config: TrainConfig, *, console: Console | None = None) -> TrainReport:
    """Run the whole APO job described by ``config``; returns (and writes) its report."""
    console = console or Console(stderr=True)
    started = time.monotonic()
    apo = config.apo
    start_template, required = _start(config)
    task_set = load_task_set(config.dataset.name)
    splits = {name: task_set.make_tasks(name, n=n, seed=config.dataset.seed, levels=config.dataset.levels)
              for name, n in (("train", max(apo.gradient_tasks * 4, apo.gradient_tasks)), ("val", apo.val_tasks),
                              ("test", apo.test_tasks))}
    report = TrainReport(run_name=config.run_name, algorithm="apo", model=config.engine.model, db=str(config.db))

    with ExitStack() as stack:
        rig = open_rig(stack, config, console)
        store, gateway, collector, root_url, served = rig.store, rig.gateway, rig.collector, rig.root_url, rig.served
        bank = PromptBank(store, apo.resource)
        runner = RolloutRunner(collector, bank, overrides={"model": served, "temperature": config.eval.temperature},
                               max_rollouts=apo.max_rollouts)
        optimizer = Optimizer(apo.optimizer, default_base_url=f"{root_url}/v1", default_model=served)
        stack.callback(optimizer.close)
        search = BeamSearch(apo, runner, optimizer, bank, required=required, train=splits["train"],
                            val=splits["val"], run_id=report.run_id)
        console.log(f"APO: beam {apo.beam_width} x branch {apo.branch_factor}, {apo.rounds} rounds, "
                    f"{len(splits['val'])} val / {len(splits['test'])} test tasks; optimizer "
                    f"{optimizer.critique_model} / {optimizer.edit_model} at {optimizer.client.base_url}")
        best = search.run(start_template)
        root = search.lineage[0]
        search_rollouts, search_s = runner.ran, runner.seconds
        test = _test(runner, [root, best] if best.version != root.version else [root], splits["test"], report.run_id)
        gateway.flush()
        before, after = test[root.version], test[best.version]
        for phase, rewards in (("base", before), ("final", after)):
            report.evaluations.append(_evaluation(phase, splits["test"], rewards, runner.seconds - search_s))
        summary = _summary(config, search, runner, optimizer, root, best, before, after, search_rollouts, search_s)
        report.steps = [*search.rounds, summary]
        for step, metrics in enumerate(report.steps):
            store.add_metrics(report.run_id, "apo", step, metrics)
    report.seconds = time.monotonic() - started
    _write_lineage(config, report, search, summary)
    report.write(config.run_dir / "report.json")
    console.print(lineage_table(search.lineage, best))
    console.print(f"test mean reward {summary['test_base']:.3f} -> {summary['test_final']:.3f} "
                  f"(paired diff {summary['test_diff']:+.3f} [{summary['test_diff_low']:+.3f}, "
                  f"{summary['test_diff_high']:+.3f}], n={len(splits['test'])}); winner {best.id} = "
                  f"{apo.resource}@{best.version}")
    return report


def _start(config: TrainConfig) -> tuple[str, list[str]]:
    """The starting template and the variables every candidate must keep (config, else the task set's)."""
    apo = config.apo
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


def _test(runner: RolloutRunner, cands: Sequence[Candidate], tasks: list[dict[str, Any]],
          run_id: str) -> dict[int | None, list[float]]:
    """Test rewards per version, all candidates in one batch (the search budget does not apply)."""
    runner.max_rollouts = None
    pairs = [(int(c.version or 0), t) for c in cands for t in tasks]
    results = runner.score(pairs, mode="test", metadata={"run_id": run_id, "algorithm": "apo", "purpose": "test"})
    n = len(tasks)
    return {c.version: [r for _, r in results[i * n:(i + 1) * n]] for i, c in enumerate(cands)}


def _evaluation(phase: str, tasks: list[dict[str, Any]], rewards: list[float], seconds: float) -> Evaluation:
    """Test mean reward by level; ``seconds`` is the test batch's (both phases run in one batch)."""
    by_level: dict[str, list[float]] = {}
    for task, reward in zip(tasks, rewards, strict=True):
        by_level.setdefault(str(task.get("level", "all")), []).append(reward)
    return Evaluation(phase=phase, n=len(tasks), accuracy=sum(rewards) / max(len(rewards), 1),
                      by_level={k: sum(v) / len(v) for k, v in sorted(by_level.items())}, seconds=seconds)


def _summary(config: TrainConfig, search: BeamSearch, runner: RolloutRunner, optimizer: Optimizer,
             root: Candidate, best: Candidate, before: list[float], after: list[float], search_rollouts: int,
             search_s: float) -> dict[str, float]:
    level, seed = config.apo.confidence, config.apo.seed
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
        "rollout_s": runner.seconds, "search_rollout_s": search_s,
        "optimizer_calls": float(u.calls), "optimizer_prompt_tokens": float(u.prompt_tokens),
        "optimizer_completion_tokens": float(u.completion_tokens), "optimizer_s": u.seconds,
    }


def _write_lineage(config: TrainConfig, report: TrainReport, search: BeamSearch, summary: dict[str, float]) -> None:
    data = {"run_id": report.run_id, "summary": summary, "rounds": search.rounds,
            "candidates": [c.summary() for c in search.lineage]}
    (config.run_dir / "apo.json").write_text(json.dumps(data, indent=2) + "\n")


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
