"""``spanlab compare`` on synthetic runs written into real DuckDB stores through the store API.

Three seeded arms from one start, 60 questions on each of two splits: ``main`` (the reference: the start with a
few questions flipped each way), ``boost`` (main plus 18 questions solved in every seed: +30 points, planted) and
``same`` (main with a few more flips: no difference). The command must find the planted difference, say "cannot
tell" to the null one, pair runs by seed whatever order they are given in, and refuse bad input in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.compare import compare, load_evaluation, resolve_run
from spanlab.compare.bootstrap import seeds_and_questions
from spanlab.compare.runs import RunPaths
from spanlab.errors import ConfigError
from spanlab.jobs.report import TrainReport
from spanlab.stats import bootstrap, paired_difference
from tests.jobs.run_stores import record

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [f"q{i:02d}" for i in range(40)]
SPLIT = "test_l4"
SEEDS = (0, 1, 2)
PLANTED = 12  # questions boost solves on top of main's, in every seed: +30 points


def _flip(rewards: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(rewards.size) < share, 1.0 - rewards, rewards)


def _write(db: Path, rewards: np.ndarray, phase: str, seed: int | None, extra_ops: float | None = None,
           split: str = SPLIT) -> Path:
    questions = QUESTIONS[: rewards.size]
    ops = None if extra_ops is None else {q: float(i < extra_ops * len(questions)) for i, q in enumerate(questions)}
    record(db, dict(zip(questions, rewards.tolist(), strict=True)), phase=phase, split=split, seed=seed,
           extra_ops=ops)
    return db


def _folder(db: Path, seed: int | None) -> Path:
    """The run folder beside ``db`` with the report ``spanlab train`` writes (its seed included)."""
    folder = db.with_name(db.name.removesuffix(".duckdb"))
    folder.mkdir()
    TrainReport(run_name=folder.name, algorithm="grpo", model="start/final", db=str(db), seed=seed).write(
        folder / "report.json")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """The start and three arms of three seeds; ``main`` as run folders, ``boost`` as stores given out of seed
    order, ``same`` as names whose store is beside them (no folder)."""
    out = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(63)
    start = (rng.random(len(QUESTIONS)) < 0.3).astype(float)
    _write(out / "start.duckdb", start, "warm_start", None, extra_ops=0.05)
    got: dict[str, list[Path]] = {"start": [out / "start.duckdb"], "main": [], "boost": [], "same": []}
    for seed in SEEDS:
        main = _flip(start, 0.1, rng)
        boost = main.copy()
        boost[np.flatnonzero(main == 0)[:PLANTED]] = 1.0
        same = _flip(main, 0.05, rng)
        got["main"].append(_folder(_write(out / f"main-s{seed}.duckdb", main, "final", seed, 0.1), seed))
        got["boost"].append(_write(out / f"boost-s{seed}.duckdb", boost, "final", seed, 0.2))
        got["same"].append(out / f"same-s{seed}")
        _write(out / f"same-s{seed}.duckdb", same, "final", seed)
    got["boost"] = [got["boost"][i] for i in (2, 0, 1)]
    return got


def _argv(runs: dict[str, list[Path]], *arms: str) -> list[str]:
    argv = ["--start", str(runs["start"][0])]
    for arm in arms:
        argv += ["--arm", arm, *map(str, runs[arm])]
    return argv


def _spanlab(*args: str) -> subprocess.CompletedProcess:
    """The CLI's app in this process (its entry point, as the console command runs it): exit code, stdout and
    stderr apart."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})  # one error line, not wrapped at 80
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_the_planted_difference_is_found_and_the_null_one_cannot_be_told(runs: dict[str, list[Path]]) -> None:
    start = load_evaluation(runs["start"][0], "warm_start")
    assert list(start.rewards) == [SPLIT] and start.seed is None
    arms = {arm: [load_evaluation(p, "final", [SPLIT]) for p in runs[arm]] for arm in ("main", "boost", "same")}
    assert [r.seed for r in arms["main"]] == [0, 1, 2]  # from the reports
    assert [r.seed for r in arms["boost"]] == [2, 0, 1]  # from the stores' sampling seeds
    (split,) = compare(start, arms).splits
    assert split.questions == len(QUESTIONS)
    main, boost, same = split.arms
    assert [r.seed for r in boost.runs] == [2, 0, 1] and boost.gain.seeds == 3
    assert boost.gain.verdict == "better" and boost.gain.mean > 0.25
    by_arm = {d.arm: d for d in split.versus}
    planted = by_arm["boost"]
    assert planted.reference == "main" and planted.paired_seeds == [0, 1, 2]
    assert planted.difference.mean == pytest.approx(PLANTED / len(QUESTIONS))
    assert planted.difference.verdict == "better" and planted.difference.low >= 0.15
    assert by_arm["same"].difference.verdict == "cannot tell"
    assert by_arm["same"].difference.low < 0 < by_arm["same"].difference.high
    # the extra-operation share: start 5%, main 10%, boost 20%, same never recorded it
    assert (split.start_extra_ops, main.extra_ops, boost.extra_ops, same.extra_ops) == \
        (pytest.approx(0.05), pytest.approx(0.1), pytest.approx(0.2), None)
    # each seed's gain is the question-level paired one
    finals = arms["main"][0].rewards[SPLIT]
    want = paired_difference([finals[q] for q in QUESTIONS], [start.rewards[SPLIT][q] for q in QUESTIONS])
    assert (main.runs[0].gain.mean, main.runs[0].gain.low, main.runs[0].gain.high) == (want.mean, want.low, want.high)


