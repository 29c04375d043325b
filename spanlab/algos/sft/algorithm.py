"""``algorithm: sft``: reward-filtered fine-tuning rounds. Run: ``spanlab train tutorials/sql/sft.yaml``.

Rejection-sampling fine-tuning on exact token IDs; the rounds live in :mod:`spanlab.algos.sft.rounds`
(loaded when it runs), the trainers in :mod:`spanlab.training` (torch) and :mod:`spanlab.algos.sft.unsloth`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.jobs.algorithm import Algorithm

if TYPE_CHECKING:
    from spanlab.jobs.job import Job


class SFTRounds(Algorithm[SFTRoundsConfig]):
    config_model = SFTRoundsConfig
    trains_weights = True
    steps_key = "rounds"

    def check(self) -> None:
        """A trainer chosen by name must be usable here (``auto`` decides when the run starts)."""
        if self.settings.backend != "auto":
            from spanlab.algos.sft.rounds import choose_backend

            choose_backend(self.settings)

    def prepare(self, job: Job) -> None:
        """Replay needs demonstrations: say so before the base evaluation, not after it."""
        if self.settings.replay and job.task_set.demonstration is None:
            from spanlab.errors import ConfigError

            raise ConfigError(f"sft.replay: task set {job.config.dataset.name!r} has no demonstrations; "
                              "set replay: 0")

    def train_tasks(self) -> int:
        return self.settings.rounds * self.settings.tasks_per_round

    def run(self, job: Job) -> None:
        from spanlab.algos.sft.rounds import replay_pool, train_sft

        assert job.policy is not None, "SFT rounds train weights: the framework loads the policy"
        replay_from = replay_pool(job.splits["demos"], self.config.warm_start, self.settings.replay)
        train_sft(self.settings, self.config, policy=job.policy, train_policy=job.train_policy, store=job.rig.store,
                  collector=job.collector, tasks=job.task_stream, log=job.step_log, progress=job.progress,
                  demonstration=job.task_set.demonstration, replay_from=replay_from)
