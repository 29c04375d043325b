"""The whole APO loop with real rollouts: vLLM (SmolLM2) -> gateway -> store, poml renders, a scripted optimizer.

The optimizer is ``ScriptedOptimizerServer`` (real HTTP, OpenAI protocol) replaying
``tutorials/rooms/scripted.json``: one critique; edits = a JavaScript expression (must be rejected), a
valid policy prompt, a template without ``{{ request }}`` (must be rejected). Sizes are tiny (3 val, 2
test, 2 gradient tasks; about 12 rollouts) so one run takes under a minute on the shared CPU server. The
rollouts' time is decode time: a tool call is 65-100 tokens (``max_tokens`` stays 128), the answer turn ran
to its cap in most rollouts, so answers are capped at 32 tokens (what is checked here is the loop, not the
rewards).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from spanlab.jobs.config import TrainConfig, parse_train_config
from spanlab.jobs.job import run_job as train
from spanlab.jobs.report import TrainReport
from spanlab.store import SpanStore
from tests.apo.optimizer_server import ScriptedOptimizerServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = json.loads((Path(__file__).resolve().parents[2] / "tutorials/rooms/scripted.json").read_text())


@contextmanager
def scripted_optimizer() -> Iterator[ScriptedOptimizerServer]:
    """A fresh server per run: its scripted answers start from the first again."""
    with ScriptedOptimizerServer(critiques=SCRIPT["critiques"], edits=SCRIPT["edits"]) as server:
        yield server


def _run(tmp_path: Path, db: Path, engine_url: str, name: str) -> tuple[TrainReport, dict[str, Any],
                                                                          ScriptedOptimizerServer]:
    with scripted_optimizer() as optimizer:
        config = _config(tmp_path, db, engine_url, optimizer.base_url, name)
        report = train(config)
    return report, json.loads((config.run_dir / "apo.json").read_text()), optimizer


def _config(tmp_path: Path, db: Path, engine_url: str, optimizer_url: str, name: str) -> TrainConfig:
    return parse_train_config({
        "algorithm": "apo", "run_name": name, "out_dir": str(tmp_path / "runs"), "db": str(db),
        "engine_url": engine_url,
        "agent": {"name": "rooms", "kwargs": {"max_tokens": 128, "answer_max_tokens": 32, "max_turns": 2}},
        "dataset": {"name": "rooms", "seed": 0, "levels": [1, 2]},
        "rollouts": {"concurrency": 8}, "eval": {"tasks": 2, "temperature": 0.0},
        "apo": {"beam_width": 1, "branch_factor": 3, "rounds": 1, "gradient_tasks": 2, "critique_examples": 1,
                "val_tasks": 3,
                "optimizer": {"base_url": optimizer_url, "critique_model": "critic", "edit_model": "editor"}},
    })


def _outcome(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What must not change between runs with the same seed: candidates, their versions and scores."""
    return [(c["id"], c["status"], c["version"], c["parent"], c["val"] and c["val"]["mean"])
            for c in data["candidates"]] + [(data["summary"]["test_base"], data["summary"]["test_final"])]


def test_apo_loop_end_to_end_then_cached_then_deterministic(tmp_path: Path, vllm_server: Any) -> None:
    db = tmp_path / "apo.duckdb"
    report, data, optimizer = _run(tmp_path, db, vllm_server.root_url, "first")

    # Candidate validation: the JavaScript expression and the missing variable never reached a rollout.
    statuses = [(c["id"], c["status"], c["version"]) for c in data["candidates"]]
    assert statuses == [("c0", "root", 1), ("c1", "rejected", None), ("c2", "scored", 2), ("c3", "rejected", None)]
    assert "JavaScript" in data["candidates"][1]["problems"][0]
    assert "{{request}} is missing" in data["candidates"][3]["problems"][0]
    assert data["candidates"][2]["parent"] == "c0" and data["candidates"][2]["critique"] == SCRIPT["critiques"][0]
    assert [e.phase for e in report.evaluations] == ["base", "final"] and all(e.n == 2 for e in report.evaluations)
    summary = data["summary"]
    assert summary["rollouts_total"] == summary["rollouts_search"] + (4 if summary["best_version"] == 2 else 2)

    # The optimizer saw real rollouts: the critique request holds the parent template and a train task's transcript.
    (critique_req,) = optimizer.requests_for("critic")
    critique_text = critique_req["messages"][1]["content"]
    assert "{{ request }}" in critique_text and "Task: " in critique_text and "user: " in critique_text
    edit_reqs = optimizer.requests_for("editor")
    assert len(edit_reqs) == 3 and all(SCRIPT["critiques"][0] in r["messages"][1]["content"] for r in edit_reqs)

    with SpanStore(db) as store:
        versions = store.list_resources("prompt")
        assert [r.version for r in versions[:2]] == [1, 2]  # rejected texts are never stored
        # The winner ends as the latest version, the one every unpinned rollout after APO runs with: a third
        # version (its text again) only when the winner is not the last candidate scored.
        winner = next(c for c in data["candidates"] if c["version"] == summary["best_version"])
        assert versions[-1].payload["template"] == winner["template"]
        assert len(versions) == 2 + (summary["best_version"] != 2)
        rows = store.query("SELECT resources_version AS v, input->>'$.task_id' AS t, mode, rollout_id "
                           "FROM rollouts ORDER BY enqueue_time").to_pylist()
        assert len(rows) == summary["rollouts_total"]
        # The start prompt's held-out, validation and first critique rollouts went out as one batch.
        queued = store.query("SELECT metadata->>'$.purpose' AS p, enqueue_time AS t FROM rollouts "
                             "ORDER BY enqueue_time").to_pylist()
        first = sorted(r["p"] for r in queued if r["t"] - queued[0]["t"] < 1.0)
        assert first == ["gradient"] * 2 + ["test"] * 2 + ["validation"] * 3, queued
        assert {r["v"] for r in rows} == {"prompt@1", "prompt@2"}
        assert len({(r["v"], r["t"]) for r in rows}) == len(rows)  # no (version, task) pair ran twice
        # Each rollout's agent really used its version: the first call's system prompt is that template's.
        systems = store.query(
            "SELECT r.resources_version AS v, json_extract_string(s.request_messages, '$[0].content') AS sys "
            "FROM spans s JOIN rollouts r USING (rollout_id) WHERE s.kind = 'llm_call'").to_pylist()
        assert systems and all(("smallest capacity" in s["sys"]) == (s["v"] == "prompt@2") for s in systems)

    # Same config, same store: every (version, task) pair is a cache hit, nothing runs, the outcome is the same.
    _, second, _ = _run(tmp_path, db, vllm_server.root_url, "second")
    assert second["summary"]["rollouts_total"] == 0
    assert second["summary"]["cache_hits"] == summary["cache_hits"] + summary["rollouts_total"]
    assert _outcome(second) == _outcome(data)

    # A fresh store with the same seeds: the same candidates, versions and scores (greedy decoding).
    _, fresh, _ = _run(tmp_path, tmp_path / "fresh.duckdb", vllm_server.root_url, "fresh")
    assert _outcome(fresh) == _outcome(data)