def test_disagreeing_seeds_widen_the_interval(runs: dict[str, list[Path]]) -> None:
    """One arm whose seeds disagree (+30 points in one, about nothing in the others): its interval over seeds and
    questions is wider than the question-level interval of the same gains taken as one run's."""
    start = load_evaluation(runs["start"][0], "warm_start")
    paths = [runs["boost"][1], runs["main"][1], runs["same"][2]]  # seeds 0, 1, 2
    arm = compare(start, {"mixed": [load_evaluation(p, "final") for p in paths]}).splits[0].arms[0]
    gains = [r.gain.mean for r in arm.runs]
    assert max(gains) - min(gains) > 0.25 and arm.gain.mean == pytest.approx(sum(gains) / 3)
    finals = [load_evaluation(p, "final").rewards[SPLIT] for p in paths]
    pooled = paired_difference([sum(f[q] for f in finals) / 3 for q in QUESTIONS],
                               [start.rewards[SPLIT][q] for q in QUESTIONS])
    assert arm.gain.high - arm.gain.low > 1.5 * (pooled.high - pooled.low)
    agreeing = compare(start, {"main": [load_evaluation(p, "final") for p in runs["main"]]}).splits[0].arms[0]
    assert arm.gain.high - arm.gain.low > agreeing.gain.high - agreeing.gain.low


def test_the_two_level_bootstrap_counts_seeds_and_shares_the_question_draw() -> None:
    rng = np.random.default_rng(0)
    one_Q = (rng.random(90) < 0.4).astype(float) - (rng.random(90) < 0.1)
    single = seeds_and_questions(one_Q[None, :])
    assert single == bootstrap(one_Q.tolist())  # one seed: the question-level interval, to the bit
    copies = seeds_and_questions(np.stack([one_Q] * 3))
    # three seeds that agree on every question tell no more about other questions than one does
    assert (copies.low, copies.high) == (pytest.approx(single.low), pytest.approx(single.high))
    apart = seeds_and_questions(np.stack([one_Q, one_Q - 0.3, one_Q + 0.3]))
    assert apart.high - apart.low > 1.5 * (single.high - single.low)
    unpaired = seeds_and_questions(np.stack([one_Q] * 2), np.stack([one_Q] * 2))
    assert (unpaired.mean, unpaired.low, unpaired.high) == (0.0, 0.0, 0.0)  # shared questions: paired by question
    with pytest.raises(ValueError, match="same questions"):
        seeds_and_questions(np.stack([one_Q]), np.stack([one_Q[:10]]))


