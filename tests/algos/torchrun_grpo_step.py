"""Run by ``torchrun --standalone --nproc-per-node 2`` in tests/algos/test_grpo_torchrun.py: one GRPO update of
test_grpo_parallel's toy batch through the torchrun launch. Rank 0 is ``DataParallel`` as the GRPO loop builds
it (not a whole job: that needs an engine); the other ranks run the real ``spanlab train CONFIG`` (argv[3]),
which makes them helper ranks. Rank 0 saves its parameters after the step and every rank's fingerprint to
``OUT`` (argv[2]); the model folder is argv[1].
"""

from __future__ import annotations

import sys
from functools import partial

import torch

from spanlab.algos.grpo.update import grpo_step
from spanlab.training.data_parallel import DataParallel, load_trainable_model
from spanlab.training.launch import torchrun_launch
from spanlab.training.trainer_config import TrainerConfig
from tests.algos.test_grpo_parallel import CONFIG, SAMPLES_SEED, _batch


def main(model_dir: str, out: str, config: str) -> None:
    launch = torchrun_launch()
    assert launch is not None, "run me under torchrun"
    if launch.rank > 0:
        from spanlab.cli import app

        app(["train", config], prog_name="spanlab")  # exits 0 once rank 0 ends the group
    trainer = TrainerConfig(processes=launch.world, timeout_s=300)  # the 2 shared cores can be slow
    model = load_trainable_model(model_dir)
    with DataParallel(model, partial(load_trainable_model, model_dir), partial(torch.optim.SGD, lr=1.0),
                      trainer) as dp:
        metrics = dp.run(grpo_step, samples=_batch(SAMPLES_SEED, 12), config=CONFIG, pad_id=0)
        fingerprints = dp.fingerprints()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save({"params": flat, "metrics": metrics, "fingerprints": fingerprints}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
