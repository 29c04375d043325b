"""``warm_start.role_demos``: checked before anything starts (one clear error naming the key), and what it asks of
the run (enough train tasks for the mined warm start's rollouts). Runs the real CLI with ``--check``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import split_tasks
from spanlab.jobs.tasks import load_task_set

SQL = ("algorithm: grpo\nagent: {name: sql, kwargs: {max_tokens: 32}}\ndataset: {name: sql, levels: [1]}\n"
       "agents: [writer, checker, rewriter]\n")
CALC = "algorithm: grpo\nagent: {name: calc, kwargs: {max_tokens: 32}}\ndataset: {name: calc, levels: [1]}\n"

BAD = {
    "mine_tasks without mined": (SQL + "warm_start: {demos: 4, mine_tasks: 8}\n",
                                 r"warm_start: .*mine_tasks: only used with role_demos: mined"),
    "unknown role_demos": (SQL + "warm_start: {demos: 4, role_demos: recorded}\n",
                           r"warm_start\.role_demos: Input should be 'generated' or 'mined'"),
    "a task set that mines nothing": (CALC + "warm_start: {demos: 4, role_demos: mined}\n",
                                      r"warm_start\.role_demos: task set 'calc' mines no role demonstrations"),
    "mined for an algorithm without weights": (SQL.replace("grpo", "apo") + "warm_start: {role_demos: mined}\n",
                                               r"warm_start: algorithm 'apo' trains no weights"),
}


def _check(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    path.write_text(text + f"db: {tmp_path}/run.duckdb\nout_dir: {tmp_path}/runs\n")
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    return result.exit_code, result.output


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_role_demos_are_one_clear_error(tmp_path: Path, case: str) -> None:
    text, message = BAD[case]
    code, output = _check(tmp_path, text)
    assert code == 2, output
    assert "Traceback" not in output and output.startswith("error:"), output
    assert re.search(message, " ".join(output.split())), output


def test_a_mined_warm_start_checks_and_gets_its_train_tasks(tmp_path: Path) -> None:
    code, output = _check(tmp_path, SQL + "policies: {roles: {writer: w, checker: c, rewriter: fix}}\n"
                                          "warm_start: {demos: 4, role_demos: mined, mine_tasks: 30}\n")
    assert code == 0, output
    config = parse_train_config({"agent": {"name": "sql"}, "dataset": {"name": "sql", "levels": [1]},
                                 "warm_start": {"demos": 4, "role_demos": "mined", "mine_tasks": 30}})
    assert config.warm_start is not None and config.warm_start.mined_tasks == 30
    assert len(split_tasks(load_task_set("sql"), config, 2)["train"]) >= 30  # the mining rollouts' tasks
    default = parse_train_config({"warm_start": {"role_demos": "mined"}})
    assert default.warm_start is not None and default.warm_start.mined_tasks == 64
    assert parse_train_config({"warm_start": {}}).warm_start.mined_tasks == 0  # type: ignore[union-attr]


def test_the_sql_tutorials_mined_config_passes_the_checks() -> None:
    """tutorials/sql/policies_mined.yaml: policies.yaml with a mined per-role warm start; everything else as there
    (the >= 90 held-out tasks included), so the two runs differ by the warm start alone."""
    from spanlab.jobs.config import load_train_config
    from spanlab.jobs.job import check_job

    folder = Path(__file__).resolve().parents[2] / "tutorials" / "sql"
    config = load_train_config(folder / "policies_mined.yaml")
    check_job(config)
    assert config.warm_start is not None and config.warm_start.role_demos == "mined"
    mined, per_role = config.resolved(), load_train_config(folder / "policies.yaml").resolved()
    differ = {k for k in mined.keys() | per_role.keys() if mined.get(k) != per_role.get(k)}
    assert differ == {"run_name", "db", "warm_start"}
    assert mined["eval"]["tasks"] >= 90


def test_the_shared_arm_of_the_mined_comparison_differs_by_its_policies_alone() -> None:
    """tutorials/sql/policies_shared_mined.yaml is policies_mined.yaml with one adapter for every role and the final
    reward broadcast (no per-turn credit), and policies_shared.yaml with the mined warm start."""
    from spanlab.jobs.config import load_train_config
    from spanlab.jobs.job import check_job

    folder = Path(__file__).resolve().parents[2] / "tutorials" / "sql"
    shared_mined = load_train_config(folder / "policies_shared_mined.yaml")
    check_job(shared_mined)
    a = shared_mined.resolved()
    for other, expected in (("policies_mined.yaml", {"run_name", "db", "policies", "grpo", "engine"}),
                            ("policies_shared.yaml", {"run_name", "db", "warm_start"})):
        b = load_train_config(folder / other).resolved()
        assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == expected, other
    per_role = load_train_config(folder / "policies_mined.yaml").resolved()
    assert {k for k in a["grpo"] if a["grpo"][k] != per_role["grpo"][k]} == {"credit"}
    assert {k for k in a["engine"] if a["engine"][k] != per_role["engine"][k]} == {"max_loras"}  # a slot per policy
    assert set(shared_mined.policies.names) == {"shared"}  # type: ignore[union-attr]
