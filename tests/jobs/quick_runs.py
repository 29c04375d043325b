"""The tutorials' quick configs at the test sizes, and the calc warm start that several job tests share.

``tests/jobs/test_quick_configs.py`` runs every ``quick.yaml``; ``tests/jobs/test_messages_grpo.py`` runs calc's
with its model loop on the Messages API. Both start calc from one warm start, trained once per test session
(the ``calc_warm_start`` fixture in ``tests/jobs/conftest.py``, built by :func:`train_calc_warm_start`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spanlab.config import load_yaml
from spanlab.engine.weights import WeightSyncClient
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.jobs.report import TrainReport

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
# Per tutorial, the sections whose sizes the tests lower (merged key by key into the file's own): fewer GRPO
# samples per step, fewer held-out tasks (one per level), fewer SFT round tasks, rooms' answer turn capped at 32
# tokens (it ran to its 128 in most rollouts, and each APO batch waits for its slowest decode). The shared calc
# warm start keeps its 4 steps (drift's check, every step drifts, needs the tool calls it teaches; one step of 8
# demos was enough for calc alone). drift runs 8 samples per step: at the shipped 16, 14 and 15 of each step's
# samples drifted, at 8 all 8 did.
SMALLER: dict[str, dict[str, dict[str, Any]]] = {
    "calc": {"grpo": {"tasks_per_step": 2, "group_size": 2}, "eval": {"tasks": 3}},
    "drift": {"grpo": {"tasks_per_step": 2}, "eval": {"tasks": 3}},
    "rooms": {"eval": {"tasks": 2}, "agent": {"kwargs": {"answer_max_tokens": 32}}},
    "sql": {"sft": {"tasks_per_round": 2}},
}
# The tutorials whose runs start from the shared warm start (:func:`train_calc_warm_start`) instead of their own.
WARM_FROM_CALC = ("calc", "drift")


def merged(data: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``sizes`` merged in key by key, into nested mappings too (an agent's ``kwargs``)."""
    return data | {key: merged(data.get(key) or {}, value) if isinstance(value, dict) else value
                   for key, value in sizes.items()}


def smaller(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the test's sizes for tutorial ``name`` merged into its sections."""
    return merged(data, SMALLER.get(name, {}))


@dataclass(frozen=True)
class WarmStart:
    """The shared warm start's run: its report and its servable folder (``runs/calc-quick/final``)."""

    report: TrainReport
    folder: Path
    settings: dict[str, Any]  # the warm_start section it ran


def warm_start_section(name: str) -> dict[str, Any]:
    return load_yaml(TUTORIALS / name / "quick.yaml")["warm_start"]


def train_calc_warm_start(engine_url: str, base_model_dir: Path, out: Path) -> WarmStart:
    """calc's quick.yaml up to its warm start: no GRPO step, so the run is the warm start, its held-out
    evaluation and the final folder. The engine serves ``base_model_dir``'s weights again afterwards."""
    assert all(warm_start_section(n) == warm_start_section("calc") for n in WARM_FROM_CALC), \
        "the tutorials sharing the calc warm start must ask for the same one"
    data = smaller("calc", load_yaml(TUTORIALS / "calc" / "quick.yaml"))
    data = merged(data, {"grpo": {"steps": 0}}) | {"engine_url": engine_url, "out_dir": str(out / "runs"),
                                                   "db": str(out / "run.duckdb")}
    config = parse_train_config(data, "calc/quick.yaml up to its warm start")
    try:
        report = run_job(config)
    finally:
        with WeightSyncClient(engine_url) as client:
            client.reload_weights(base_model_dir)
    return WarmStart(report, config.run_dir / "final", data["warm_start"])


def from_warm_start(data: dict[str, Any], warm: WarmStart, engine_url: str) -> dict[str, Any]:
    """``data`` starting from the shared warm start's folder (served by the engine now) with no warm start of its
    own; the train tasks are the ones that run generated, as the compare tutorial's arms take their start's."""
    with WeightSyncClient(engine_url) as client:
        client.reload_weights(warm.folder)
    dataset = {**data["dataset"], "train_tasks": 2 * int(warm.settings["demos"])}
    return {key: value for key, value in data.items() if key != "warm_start"} | {
        "engine": {**data["engine"], "model": str(warm.folder)}, "dataset": dataset}


# The SQL agent's roles on two LoRA policies (the session server has two slots): the writer on its own, the checker
# and the rewriter on the default.
SQL_POLICIES = {"roles": {"writer": "lora-w"}, "default": "lora-r",
                "lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}}
