"""APO through GEPA with real rollouts: vLLM (SmolLM2) -> gateway -> store, GEPA's search, a scripted reflection LM,
then demonstrations mined from the recorded rollouts.

The reflection model is ``ScriptedOptimizerServer`` (real HTTP, OpenAI protocol) replaying the edit model's
answers of ``tutorials/rooms/scripted.json``: a JavaScript expression (must be rejected before any rollout),
a valid policy prompt, a template without ``{{ request }}`` (rejected). GEPA decides what to evaluate and
what to accept; everything it sees is a rollout recorded in the store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import check_job
from spanlab.jobs.job import run_job as train
from spanlab.store import SpanStore
from tests.apo.optimizer_server import ScriptedOptimizerServer

SCRIPT = json.loads((Path(__file__).resolve().parents[2] / "tutorials/rooms/scripted.json").read_text())


def _config(tmp_path: Path, engine_url: str, optimizer_url: str) -> Any:
    return parse_train_config({
        "algorithm": "apo", "run_name": "gepa", "out_dir": str(tmp_path / "runs"), "db": str(tmp_path / "gepa.duckdb"),
        "engine_url": engine_url,
        "agent": {"name": "rooms", "kwargs": {"max_tokens": 128, "answer_max_tokens": 64, "max_turns": 2}},
        "dataset": {"name": "rooms", "seed": 0, "levels": [1, 2]},
        "rollouts": {"concurrency": 8}, "eval": {"tasks": 2, "temperature": 0.0},
        "apo": {"search": "gepa", "rounds": 1, "branch_factor": 3, "gradient_tasks": 2, "critique_examples": 1,
                "val_tasks": 3, "optimizer": {"base_url": optimizer_url, "edit_model": "editor"},
                "demos": {"k": 1, "candidates": 2, "min_reward": 0.01, "pool_tasks": 2}},
    })


def test_gepa_is_a_checked_choice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"apo\.search"):
        parse_train_config({"algorithm": "apo", "apo": {"search": "evolution"}})
    config = _config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9/v1")
    algorithm, _, _ = check_job(config)
    assert algorithm.settings.search == "gepa"


@pytest.mark.vllm
@pytest.mark.slow
def test_gepa_search_end_to_end_on_recorded_rollouts(tmp_path: Path, vllm_server: Any) -> None:
    with ScriptedOptimizerServer(critiques=SCRIPT["critiques"], edits=SCRIPT["edits"]) as optimizer:
        config = _config(tmp_path, vllm_server.root_url, optimizer.base_url)
        report = train(config)
        reflections = optimizer.requests_for("editor")
    data = json.loads((config.run_dir / "apo.json").read_text())

    # Three proposals; the JavaScript expression and the missing variable never reached a rollout.
    statuses = [(c["id"], c["status"], c["version"]) for c in data["candidates"]]
    search, demos = data["candidates"][:4], data["candidates"][4:]
    assert statuses[0] == ("c0", "root", 1) and len(search) == 4
    assert statuses[1] == ("c1", "rejected", None) and "JavaScript" in data["candidates"][1]["problems"][0]
    assert statuses[2][1] in ("scored", "not_accepted") and statuses[2][2] == 2
    assert statuses[3] == ("c3", "rejected", None) and "{{request}} is missing" in data["candidates"][3]["problems"][0]
    assert [e.phase for e in report.evaluations] == ["base", "final"] and all(e.n == 2 for e in report.evaluations)

    # GEPA's reflection prompt carried the template, our rules, and recorded conversations with their rewards.
    assert len(reflections) == 3
    text = reflections[0]["messages"][0]["content"]
    assert "{{ request }}" in text and "Keep these variables exactly once each" in text
    assert "Generated Outputs" in text and "user: " in text and "reward " in text

    # Demonstrations: variants of the search's winner with one recorded train rollout each, scored on val.
    assert demos and all(c["status"] in ("scored", "duplicate") for c in demos), demos
    assert {c["parent"] for c in demos} <= {c["id"] for c in search if c["status"] in ("root", "scored")}
    assert all("Example 1" in c["template"] and c["critique"].startswith("demos: ") for c in demos)
    assert all(c["val"] is not None for c in demos if c["status"] == "scored")

    with SpanStore(tmp_path / "gepa.duckdb") as store:
        resources = store.list_resources("prompt")
        versions = [r.version for r in resources]
        scored = 2 + sum(c["status"] == "scored" for c in demos)
        # The winner ends as the latest version (its text stored again unless it was the last one scored).
        winner = next(c for c in data["candidates"] if c["version"] == data["summary"]["best_version"])
        assert resources[-1].payload["template"] == winner["template"]
        assert versions[:2] == [1, 2] and len(versions) == scored + (winner["version"] != scored)
        rows = store.query("SELECT resources_version AS v, input->>'$.task_id' AS t, rollout_id, final_reward AS r, "
                           "mode FROM rollout_summary").to_pylist()
        # A demo variant's example is a train task whose recorded rollout earned at least min_reward.
        demo_task = json.loads(demos[0]["critique"].removeprefix("demos: "))[0]
        assert any(r["t"] == demo_task and r["mode"] == "train" and (r["r"] or 0) >= 0.01 for r in rows)
    assert len({(r["v"], r["t"]) for r in rows}) == len(rows)  # no (version, task) pair ran twice
    assert data["summary"]["rollouts_total"] == len(rows)
