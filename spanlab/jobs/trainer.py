"""The framework's choice of trainer: one process, data-parallel ranks (FSDP or not), or an adapter per role.

Built once per job (``Job.trainer``) from ``trainer:``, ``policies:`` and ``--resume``, around the algorithm's step
function and optimizer, so an algorithm never branches on where its update runs
(:mod:`spanlab.training.trainers`, :mod:`spanlab.policies.trainer`). What each refuses (``--resume`` with ranks or
policies, a KL term on ranks) is checked before the engine starts (``build_algorithm``, ``check_resumable``).
"""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial

from spanlab.jobs.config import TrainConfig
from spanlab.policies.serving import PolicyAdapters
from spanlab.training.policy import Policy
from spanlab.training.settings import LoraConfig
from spanlab.training.trainers import MakeOptimizer, OneProcessTrainer, RanksTrainer, Trainer, TrainStep


def build_trainer(policy: Policy, config: TrainConfig, stack: ExitStack, step: TrainStep,
                  make_optimizer: MakeOptimizer, *, lora: LoraConfig | None,
                  adapters: PolicyAdapters | None) -> Trainer:
    """The trainer of ``policy`` the config asks for; ranks are started here and stopped with ``stack``.
    ``lora``: what each rank wraps its model in (the algorithm's ``policy_lora()``); ``adapters``: with
    ``policies``, each policy's served adapter (``Job.open_policies``)."""
    if adapters is not None:
        from spanlab.policies.trainer import PolicyTrainer

        return PolicyTrainer(policy.model, adapters, step, make_optimizer, agents=config.agents)
    if config.trainer.processes == 1:
        optimizer = make_optimizer(p for p in policy.model.parameters() if p.requires_grad)
        return OneProcessTrainer(policy, step, optimizer, agents=config.agents)
    from spanlab.engine.model import resolve_model
    from spanlab.training.data_parallel import DataParallel, load_trainable_model

    make_model = partial(load_trainable_model, resolve_model(config.engine.model), lora)
    ranks = stack.enter_context(DataParallel(policy.model, make_model, make_optimizer, config.trainer,
                                             threads=config.torch_threads))
    return RanksTrainer(policy, ranks, step, agents=config.agents)
