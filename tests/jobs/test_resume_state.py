"""The pieces of ``--resume`` that need no engine: the saved state round-trips, the config must not change,
bad settings name their key."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from spanlab.errors import ConfigError
from spanlab.jobs.checkpoints import check_resumable
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.registry import load_algorithm
from spanlab.jobs.resuming import check_same_config, comparable
from spanlab.training.resume import (
    STATE_DIR,
    TrainState,
    load_state,
    restore_optimizer,
    restore_rng,
    restore_weights,
    save_state,
)


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)  # frozen parameters are the base model's: not saved
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_state_round_trips_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_state(tmp_path, {"completed_steps": 2, "policy_version": 2}, model, optimizer)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    state = load_state(tmp_path)
    assert state is not None and state.info["completed_steps"] == 2
    assert set(state.tensors["params"]) == {"0.bias", "1.weight", "1.bias"}

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    fresh[0].weight.requires_grad_(False)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
    restore_weights(state, fresh)
    assert restore_optimizer(state, fresh_opt)
    for name in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(dict(fresh.named_parameters())[name], dict(model.named_parameters())[name])
    assert fresh_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_state_survives_a_kill_between_the_two_renames(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    save_state(tmp_path, {"completed_steps": 1}, model, optimizer)
    (tmp_path / STATE_DIR).rename(tmp_path / f"{STATE_DIR}.old")  # the moment between the renames
    (tmp_path / f".{STATE_DIR}.tmp-1-x").mkdir()  # and a half-written next state, never read
    state = load_state(tmp_path)
    assert state is not None and state.info["completed_steps"] == 1
    save_state(tmp_path, {"completed_steps": 2}, model, optimizer)
    assert load_state(tmp_path).info["completed_steps"] == 2 and not (tmp_path / f"{STATE_DIR}.old").exists()
    assert load_state(tmp_path / "nothing-here") is None


def test_resume_refuses_a_changed_config_but_not_more_steps() -> None:
    base = {"grpo": {"steps": 3, "lr": 1e-5}, "eval": {"tasks": 2}}
    state = TrainState({"config": comparable(parse_train_config(base))}, {})
    check_same_config(state, parse_train_config({**base, "grpo": {"steps": 6, "lr": 1e-5},
                                                 "tracking": {"tensorboard": {"dir": "tb"}}}))
    with pytest.raises(ConfigError, match=r"--resume: the config changed since the run started \(grpo\)"):
        check_same_config(state, parse_train_config({**base, "grpo": {"steps": 3, "lr": 1e-4}}))


def test_bad_checkpoint_settings_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"checkpoints\.every"):
        parse_train_config({"checkpoints": {"every": 0}})
    with pytest.raises(ConfigError, match=r"checkpoints\.keep"):
        parse_train_config({"checkpoints": {"keep": 2}})
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.tracking_uri"):
        parse_train_config({"tracking": {"mlflow": {"experiment": "x"}}})
    sft = parse_train_config({"algorithm": "sft"})
    with pytest.raises(ConfigError, match=r"--resume: algorithm 'sft' cannot resume"):
        check_resumable(load_algorithm("sft")(sft), sft)
    grpo = parse_train_config({"checkpoints": {"resume_state": False}})
    with pytest.raises(ConfigError, match=r"--resume: checkpoints\.resume_state is off"):
        check_resumable(load_algorithm("grpo")(grpo), grpo)
