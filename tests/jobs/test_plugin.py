"""A third-party algorithm: ``tests/plugin_pkg`` installed as a package of its own, found by its entry point.

``pip install --no-deps --target`` puts it (and its dist-info, which ``importlib.metadata`` reads) in a
temporary folder; ``spanlab train`` runs in a subprocess with that folder on ``PYTHONPATH``. Nothing
inside ``spanlab/`` names the algorithm, and the shared environment is not modified.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spanlab.store import SpanStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the plugin is installed into (built from a copy, so the source tree stays clean)."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(REPO / "tests" / "plugin_pkg", tmp / "src")
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, capture_output=True, timeout=300)
    return target


def _train(plugin: Path | None, config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    paths = [str(plugin)] if plugin else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "spanlab.cli", "train", str(config), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _config(tmp_path: Path, **extra: Any) -> Path:
    data = {"algorithm": "best_of_n", "run_name": "bon", "out_dir": str(tmp_path / "runs"),
            "db": str(tmp_path / "bon.duckdb"), "agent": {"name": "calc", "kwargs": {"max_tokens": 32, "max_turns": 2}},
            "dataset": {"name": "calc", "seed": 4, "levels": [1]}, "eval": {"tasks": 2},
            "rollouts": {"concurrency": 4}, "best_of_n": {"n": 2, "tasks": 2}, **extra}
    path = tmp_path / "bon.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def test_the_entry_point_makes_the_algorithm_a_name_in_yaml(plugin_path: Path, tmp_path: Path) -> None:
    config = _config(tmp_path)
    checked = _train(plugin_path, config, "--check", "--steps", "3")
    assert checked.returncode == 0, checked.stderr
    assert "best_of_n:\n  n: 2\n  tasks: 2\n  rounds: 3\n" in checked.stdout
    bad = _train(plugin_path, _config(tmp_path, best_of_n={"n": 0}), "--check")
    assert bad.returncode == 2 and "best_of_n.n" in bad.stderr and "Traceback" not in bad.stderr
    missing = _train(None, config, "--check")
    assert missing.returncode == 2 and "unknown algorithm 'best_of_n'" in missing.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_the_plugin_runs_end_to_end_with_the_framework_evaluations(plugin_path: Path, tmp_path: Path,
                                                                   vllm_server: Any) -> None:
    config = _config(tmp_path, engine_url=vllm_server.root_url,
                     eval={"tasks": 2, "extra_splits": ["family", "depth"]})
    done = _train(plugin_path, config, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "bon" / "report.json").read_text())
    assert report["algorithm"] == "best_of_n"
    assert [(e["phase"], e["split"]) for e in report["evaluations"]] == [
        (phase, split) for phase in ("base", "final") for split in ("test", "family", "depth")]
    assert all(e["n"] == 2 for e in report["evaluations"])
    assert [e["by_level"].keys() for e in report["evaluations"]][2] == {"2"}, "depth: one level above levels [1]"
    with SpanStore(tmp_path / "bon.duckdb") as store:
        metrics = {m.name for m in store.metrics(report["run_id"])}
    assert {"eval_accuracy_base", "eval_accuracy_final_family", "eval_accuracy_base_depth"} <= metrics
    (step,) = report["steps"]
    assert 0.0 <= step["reward_mean"] <= step["best_of_n"] <= 1.0
