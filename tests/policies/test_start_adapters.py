"""A run started from another run's folder with a policy per role goes on from its adapters (not from B = 0).

A tiny random Llama with the real SmolLM2 tokenizer; the adapters are written as a run writes them
(``save_adapter`` into ``<folder>/<policy>/``) and read back by :func:`spanlab.policies.adapters.load_adapters`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from spanlab.policies.adapters import adapter_state, load_adapters, multi_adapter_model, save_adapter
from spanlab.policies.config import PoliciesConfig

LORA = {"rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj")}
PER_ROLE = PoliciesConfig(roles={"writer": "w", "checker": "c"}, lora=LORA)


def _model(tiny_model_dir: Path, policies: PoliciesConfig = PER_ROLE) -> Any:
    from transformers import AutoModelForCausalLM

    return multi_adapter_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)


def _trained(tiny_model_dir: Path, folder: Path) -> Any:
    """A model whose adapters moved away from their start (B != 0), saved as a run's folder."""
    model = _model(tiny_model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param))
    for policy in PER_ROLE.names:
        save_adapter(model, policy, folder / policy)
    return model


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_policy_starts_from_its_saved_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = _trained(tiny_model_dir, tmp_path)
    fresh = _model(tiny_model_dir)
    assert not _equal(adapter_state(fresh, "w"), adapter_state(trained, "w"))
    assert load_adapters(fresh, tmp_path, ["w", "c"]) == ["w", "c"]
    for policy in ("w", "c"):
        assert _equal(adapter_state(fresh, policy), adapter_state(trained, policy))
    assert not _equal(adapter_state(fresh, "w"), adapter_state(fresh, "c"))  # each its own, not one copied


def test_a_policy_with_no_folder_keeps_its_fresh_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    _trained(tiny_model_dir, tmp_path)
    policies = PoliciesConfig(roles={"writer": "w", "checker": "new"}, lora=LORA)
    model = _model(tiny_model_dir, policies)
    before = adapter_state(model, "new")
    assert load_adapters(model, tmp_path, list(policies.names)) == ["w"]
    assert _equal(adapter_state(model, "new"), before)
    assert all(not t.any() for k, t in before.items() if "lora_B" in k)  # still B = 0


def test_an_adapter_of_another_shape_is_a_one_line_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    _trained(tiny_model_dir, tmp_path)
    other = PoliciesConfig(roles={"writer": "w"}, lora={**LORA, "rank": 8})
    with pytest.raises(ValueError, match=r"policy .w.: the adapter in .* has rank 4, .* the config asks rank 8"):
        load_adapters(_model(tiny_model_dir, other), tmp_path, ["w"])


def test_an_adapter_of_another_alpha_is_a_one_line_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Same shapes, so peft would load it, but the update would be scaled by 16/4 instead of 8/4."""
    _trained(tiny_model_dir, tmp_path)
    other = PoliciesConfig(roles={"checker": "c"}, lora={**LORA, "alpha": 16})
    with pytest.raises(ValueError, match=r"policy .c.: .* has rank 4, alpha 8 .* asks rank 4, alpha 16"):
        load_adapters(_model(tiny_model_dir, other), tmp_path, ["c"])
