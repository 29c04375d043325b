"""The SFT tutorials start where the main job starts and train gently enough not to memorize a round."""

from __future__ import annotations

from pathlib import Path

from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.jobs.config import load_train_config

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def test_calc_sft_has_the_main_jobs_engine_agent_tasks_start_and_evaluation() -> None:
    sft, grpo = load_train_config(TUTORIALS / "calc" / "sft.yaml"), load_train_config(TUTORIALS / "calc" / "grpo.yaml")
    assert sft.algorithm == "sft" and sft.run_name != grpo.run_name
    for section in ("engine", "agent", "dataset", "eval", "warm_start", "tito"):
        assert getattr(sft, section) == getattr(grpo, section), section  # the same start, measured the same way


def test_rounds_default_to_one_pass_at_a_low_learning_rate_on_every_success() -> None:
    for rounds in (SFTRoundsConfig(), load_train_config(TUTORIALS / "sql" / "sft.yaml").section):
        assert rounds.train.epochs == 1 and rounds.train.lr <= 1e-5
        assert rounds.filter.rule == "threshold"  # best_of_n n=1 capped a round at one example per task
