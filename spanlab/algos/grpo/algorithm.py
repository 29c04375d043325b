"""``algorithm: grpo``: GRPO on exact token IDs. Run: ``spanlab train tutorials/calc/grpo.yaml``.

Light on import (the config only), so ``spanlab train --check`` never loads torch for it; the loop
(:mod:`spanlab.algos.grpo.loop`) and the update (:mod:`spanlab.algos.grpo.update`) load when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanlab.algos.grpo.config import GRPOSection
from spanlab.errors import ConfigError
from spanlab.jobs.algorithm import Algorithm

if TYPE_CHECKING:
    from spanlab.jobs.job import Job
from spanlab.training.settings import LoraConfig


class GRPO(Algorithm[GRPOSection]):
    config_model = GRPOSection
    trains_weights = True
    data_parallel = True
    steps_key = "steps"
    resumable = True
    async_loop = True
    trains_policies = True

    def check(self) -> None:
        loop, per_step = self.config.loop, self.settings.tasks_per_step
        if loop.mode == "async" and loop.groups_in_flight(per_step) < per_step:
            raise ConfigError(f"loop.in_flight_groups: {loop.in_flight_groups} is fewer than a step's groups "
                              f"(grpo.tasks_per_step: {per_step}); no step could ever fill")
        if self.settings.dynamic_sampling is not None and loop.mode == "async":
            raise ConfigError("grpo.dynamic_sampling: only the sync loop samples a step again; the async loop "
                              "keeps groups in flight (remove one of them)")
        if self.settings.kl_beta > 0 and self.config.trainer.processes > 1:
            raise ConfigError("grpo.kl_beta: the KL term's reference model runs in one trainer process; "
                              "set trainer.processes: 1 or kl_beta: 0")
        if self.settings.demonstrations is not None and (self.config.trainer.processes > 1 or self.config.policies):
            raise ConfigError("grpo.demonstrations: the demonstration term trains one policy in one trainer process; "
                              "set trainer.processes: 1 and drop policies, or remove grpo.demonstrations")
        if self.settings.replay is not None:
            self._check_replay()
        if self.config.trainer.sharding == "fsdp" and self.settings.lora is not None:
            raise ConfigError("trainer.sharding: fsdp trains full weights, not a LoRA adapter; "
                              "set grpo.lora: null or trainer.sharding: none")
        if self.config.policies is not None:
            self._check_policies()

    def _check_replay(self) -> None:
        """``grpo.replay`` runs where the demonstration term does (one policy, one process), on levels the job has."""
        replay = self.settings.replay
        assert replay is not None
        if self.config.trainer.processes > 1 or self.config.policies:
            raise ConfigError("grpo.replay: the replay term trains one policy in one trainer process; "
                              "set trainer.processes: 1 and drop policies, or remove grpo.replay")
        if replay.levels is None:
            return
        dataset = self.config.dataset
        if unknown := sorted(set(replay.levels) - set(dataset.levels)):
            raise ConfigError(f"grpo.replay.levels: {unknown} not among dataset.levels {list(dataset.levels)}")
        trained = sorted(dataset.train_levels or dataset.levels)
        if not set(replay.levels) & set(trained):
            raise ConfigError(f"grpo.replay.levels: none of {list(replay.levels)} is a level RL trains on {trained} "
                              "(dataset.train_levels), so no group is ever replayed")

    def _check_policies(self) -> None:
        """What the loop with a policy per role does not run (yet): each refused with the key to change."""
        if self.config.loop.mode == "async":
            raise ConfigError("policies: the async loop trains one policy; a policy per role runs in the sync loop "
                              "(remove loop or policies)")
        if self.config.trainer.processes > 1:
            raise ConfigError("policies: a policy per role trains in one process; set trainer.processes: 1 or drop "
                              "policies")
        if self.settings.lora is not None:
            raise ConfigError("grpo.lora: with policies each policy is a LoRA adapter set by policies.lora "
                              "(and lora_per_policy); remove grpo.lora")
        if self.settings.kl_beta > 0:
            raise ConfigError("grpo.kl_beta: the KL term's reference model is not kept per policy; set kl_beta: 0 "
                              "or drop policies")

    def train_tasks(self) -> int:
        return self.settings.steps * self.settings.tasks_per_step

    def policy_lora(self) -> LoraConfig | None:
        return self.settings.lora

    def run(self, job: Job) -> None:
        from spanlab.algos.grpo.loop import grpo_step_function, train_grpo

        assert job.policy is not None, "GRPO trains weights: the framework loads the policy"
        policy, collector, tasks, log, store = job.policy, job.collector, job.task_stream, job.step_log, job.rig.store
        trainer = job.trainer(*grpo_step_function(self.settings, policy), lora=self.settings.lora)
        demos = job.demonstrations if self.settings.demonstrations is not None else None
        train_grpo(self.settings, self.config, policy=policy, trainer=trainer, store=store, collector=collector,
                   tasks=tasks, log=log, demos=demos)
