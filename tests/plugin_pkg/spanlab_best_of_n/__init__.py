"""Best-of-n rejection sampling as a spanlab algorithm: the smallest real one, living outside the package.

Each round samples ``n`` rollouts of ``tasks`` train tasks from the served policy and records the mean
reward and the best-of-n reward (the share of tasks one of the n samples solved). It trains nothing:
the framework's base and final held-out evaluations bracket it, and agree up to sampling noise.
Chosen in YAML with ``algorithm: best_of_n`` and a ``best_of_n:`` section (docs/algorithms.md).
"""

from __future__ import annotations

from pydantic import Field

from spanlab.jobs.algorithm import Algorithm, AlgorithmConfig
from spanlab.jobs.job import Job


class BestOfNConfig(AlgorithmConfig):
    n: int = Field(default=4, ge=1, le=64, description="samples per task")
    tasks: int = Field(default=8, ge=1, le=10_000, description="train tasks per round")
    rounds: int = Field(default=1, ge=0, le=1000)


class BestOfN(Algorithm[BestOfNConfig]):
    config_model = BestOfNConfig
    steps_key = "rounds"  # spanlab train --steps N sets best_of_n.rounds

    def train_tasks(self) -> int:
        return self.settings.tasks

    def run(self, job: Job) -> None:
        n = self.settings.n
        for step, tasks in job.steps(self.settings.rounds, self.settings.tasks, "best-of-n"):
            batch = job.collect(tasks, group_size=n, step=step)  # rewards in queue order: n per task
            best_T = [max(batch.rewards[i * n:(i + 1) * n]) for i in range(len(tasks))]
            job.log_step({"reward_mean": batch.mean_reward, "best_of_n": sum(best_T) / len(best_T),
                          "rollout_s": batch.seconds, "rollout_failed": float(batch.failed)})