def test_the_command_writes_markdown_and_json_end_to_end(runs: dict[str, list[Path]], tmp_path: Path) -> None:
    out, data = tmp_path / "compare.md", tmp_path / "compare.json"
    argv = [*_argv(runs, "main", "boost", "same"), "--out", str(out), "--json", str(data)]
    proc = subprocess.run([sys.executable, "-m", "spanlab", "compare", *argv], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == out.read_text()
    lines = proc.stdout.splitlines()
    assert "- arm **main**: 3 seeds (0, 1, 2); interval over runs and questions (main-s0, main-s1, main-s2)" in lines
    assert f"## {SPLIT}: 40 questions" in lines
    verdict = next(line for line in lines if line.startswith(f"Verdict on {SPLIT}: "))
    assert "boost vs main: better (+30.0 [" in verdict and "same vs main: cannot tell (" in verdict
    assert "3 seeds x 40 questions" in verdict
    assert any(line.startswith("| start | start | | ") and line.endswith("| 5.0% |") for line in lines)
    assert any(line.startswith("| boost | **mean of 3 seeds** |") and line.endswith("| **better** | 20.0% |")
               for line in lines)
    assert any(line.startswith("| same | same-s0 | 0 |") and line.endswith("| - |") for line in lines)
    assert any(line.startswith("| boost | main | seed (0, 1, 2) and question | +30.0 [") for line in lines)
    parsed = json.loads(data.read_text())
    assert [s["split"] for s in parsed["splits"]] == [SPLIT] and parsed["reference"] == "main"
    assert parsed["splits"][0]["versus"][0]["difference"]["verdict"] == "better"


def run_command(argv: list[str]) -> str:
    proc = _spanlab("compare", *argv)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_splits_one_seed_and_unseeded_runs_say_so(runs: dict[str, list[Path]], tmp_path: Path) -> None:
    text = run_command(["--start", str(runs["start"][0]), "--arm", "main", str(runs["main"][0]),
                        "--arm", "boost", str(runs["boost"][1])])
    assert "- arm **main**: 1 seed (0); interval over questions only (main-s0)" in text
    assert "boost vs main: better (+30.0 [" in text and "(1 seed x 40 questions" not in text
    assert "1 seed x 40 questions" in text
    # a store copied without its folder and recorded unseeded, on two splits: a replicate, not paired by seed
    start, copy = tmp_path / "start.duckdb", tmp_path / "copy.duckdb"
    for split in ("test", "family"):
        _write(start, np.zeros(6), "base", None, split=split)
        _write(copy, np.ones(6), "final", None, split=split)
    text = run_command(["--start", str(start), "--start-phase", "base", "--arm", "copy", str(copy)])
    assert "- arm **copy**: 1 run without a seed; interval over questions only (copy)" in text
    assert [line for line in text.splitlines() if line.startswith("## ")] == ["## test: 6 questions",
                                                                              "## family: 6 questions"]
    assert "Verdict on family: copy vs start: better (+100.0 [+100.0, +100.0], 1 seed x 6 questions)." in text
    text = run_command(["--start", str(start), "--start-phase", "base", "--splits", "family",
                        "--arm", "copy", str(copy), "--arm", "again", str(copy), "--reference", "again"])
    assert "## test:" not in text
    assert "| copy | again | question (no shared seeds: each arm's runs drawn on their own) | +0.0 [+0.0, +0.0] " \
        "| cannot tell |" in text


@pytest.mark.parametrize("case", ["missing run", "other questions", "seed twice", "no such reference",
                                  "folder without store", "arm without runs", "arm twice", "stray run"])
def test_bad_input_is_a_one_line_error(runs: dict[str, list[Path]], tmp_path: Path, case: str) -> None:
    other = tmp_path / "other.duckdb"
    if case == "other questions":
        record(other, {f"u{i}": 1.0 for i in range(40)}, phase="final", split=SPLIT)
    (tmp_path / "empty").mkdir()
    argv, message = {
        "missing run": ([*_argv(runs, "main"), "--arm", "x", str(tmp_path / "nope")],
                        "nope: no such run folder or store (nope.duckdb)"),
        "other questions": ([*_argv(runs, "main"), "--arm", "other", str(other)],
                            f"{SPLIT} questions differ from the other runs'"),
        "seed twice": (["--start", str(runs["start"][0]), "--arm", "main", str(runs["main"][0]), str(runs["boost"][1])],
                       "more than one run with seed 0"),
        "no such reference": ([*_argv(runs, "main"), "--reference", "lora"], "--reference 'lora': no arm"),
        "folder without store": ([*_argv(runs, "main"), "--arm", "x", str(tmp_path / "empty")],
                                 "empty: a folder without its store"),
        "arm without runs": ([*_argv(runs, "main"), "--arm", "x"], "give each arm a name and at least one run"),
        "arm twice": ([*_argv(runs, "main"), "--arm", "main", str(runs["boost"][0])], "--arm main: an arm of that "
                      "name was given already"),
        "stray run": ([*_argv(runs, "main"), "--start-phase", "base", str(runs["boost"][0])],
                      "unexpected arguments"),
    }[case]
    proc = _spanlab("compare", *argv)
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and errors == [errors[0]] and message in errors[0], proc.stderr


def test_a_run_is_its_folder_or_its_store(runs: dict[str, list[Path]]) -> None:
    folder = runs["main"][0]
    db = folder.with_name(folder.name + ".duckdb")
    assert resolve_run(folder) == resolve_run(db) == RunPaths(db, folder)
    assert resolve_run(runs["same"][0]) == RunPaths(runs["same"][0].with_name("same-s0.duckdb"), None)
    with pytest.raises(ConfigError, match="no such store"):
        resolve_run(folder.with_name("gone.duckdb"))
