"""The drift experiment's tooling: ``tutorials/drift/compare.py`` on real reports and stores, and the configs
``tutorials/drift/run.py`` writes for each stage.

Each run is what ``spanlab train`` leaves: a ``report.json`` (a :class:`TrainReport` with per-step metrics and
the held-out evaluations, the learning curve's ``step-k`` ones included) and a DuckDB store with the held-out
rollouts. The runs evaluate no start of their own (``eval.base: false``, no warm start, as run.py's arms), so the
gains are paired with a start that lives in another store, as ``--start`` says.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from spanlab.config import load_yaml
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import build_algorithm
from spanlab.jobs.report import Evaluation, TrainReport
from spanlab.stats import paired_difference
from tests.jobs.run_stores import record
from tests.scripts import load_script
from tutorials.stages import deep_merge

DRIFT = Path(__file__).resolve().parents[2] / "tutorials" / "drift"
TASKS = [f"t{i}" for i in range(6)]
START = {"test": "111100", "test_l4": "000000"}


def _compare() -> ModuleType:
    return load_script(DRIFT / "compare.py", "drift_compare")


def _rewards(pattern: str) -> dict[str, float]:
    return {t: float(c) for t, c in zip(TASKS, pattern, strict=True)}


def _evaluation(phase: str, split: str, pattern: str) -> Evaluation:
    rewards = [float(c) for c in pattern]
    return Evaluation(phase=phase, split=split, n=len(rewards), accuracy=sum(rewards) / len(rewards), rewards=rewards)


def _run(out: Path, name: str, finals: dict[str, str], curve: str, drift: float) -> Path:
    """A finished 2-step run ``out/name`` (report.json) with its store ``out/name.duckdb``: test_l4 after step 1
    is ``curve``, the end ``finals``; its steps drift by ``drift`` nats."""
    db = out / f"{name}.duckdb"
    evaluations = [_evaluation("step-1", "test_l4", curve)]
    record(db, _rewards(curve), phase="step-1", split="test_l4")
    for split, pattern in finals.items():
        record(db, _rewards(pattern), phase="final", split=split)
        evaluations.append(_evaluation("final", split, pattern))
    steps = [{"reward_mean": 0.5 + 0.1 * k, "reward_std": 0.5, "n_samples": 16.0, "drift_sample_frac": drift and 1.0,
              "drift_token_frac": drift / 20, "drift_logp_abs_diff": drift + 1e-4, "clip_frac": 0.01 * k,
              "grad_norm": 1.0 - 0.1 * k} for k in range(2)]
    (out / name).mkdir()
    TrainReport(run_name=name, algorithm="grpo", model="start/final", db=str(db), evaluations=evaluations,
                steps=steps, seconds=600.0).write(out / name / "report.json")
    return out / name


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, list[Path]]:
    start = tmp_path / "start"
    start.mkdir()
    for split, pattern in START.items():
        record(tmp_path / "start.duckdb", _rewards(pattern), phase="warm_start", split=split)
    TrainReport(run_name="start", algorithm="grpo", model="m", db=str(tmp_path / "start.duckdb"),
                evaluations=[_evaluation("warm_start", s, p) for s, p in START.items()]).write(start / "report.json")
    return {"exact": [_run(tmp_path, "exact-1", {"test": "111100", "test_l4": "111000"}, "100000", 0.0),
                      _run(tmp_path, "exact-2", {"test": "111110", "test_l4": "110000"}, "110000", 0.0)],
            "retokenized": [_run(tmp_path, "retokenized-1", {"test": "110000", "test_l4": "100000"}, "000000", 0.4),
                            _run(tmp_path, "retokenized-2", {"test": "111100", "test_l4": "000000"}, "000000", 0.5)]}


def test_one_figure_and_the_paired_gains_of_every_run(runs: dict[str, list[Path]], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    compare = _compare()
    argv = ["--start", str(tmp_path / "start")]
    for arm, dirs in runs.items():
        argv += ["--arm", arm, *map(str, dirs)]
    compare.main([*argv, "--out", str(tmp_path / "drift.png")])
    assert (tmp_path / "drift.png").stat().st_size > 30_000
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines if line.startswith(("| exact", "| retokenized"))]
    assert [r[1] for r in rows] == ["exact-1", "exact-2", "retokenized-1", "retokenized-2"]
    finals = {"exact-1": "111000", "exact-2": "110000", "retokenized-1": "100000", "retokenized-2": "000000"}
    for row in rows:  # test_l4: the start solved none, so the gain is the final accuracy, paired by task
        d = paired_difference([float(c) for c in finals[row[1]]], [0.0] * len(TASKS))
        assert row[3] == (f"0.0% -> {100 * d.mean:.1f}%, {100 * d.mean:+.1f} [{100 * d.low:+.1f}, "
                          f"{100 * d.high:+.1f}] (n=6)")
    assert rows[0][2].startswith("66.7% -> 66.7%, +0.0 ") and rows[2][2].startswith("66.7% -> 33.3%, -33.3 ")
    assert [r[4] for r in rows] == ["0.000", "0.000", "1.000", "1.000"]  # drift samples, mean over steps
    assert [r[6] for r in rows] == ["0.0001", "0.0001", "0.4001", "0.5001"]  # |dlogp| in nats
    assert "step 2: 0.6000" in "\n".join(lines)
    # each arm's mean gain over its runs and the verdict against the first arm (spanlab compare's)
    assert any(line.startswith("test_l4: exact gained +41.7 [") for line in lines)
    assert any(line.startswith("Verdict on test_l4: retokenized vs exact: ") for line in lines)


def test_the_curve_starts_at_the_start_that_lives_in_another_store(runs: dict[str, list[Path]], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    compare = _compare()
    run = compare.load_run("exact", runs["exact"][1], compare.start_arm(tmp_path / "start", "warm_start"))
    assert compare.curve(run, "test_l4") == ([0, 1, 2], [0.0, pytest.approx(2 / 6), pytest.approx(2 / 6)])
    assert compare.curve(run, "test") == ([0, 2], [pytest.approx(4 / 6), pytest.approx(5 / 6)])
    with pytest.raises(ConfigError, match=r"evaluated no start of its own.*--start"):
        compare.load_run("exact", runs["exact"][0], None)
    with pytest.raises(ConfigError, match=r"no report\.json"):
        compare.load_run("exact", tmp_path, None)
    with pytest.raises(SystemExit):
        compare.parse_args(["--arm", "exact"])
    assert "give each arm at least one run folder" in capsys.readouterr().err


def test_the_stages_are_the_main_job_and_differ_only_in_what_the_trainer_reads(tmp_path: Path) -> None:
    """run.py's configs: the start is the main job's warm start with no step; every run is the main job's GRPO
    from the start's folder, on the start's train tasks, with no start evaluation of its own; the two arms differ
    only in token_source / retokenize_template (and where they write)."""
    run = load_script(DRIFT / "run.py", "drift_run")
    (tmp_path / "start" / "final").mkdir(parents=True)  # the start stage leaves it
    main_job = load_yaml(run.BASE)
    configs = {name: run.stage_config(name, main_job, tmp_path, 1366) for name in run.stage_names(2)}
    assert list(configs) == ["start", "exact-1", "exact-2", "retokenized-1", "retokenized-2"]
    assert configs["start"] == deep_merge(main_job, {"grpo": {"steps": 0}, "run_name": "start",
                                                     "out_dir": str(tmp_path), "db": str(tmp_path / "start.duckdb")})
    for name, data in configs.items():
        config = parse_train_config(data, name)
        build_algorithm(config)
        assert config.run_dir == tmp_path / name and config.db == tmp_path / f"{name}.duckdb"
    where = ("run_name", "db", "token_source", "retokenize_template")
    exact, retok = ({k: v for k, v in configs[n].items() if k not in where} for n in ("exact-1", "retokenized-1"))
    assert exact == retok
    assert exact == {**{k: v for k, v in main_job.items() if k not in (*where, "warm_start")},
                     "out_dir": str(tmp_path), "engine": {**main_job["engine"], "model": str(tmp_path / "start/final")},
                     "dataset": {**main_job["dataset"], "train_tasks": 1366},
                     "grpo": {**main_job["grpo"], "demonstrations": {"demos": 512, "levels": [1, 2, 3],
                                                                     **main_job["grpo"]["demonstrations"]}},
                     "eval": {**main_job["eval"], "base": False}}
    assert configs["retokenized-2"]["token_source"] == "retokenized" and configs["exact-2"]["token_source"] == "exact"
    assert (DRIFT.parents[1] / configs["retokenized-1"]["retokenize_template"]).is_file()
    start_from = tmp_path / "ws"
    evaluated = run.stage_config("start", main_job, tmp_path, 1366, start_from)
    assert "warm_start" not in evaluated and evaluated["eval"]["base"] is True
    assert evaluated["engine"]["model"] == str(start_from / "final")
    assert run.stage_config("exact-1", main_job, tmp_path, 1366, start_from)["engine"]["model"] == \
        str(start_from / "final")
