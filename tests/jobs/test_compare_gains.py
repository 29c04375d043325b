"""``tutorials/compare/gains.sql``: the compare table as one SQL query over the arms' DuckDB files.

Five real store files, written through the store API as the stages leave them (held-out rollouts per phase and
split, training rollouts, the calc agent's ``calc.extra_ops`` metric spans). The query's numbers must be the ones
the rest of the project computes on the same stores: the accuracy, pairing and training rollouts of
:mod:`spanlab.compare`, and the extra-operation share of ``tutorials/calc/compare_runs.py``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import ModuleType

import pytest

from spanlab.compare import Arm, measure
from spanlab.config import load_yaml
from spanlab.errors import ConfigError
from spanlab.store import SpanStore
from tests.jobs.run_stores import record
from tests.scripts import load_script
from tutorials.stages import split_names

REPO = Path(__file__).resolve().parents[2]
TASKS = [f"t{i}" for i in range(8)]
SPLITS = ("test", "test_l4")


def _gains() -> ModuleType:
    import sys

    sys.path.insert(0, str(REPO / "tutorials" / "compare"))  # run.py imports it by name the same way
    return load_script(REPO / "tutorials" / "compare" / "gains.py", "compare_gains")


def _rewards(pattern: str) -> dict[str, float]:
    return {t: float(c) for t, c in zip(TASKS, pattern, strict=True)}


def _stores(out: Path, *, apo_final: bool) -> dict[str, Path]:
    """The five stages' stores: the start (base model and warm start), and arms that end better or worse."""
    dbs = {name: out / f"{name}.duckdb" for name in ("start", "grpo", "sft", "apo", "apo-grpo")}
    for split in SPLITS:
        record(dbs["start"], _rewards("00000000"), phase="base", split=split)
        record(dbs["start"], _rewards("11000100"), phase="warm_start", split=split,
               extra_ops=_rewards("00000001"))
        record(dbs["grpo"], _rewards("11110110"), phase="final", split=split, extra_ops=_rewards("00110000"))
        record(dbs["sft"], _rewards("10000100"), phase="final", split=split, failed=frozenset({"t7"}))
        record(dbs["apo"], _rewards("11000100"), phase="base", split=split)  # the search's own start
        if apo_final:
            record(dbs["apo"], _rewards("11100100"), phase="final", split=split)
        record(dbs["apo-grpo"], _rewards("11111111" if split == "test" else "01000100"), phase="final", split=split)
    record(dbs["grpo"], {f"r{i}": 1.0 for i in range(16)}, mode="train")
    record(dbs["sft"], {f"r{i}": 0.0 for i in range(16)}, mode="train")
    record(dbs["apo"], {f"v{i}": 1.0 for i in range(12)}, mode="val")
    record(dbs["apo"], {f"p{i}": 1.0 for i in range(4)}, mode="train")
    record(dbs["apo-grpo"], {f"r{i}": 1.0 for i in range(16)}, mode="train")
    return dbs


@pytest.mark.parametrize("apo_final", [True, False], ids=["apo-final", "apo-kept-its-start"])
def test_the_query_gives_the_table_spanlab_compare_and_compare_runs_give(tmp_path: Path, apo_final: bool) -> None:
    gains = _gains()
    dbs = _stores(tmp_path, apo_final=apo_final)
    rows = gains.gains(dbs)
    assert [(r["arm"], r["split"]) for r in rows] == [(a, s) for a in dbs for s in SPLITS]
    start = Arm("start", "-", dbs["start"], "warm_start")
    arms = {name: Arm(name, name, db, "final", fallback="base" if name == "apo" else None)
            for name, db in dbs.items() if name != "start"}
    measured = {row.arm.label: row for row in measure([start, *arms.values()], start, SPLITS)}
    compare_runs = load_script(REPO / "tutorials" / "calc" / "compare_runs.py", "compare_runs")
    for row in rows:
        want = measured[row["arm"]]
        got = want.splits[row["split"]]
        assert row["n"] == got.accuracy.n == len(TASKS)
        assert row["end_pct"] == round(100 * got.accuracy.mean, 1)
        assert row["start_pct"] == round(100 * measured["start"].splits[row["split"]].accuracy.mean, 1)
        assert row["gain"] == (0.0 if got.diff is None else round(100 * got.diff.mean, 1))
        assert row["gain_low"] <= row["gain"] <= row["gain_high"]
        assert row["training_rollouts"] == want.rollouts
        phase = "warm_start" if row["arm"] == "start" else "final" if row["arm"] != "apo" or apo_final else "base"
        with SpanStore(dbs[row["arm"]]) as store:
            share = compare_runs.extra_ops_share(store, phase).get(row["split"])
        assert (row["extra_ops_pct"] is None and share is None) or row["extra_ops_pct"] == round(100 * share, 1)
    grpo_test = next(r for r in rows if (r["arm"], r["split"]) == ("grpo", "test"))
    # 8 pairs, differences 0,0,1,1,0,0,1,0: mean 3/8, sample sd 0.518, so +37.5 [+1.6, +73.4]
    sd = math.sqrt(sum((d - 0.375) ** 2 for d in (0, 0, 1, 1, 0, 0, 1, 0)) / 7)
    assert (grpo_test["gain"], grpo_test["gain_low"], grpo_test["gain_high"]) == \
        (37.5, round(100 * (0.375 - 1.96 * sd / math.sqrt(8)), 1), round(100 * (0.375 + 1.96 * sd / math.sqrt(8)), 1))
    assert (grpo_test["start_extra_ops_pct"], grpo_test["extra_ops_pct"]) == (12.5, 25.0)

    table = gains.write(tmp_path, "test")
    assert (tmp_path / "gains.png").stat().st_size > 10_000 and (tmp_path / "gains.md").read_text() == table + "\n"
    assert table.splitlines()[0] == "| " + " | ".join(gains.COLUMNS) + " |" and len(table.splitlines()) == 2 + len(rows)


