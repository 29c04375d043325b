"""The SFT tutorials start where the main job starts and train gently enough not to memorize a round."""

from __future__ import annotations

from pathlib import Path

from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.jobs.config import load_train_config

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def test_calc_sft_has_the_main_jobs_engine_agent_tasks_and_evaluation_and_a_shorter_start() -> None:
    sft, grpo = load_train_config(TUTORIALS / "calc" / "sft.yaml"), load_train_config(TUTORIALS / "calc" / "grpo.yaml")
    assert sft.algorithm == "sft" and sft.run_name != grpo.run_name
    for section in ("engine", "agent", "dataset", "tito"):
        assert getattr(sft, section) == getattr(grpo, section), section  # the same tasks, the same agent
    assert sft.eval == grpo.eval  # measured the same way
    assert sft.warm_start is not None and grpo.warm_start is not None
    # the start: the first demos of the main job's warm start, trained the same way (fewer, so rounds can add)
    assert sft.warm_start.model_copy(update={"demos": grpo.warm_start.demos}) == grpo.warm_start
    assert sft.warm_start.demos < grpo.warm_start.demos and sft.section.replay > 0


def test_rounds_default_to_one_pass_at_a_low_learning_rate_on_every_success() -> None:
    for rounds in (SFTRoundsConfig(), load_train_config(TUTORIALS / "sql" / "sft.yaml").section):
        assert rounds.train.epochs == 1 and rounds.train.lr <= 1e-5
        assert rounds.filter.rule == "threshold"  # best_of_n n=1 capped a round at one example per task
