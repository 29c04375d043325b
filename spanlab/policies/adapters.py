"""One base model with a LoRA adapter per policy (peft), and each adapter written as a folder vLLM serves.

peft keeps several named adapters on one base model; the adapter named after a policy is that policy. A new
adapter's B matrix is zero (peft's default init), so every policy starts as the base model and the policies only
part as each is trained on its own roles' calls. Each version is written to a folder of its own (PEFT format:
``adapter_config.json`` + ``adapter_model.safetensors``), never over an earlier one: vLLM may evict an adapter
and reload it from its path later, and a stored version must still name the weights it served.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spanlab.policies.config import PoliciesConfig
from spanlab.training.model import MissingDependencyError
from spanlab.training.settings import LoraConfig

if TYPE_CHECKING:
    from torch import nn


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise MissingDependencyError("a LoRA policy per role needs the 'peft' package, which is not installed; "
                                     "install it (pinned in constraints.txt) or drop policies") from exc
    return peft


def _peft_config(lora: LoraConfig) -> Any:
    return _peft().LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                              lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def multi_adapter_model(model: nn.Module, policies: PoliciesConfig) -> Any:
    """``model`` wrapped by peft with one adapter per policy, named after it; the first policy is active.

    The A matrices are drawn from ``policies.init_seed`` (the same config gives the same adapters), B is zero."""
    peft = _peft()
    names = policies.names
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(policies.init_seed)
        wrapped = peft.get_peft_model(model, _peft_config(policies.lora_for(names[0])), adapter_name=names[0])
        for name in names[1:]:
            wrapped.add_adapter(name, _peft_config(policies.lora_for(name)))
    wrapped.set_adapter(names[0])
    return wrapped


def load_adapters(model: Any, folder: str | Path, names: list[str]) -> list[str]:
    """Set each of ``names``' adapters to the weights saved in ``folder/<name>/`` (a run's ``final/`` or
    ``step-K/``), so a run started from that folder goes on from its policies instead of from B = 0. Returns the
    policies loaded; a policy with no folder there keeps its fresh adapter. The saved adapter must be the one the
    config asks for (rank, alpha and target modules), else a one-line error naming the policy: another alpha loads
    without complaint but scales the update by alpha / rank, so the policy would not be the one that was saved."""
    import json

    from safetensors.torch import load_file

    peft, loaded = _peft(), []
    for name in names:
        saved = Path(folder) / name
        if not (saved / "adapter_model.safetensors").is_file():
            continue
        got = json.loads((saved / "adapter_config.json").read_text())
        want = model.peft_config[name]
        shape = (got.get("r"), float(got.get("lora_alpha") or 0), sorted(got.get("target_modules") or []))
        if shape != (want.r, want.lora_alpha, sorted(want.target_modules)):
            raise ValueError(f"policy {name!r}: the adapter in {saved} has rank {shape[0]}, alpha {shape[1]:g} on "
                             f"{shape[2]}; the config asks rank {want.r}, alpha {want.lora_alpha:g} on "
                             f"{sorted(want.target_modules)}")
        result = peft.set_peft_model_state_dict(model, load_file(str(saved / "adapter_model.safetensors")),
                                                adapter_name=name)
        if missing := [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]:
            raise ValueError(f"policy {name!r}: the adapter in {saved} has no weight for {missing[0]}")
        loaded.append(name)
    return loaded


def adapter_state(model: Any, policy: str) -> dict[str, torch.Tensor]:
    """The weights of ``policy``'s adapter under PEFT's saved names (what vLLM loads), detached copies."""
    peft = _peft()
    state = peft.get_peft_model_state_dict(model, adapter_name=policy)
    return {name: tensor.detach().clone().cpu() for name, tensor in state.items()}


def save_adapter(model: Any, policy: str, out_dir: str | Path) -> Path:
    """Write ``policy``'s adapter to ``out_dir`` as a PEFT folder (``out_dir`` itself, whatever the name)."""
    from safetensors.torch import save_file

    if policy not in model.peft_config:
        raise KeyError(f"the model has no adapter {policy!r} (adapters: {sorted(model.peft_config)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.peft_config[policy].save_pretrained(str(out))  # adapter_config.json, as peft's own save writes it
    save_file({k: v.contiguous() for k, v in adapter_state(model, policy).items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


def base_model_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights under their HF names, without any adapter: what every policy's adapter applies to
    (a job's warm start changes them before the adapters are added, so a run writes them beside its adapters)."""
    state = {}
    for name, tensor in model.get_base_model().state_dict().items():
        if "lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = tensor.detach().cpu()
    return state
