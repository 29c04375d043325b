"""The checker's and the rewriter's demonstrations mined from recorded SQL rollouts, on both store kinds.

The rollouts are the real SQLAgent's, run by a real Worker into the store (``any_store``: a DuckDB store, then a
StoreClient over HTTP), with only the model's replies scripted (tests/sql_scripted.py), so each draft is one whose
right verdict is known. ``test_sql_mining_vllm.py`` mines what the real model wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

from spanlab.adapters.recorded_rollouts import read_rollouts
from spanlab.adapters.role_demos import role_sets
from spanlab.agents.sql.mining import (
    COLUMNS,
    EMPTY,
    ROWS,
    checker_demonstrations,
    mine_demonstrations,
    verdict,
    writer_drafts,
)
from spanlab.agents.sql.prompts import sql_block
from spanlab.store import StoreAPI
from spanlab.types import Rollout
from tests.sql_scripted import TASKS, record_scripted


def test_each_draft_is_labelled_with_its_true_verdict(any_store: StoreAPI) -> None:
    record_scripted(any_store)
    drafts = {d.task["task_id"]: d for d in writer_drafts(read_rollouts(any_store))}
    assert [verdict(drafts[t["task_id"]]) for t in TASKS] == [
        "OK", "WRONG: no such column: nosuch_column", f"WRONG: {EMPTY}", f"WRONG: {COLUMNS}", f"WRONG: {ROWS}",
        "WRONG: no SQL query found in the reply", "OK"]
    assert drafts[TASKS[1]["task_id"]].good_rewrite == TASKS[1]["gold_sql"]  # the recorded rewrite that matched
    assert drafts[TASKS[5]["task_id"]].sql is None and drafts[TASKS[5]["task_id"]].reply.startswith("I do not know")


def test_checker_demos_are_balanced_and_prompted_as_the_agent_prompts(any_store: StoreAPI, tokenizer: Any) -> None:
    agent = record_scripted(any_store)
    demos = mine_demonstrations(read_rollouts(any_store))
    checker = [d for d in demos if d.role == "checker"]
    # 2 drafts matched, 5 did not: the OKs topped up with the gold queries of the first wrong drafts' tasks (the
    # last draft quotes its gold query, so it and its gold are one demonstration), alternating with the WRONGs
    assert [d.messages[-1]["content"] for d in checker] == [
        "OK", "WRONG: no such column: nosuch_column", "OK", f"WRONG: {EMPTY}", "OK", f"WRONG: {COLUMNS}",
        "OK", f"WRONG: {ROWS}", "OK", "WRONG: no SQL query found in the reply"]
    assert [d.label for d in checker[::2]] == ["OK", "OK", "OK_gold", "OK_gold", "OK_gold"]
    assert [d.task["task_id"] for d in checker[4::2]] == [t["task_id"] for t in TASKS[1:4]]
    sent_to_checker = {user for role, user in agent.sent if role == "checker"}
    for demo in checker:
        system, user, _ = demo.messages
        assert system == {"content": agent.prompts["checker"], "role": "system"}
        if demo.label != "OK_gold":
            assert user["content"] in sent_to_checker  # exactly what the live agent sent the checker for that draft
        else:
            assert f"Query:\n{sql_block(demo.task['gold_sql'])}\n\nResult:\n" in user["content"]
    rewriter = [d for d in demos if d.role == "rewriter"]
    assert len(rewriter) == 5 and [d.label for d in rewriter] == ["recorded", "gold", "gold", "gold", "gold"]
    assert all(d.messages[-1]["content"] == sql_block(d.task["gold_sql"]) for d in rewriter)
    assert rewriter[0].messages[1]["content"].endswith(
        "Problem: no such column: nosuch_column; WRONG: no such column: nosuch_column")

    sets = role_sets(demos, tokenizer)
    assert {role: len(s.samples) for role, s in sets.items()} == {"checker": 10, "rewriter": 5}
    assert sets["checker"].stats.kept == 10 and sets["checker"].stats.dropped_duplicate == 0
    ok = sets["checker"].samples[0]
    assert tokenizer.decode(ok.input_ids[ok.loss_mask.astype(bool)]).startswith("OK")  # only the verdict is trained


def test_checker_needs_a_wrong_draft(any_store: StoreAPI) -> None:
    record_scripted(any_store)
    right = [d for d in writer_drafts(read_rollouts(any_store)) if d.matches]
    with pytest.raises(ValueError, match=r"cannot balance the checker's demonstrations: all 2 distinct drafts match "
                                         "the gold result, none is wrong") as info:
        checker_demonstrations(right)
    assert "\n" not in str(info.value)


def test_a_store_without_sql_rollouts_is_a_one_line_error(any_store: StoreAPI) -> None:
    any_store.enqueue([Rollout(input={"task_id": "calc-1", "question": "2 + 2"})])
    with pytest.raises(ValueError, match="no SQL rollouts to mine: none of the 1 rollouts") as info:
        mine_demonstrations(read_rollouts(any_store))
    assert "\n" not in str(info.value)
    assert len(any_store.rollout_summaries()) == 1  # nothing stored was touched
