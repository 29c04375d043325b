"""The reasoning-gym quick configs (``tutorials/reasoning_gym/quick_*.yaml``): GRPO, SFT rounds and APO each run
their whole loop on reasoning-gym tasks, with the answer agent, the session's real vLLM and the families' real
scorers.

The files run as they ship (they are already at test sizes), on the shared engine (``engine_url``, weights restored
after) with their outputs in the test's folder. What the runs measure is noise; what is checked is that every
phase ran, and that every rollout's final reward span names its family and settings (the reward is the family's
``score_answer``, :mod:`spanlab.tasksets.reasoning_gym.scoring`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlab.config import load_yaml
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.store import SpanStore
from tests.jobs.quick_runs import TUTORIALS

QUICK = sorted((TUTORIALS / "reasoning_gym").glob("quick_*.yaml"))
# Runs longer than about two minutes on 2 busy cores, left to `pytest -m slow`: APO's critique and edit calls,
# each candidate's POML check and its val rollouts; GRPO's policy load, update and weight push beside three held-out
# evaluations. SFT's round stays in the default suite.
SLOW = {"quick_apo", "quick_grpo"}


def test_there_is_a_quick_config_per_algorithm() -> None:
    configs = [parse_train_config(load_yaml(p), str(p)) for p in QUICK]
    assert sorted(c.algorithm for c in configs) == ["apo", "grpo", "sft"]
    assert all(c.dataset.name == "reasoning_gym" and c.agent.name == "answer" for c in configs)


@pytest.mark.vllm
@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.slow] if p.stem in SLOW else [])
                                  for p in QUICK], ids=lambda p: p.stem)
def test_a_reasoning_gym_quick_config_runs_the_whole_loop(path: Path, tmp_path: Path, restored_engine: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(TUTORIALS.parent)
    data = load_yaml(path) | {"engine_url": restored_engine, "out_dir": str(tmp_path / "runs"),
                              "db": str(tmp_path / "run.duckdb")}
    config = parse_train_config(data, str(path))
    report = run_job(config)
    phases = [e.phase for e in report.evaluations if e.split == config.eval.split]
    assert phases == [*(["base"] if config.eval.base else []), *(["warm_start"] if config.warm_start else []),
                      "final"], phases
    assert all(e.n == config.eval.tasks and e.failed < e.n for e in report.evaluations)
    assert {e.split for e in report.evaluations} == {s.name for s in config.eval.split_specs}
    assert report.steps and (config.run_dir / "report.json").is_file()
    with SpanStore(config.db) as store:
        rows = store.query("SELECT attributes FROM spans WHERE kind = 'reward'").to_pylist()
    families = {*config.dataset.kwargs["tasks"], *config.dataset.kwargs.get("held_out", ())}
    rewards = [json.loads(r["attributes"]) for r in rows]
    assert rewards and all(r["final"] is True and r["family"] in families and r["level"] == 1
                           and isinstance(r["settings"], dict) for r in rewards), rewards[:3]