def test_a_resumed_evaluation_counts_once_and_a_missing_store_is_named(tmp_path: Path) -> None:
    gains = _gains()
    dbs = _stores(tmp_path, apo_final=True)
    record(dbs["grpo"], _rewards("00000000"), phase="final", split="test")  # evaluated again after a resume
    rows = {(r["arm"], r["split"]): r for r in gains.gains(dbs)}
    assert rows[("grpo", "test")]["n"] == len(TASKS) and rows[("grpo", "test")]["end_pct"] == 0.0
    dbs["sft"].unlink()
    with pytest.raises(ConfigError, match="no store for sft"):
        gains.gains(dbs)


def test_the_tutorial_shows_the_query_as_it_runs() -> None:
    """docs/tutorials/compare.md shows gains.sql verbatim (comments aside), so the page cannot drift from it."""
    page = (REPO / "docs" / "tutorials" / "compare.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```sql\n(.*?)^```", page, re.S | re.M)
    query = (REPO / "tutorials" / "compare" / "gains.sql").read_text(encoding="utf-8")

    def code(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))

    assert any(code(block) == code(query) for block in blocks)


def test_the_arms_run_the_main_job_at_one_budget(tmp_path: Path) -> None:
    """run.py on the main job: every arm evaluates its five splits and spends the same 1152 rollouts (SFT rounds
    shaped like GRPO steps); --start-from evaluates an existing warm start instead of training one."""
    _gains()
    run = load_script(REPO / "tutorials" / "compare" / "run.py", "compare_run")
    base = load_yaml(run.BASE)
    configs = {name: run.stage_config(name, base, tmp_path, 1152, 90) for name in run.STAGES}
    for name, data in configs.items():
        assert split_names(data) == ("test", "family", "test_l4", "family_l4", "depth"), name
        assert data["eval"]["tasks"] == 90, name
        assert "curve" not in data["eval"] and (name == "start") == ("warm_start" in data), name
        if name != "start":
            assert data["dataset"]["train_tasks"] == 1366 and data["engine"]["model"] == str(tmp_path / "start/final")
    assert configs["grpo"]["grpo"]["steps"] == 9  # and the term demonstrates what the warm start did, no level 4:
    assert configs["grpo"]["grpo"]["demonstrations"] == {"demos": 512, "levels": [1, 2, 3], "coef": 1.0, "per_step": 16}
    assert {k: configs["sft"]["sft"][k] for k in ("rounds", "tasks_per_round", "samples_per_task")} == \
        {"rounds": 9, "tasks_per_round": 16, "samples_per_task": 8}
    assert configs["apo"]["apo"]["max_rollouts"] == 1152 and configs["apo"]["eval"]["base"] is True
    with pytest.raises(SystemExit, match="give a multiple of it"):
        run.stage_config("grpo", base, tmp_path, 1000, 90)

    ws = tmp_path / "calc-ws"
    start = run.start_config(base, tmp_path, 1152, 90, None, ws)
    assert "warm_start" not in start and start["eval"]["base"] is True and start["grpo"]["steps"] == 0
    assert start["engine"]["model"] == str(ws / "final")
    assert run.stage_config("sft", base, tmp_path, 1152, 90, None, ws / "final")["engine"]["model"] == \
        str(ws / "final")
    first = run.arms(tmp_path, {}, start_from=ws)[0]
    assert (first.label, first.phase) == (f"start: {ws / 'final'}", "base")
