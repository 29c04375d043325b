"""The comparison table (``spanlab.compare``) read back from real DuckDB store files written through the store API.

Each store holds what a run leaves: held-out rollouts (mode ``test``, ``metadata.phase``/``split``, a reward
span) and training rollouts of other modes. The table must pair arms with the start by task, count the
training rollouts from the store, and refuse a comparison whose tasks differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlab.compare import Arm, build_table, load_winner, measure
from spanlab.errors import ConfigError
from spanlab.stats import bootstrap, paired_difference
from spanlab.store import SpanStore
from tests.jobs.run_stores import record

START = {"t1": 1.0, "t2": 0.0, "t3": 0.0, "t4": 1.0}
ARM = {"t1": 1.0, "t2": 1.0, "t3": 0.0, "t4": 1.0}


def test_accuracy_intervals_and_paired_difference_come_from_the_stores(tmp_path: Path) -> None:
    start_db, arm_db = tmp_path / "start.duckdb", tmp_path / "grpo.duckdb"
    for split in ("test", "family"):
        record(start_db, START, phase="warm_start", split=split)
        record(arm_db, ARM, phase="final", split=split, failed=frozenset({"t3"}))  # t3 scores 0 all the same
    record(arm_db, {"a": 1.0, "b": 0.0, "c": 1.0}, mode="train")  # training rollouts: counted, not evaluated
    record(arm_db, {"v": 1.0}, mode="val")
    record(arm_db, dict(START), phase="other", split="test")  # another phase: must not leak in
    start = Arm("start", "warm start", start_db, "warm_start", 60.0)
    arm = Arm("GRPO", "grpo", arm_db, "final", 120.0)

    rows = measure([start, arm], start, ("test", "family"))
    ids = sorted(START)
    got = rows[1].splits["test"]
    assert got.accuracy == bootstrap([ARM[t] for t in ids])
    assert got.diff == paired_difference([ARM[t] for t in ids], [START[t] for t in ids])
    assert got.accuracy.mean == 0.75 and got.diff.mean == 0.25 and got.diff.low <= 0.25 <= got.diff.high
    assert rows[0].splits["test"].diff is None and rows[0].rollouts == 0 and rows[1].rollouts == 4

    table = build_table([start, arm], start, ("test", "family"))
    lines = table.splitlines()
    assert lines[0].startswith("| arm | algorithm | test (n=4) accuracy [95% CI] |")
    assert lines[3].startswith("| GRPO | grpo | 75.0% [") and "+25.0 [" in lines[3]
    assert lines[3].endswith("| 4 | 2.0 | 2 |")  # training rollouts, minutes, failed held-out rollouts


def test_a_continued_arm_counts_its_parents_rollouts_and_an_apo_without_final_falls_back(tmp_path: Path) -> None:
    start_db, apo_db, chain_db = tmp_path / "start.duckdb", tmp_path / "apo.duckdb", tmp_path / "apo-grpo.duckdb"
    record(start_db, START, phase="warm_start", split="test")
    record(apo_db, START, phase="base", split="test")  # the search kept its start: no final evaluation
    record(apo_db, {"p1": 1.0, "p2": 1.0}, mode="val")
    record(chain_db, ARM, phase="final", split="test")
    record(chain_db, {"a": 1.0, "b": 0.0, "c": 1.0}, mode="train")
    start = Arm("start", "warm start", start_db, "warm_start")
    apo = Arm("APO", "apo", apo_db, "final", fallback="base")
    chain = Arm("APO then GRPO", "apo, then grpo", chain_db, "final", 300.0, after=apo_db, after_wall_s=120.0)

    rows = measure([apo, chain], start, ("test",))
    assert rows[0].splits["test"].diff.mean == 0.0 and rows[0].rollouts == 2
    assert (rows[1].rollouts, rows[1].after_rollouts) == (3, 2)
    assert build_table([chain], start, ("test",)).splitlines()[-1].endswith("| 5 (2 + 3) | 5.0 (+ 2.0) | 0 |")


def test_different_tasks_are_refused_not_paired(tmp_path: Path) -> None:
    start_db, arm_db = tmp_path / "start.duckdb", tmp_path / "sft.duckdb"
    record(start_db, START, phase="warm_start", split="test")
    record(arm_db, {**ARM, "t9": 1.0}, phase="final", split="test")
    start = Arm("start", "warm start", start_db, "warm_start")
    with pytest.raises(ConfigError, match="test tasks differ from the other runs'"):
        measure([Arm("SFT", "sft", arm_db, "final")], start, ("test",))
    with pytest.raises(ConfigError, match="no held-out rollouts of phase 'final' on split 'family'"):
        measure([Arm("SFT", "sft", arm_db, "final")], start, ("family",))
    with pytest.raises(ConfigError, match="no such store"):
        measure([Arm("x", "x", tmp_path / "missing.duckdb", "final")], start, ("test",))


def test_a_start_evaluated_on_more_tasks_is_paired_on_the_arms_tasks(tmp_path: Path) -> None:
    start_db, arm_db, other_db = tmp_path / "start.duckdb", tmp_path / "grpo.duckdb", tmp_path / "sft.duckdb"
    record(start_db, {**START, "t5": 1.0, "t6": 1.0}, phase="warm_start", split="test")
    record(arm_db, ARM, phase="final", split="test")
    record(other_db, {"t1": 1.0, "t5": 1.0}, phase="final", split="test")  # t5: the start's, not GRPO's
    start = Arm("start", "warm start", start_db, "warm_start")
    base = Arm("base", "-", start_db, "warm_start", counts_rollouts=False)  # the start's own 6 tasks
    rows = measure([base, start, Arm("GRPO", "grpo", arm_db, "final")], start, ("test",))
    assert [r.splits["test"].accuracy.n for r in rows] == [4, 4, 4] and rows[0].splits["test"].accuracy.mean == 0.5
    with pytest.raises(ConfigError, match=r"(SFT|GRPO): its test tasks differ from the other runs'"):
        measure([Arm("GRPO", "grpo", arm_db, "final"), Arm("SFT", "sft", other_db, "final")], start, ("test",))


def test_load_winner_reads_the_chosen_prompt_version(tmp_path: Path) -> None:
    db = tmp_path / "apo.duckdb"
    with SpanStore(db) as store:
        for text in ("<poml><p>start</p></poml>", "<poml><p>winner</p></poml>", "<poml><p>later</p></poml>"):
            store.add_resource("prompt", {"template": text}, kind="prompt_template")
    (tmp_path / "apo.json").write_text(json.dumps({"summary": {"best_version": 2.0}}))
    assert load_winner(db, tmp_path / "apo.json") == "<poml><p>winner</p></poml>"
    with pytest.raises(ConfigError, match="did the APO run finish"):
        load_winner(db, tmp_path / "nope.json")
