"""The ``Algorithm`` protocol: an algorithm owns its config section and what it does between two evaluations.

The framework (:func:`spanlab.jobs.job.run_job`) opens the job the algorithm runs in (store, engine,
recording gateway, rollout collector, task splits, the policy when it trains weights), evaluates the
held-out split before and after, runs the optional warm start and writes the report, so a held-out
number means the same for every algorithm. An algorithm only says what happens in between.

Built-ins are ``grpo``, ``sft`` and ``apo``; a third-party one is a subclass registered under the entry
point group ``spanlab.algorithms`` and chosen by name in YAML (docs/algorithms.md)::

    class BestOfN(Algorithm[BestOfNConfig]):
        config_model = BestOfNConfig          # the YAML section named after the algorithm

        def run(self, job: Job) -> None:
            batch = job.collect(job.splits["rl"][:8], group_size=self.settings.n)
            job.log_step({"reward_mean": batch.mean_reward})
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # config and job import this module at run time; these types only point back
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.job import Evaluator, Job
    from spanlab.training.settings import LoraConfig


class AlgorithmConfig(BaseModel):
    """Base of an algorithm's section: frozen, unknown keys are errors naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)


SettingsT = TypeVar("SettingsT", bound=BaseModel)


class Algorithm(ABC, Generic[SettingsT]):
    """One training algorithm; built by the framework with the validated config, then ``run`` once."""

    config_model: ClassVar[type[BaseModel]] = AlgorithmConfig
    trains_weights: ClassVar[bool] = False  # True: the job loads the policy (torch) and can warm-start it
    data_parallel: ClassVar[bool] = False  # True: its update honours trainer.processes > 1
    steps_key: ClassVar[str | None] = None  # the field of the section that ``spanlab train --steps N`` sets
    resumable: ClassVar[bool] = False  # True: steps from ``job.steps``, optimizer via ``job.attach_optimizer``
    async_loop: ClassVar[bool] = False  # True: its run honours ``loop: {mode: async}`` (docs/async.md)
    trains_policies: ClassVar[bool] = False  # True: its run trains a policy per role (``policies:``, multi_policy.md)

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.settings: SettingsT = config.section  # type: ignore[assignment]  # validated as config_model

    def check(self) -> None:
        """Checks across sections that need no engine; raise ConfigError. ``spanlab train --check`` runs them."""

    def train_tasks(self) -> int:
        """How many distinct train tasks the run draws from (the framework generates the ``train`` split)."""
        return 1

    def policy_lora(self) -> LoraConfig | None:
        """LoRA adapters to wrap the loaded policy in (``trains_weights`` only); the engine then hot-loads them."""
        return None

    def prepare(self, job: Job) -> None:
        """Before the base evaluation, e.g. store the starting prompt the base evaluation must use."""

    def evaluator(self) -> Evaluator | None:
        """How the held-out policy runs, asked once after ``prepare`` (None: the served model through the
        collector). APO pins the prompt versions it found here; ``prepare`` may also set ``job.evaluator``."""
        return None

    @abstractmethod
    def run(self, job: Job) -> None:
        """Improve the policy; each step goes to ``job.log_step``. The final evaluation follows if a step was logged."""

    def summarize(self, job: Job) -> None:
        """After the final evaluation, before the report is written: summary rows, extra files, console output."""
