"""``spanlab train`` with a policy per role, end to end on the session's real vLLM: the SQL agent's three roles.

The writer has a LoRA policy of its own; the checker and the rewriter are left out of the map and go to the
``default`` policy (the session server has two LoRA slots). One GRPO step of the sync loop: the warm start trains the
full base model, then each policy's adapter is pushed before the training rollouts, each role's calls are routed
to its policy and recorded with it, each policy is stepped on its roles' calls, and only a policy that changed is
pushed again. The final folder holds the base model and an adapter folder per policy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.jobs.outcome import end_lines
from spanlab.policies.serving import resource_name
from spanlab.serve import serve_config
from spanlab.store import SpanStore
from tests.jobs.quick_runs import SQL_POLICIES

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

def _config(engine: str, tmp_path: Path) -> dict:
    return {
        "algorithm": "grpo", "run_name": "sql-policies", "engine_url": engine, "out_dir": str(tmp_path / "runs"),
        "db": str(tmp_path / "run.duckdb"), "engine": {"model": "smollm2-135m-instruct", "max_model_len": 2048},
        "agent": {"name": "sql", "kwargs": {"temperature": 1.0, "max_tokens": 48, "rounds": 1,
                                            "roles": ["writer", "checker", "rewriter"]}},
        "policies": SQL_POLICIES,
        "dataset": {"name": "sql", "seed": 0, "levels": [1]},
        "eval": {"split": "test", "tasks": 1, "temperature": 0.0, "base": False},
        "warm_start": {"demos": 4, "epochs": 1, "lr": 1.0e-4, "batch_size": 4},
        "grpo": {"steps": 1, "tasks_per_step": 2, "group_size": 3, "lr": 1.0e-3, "micro_batch_tokens": 2048},
        "rollouts": {"concurrency": 6},
    }


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


def _diagnosis(policy: str, step: dict[str, float], **facts: bool) -> str:
    """The policy's own metrics first (pytest truncates a long step dict before they show), then the rest."""
    keys = ("n_samples", "n_samples_used", "n_groups_with_signal", "n_groups_cancelled", "skipped", "loss",
            "grad_norm", "loss_tokens", "tis_weight_mean", "tis_capped_frac", "ratio_mean", "reward_std")
    own = {k: f"{step[f'{policy}/{k}']:.4g}" for k in keys if f"{policy}/{k}" in step}
    return f"policy {policy!r} {facts}: {own}; the whole step: {step}"


def test_a_grpo_step_trains_each_policy_on_its_roles_and_writes_a_folder_per_policy(
        tmp_path: Path, policies_engine: str, caplog: pytest.LogCaptureFixture) -> None:
    config = parse_train_config(_config(policies_engine, tmp_path))
    caplog.set_level(logging.INFO)
    report = run_job(config)
    [step] = report.steps
    run_dir = config.run_dir

    with SpanStore(config.db) as store:
        calls = store.query("SELECT attributes->>'agent' AS role, attributes->>'policy' AS policy, "
                            "attributes->>'policy_version' AS version, count(*) AS n FROM spans "
                            "WHERE kind = 'llm_call' GROUP BY ALL").to_pylist()
        pushed = {p: [r.payload for r in store.list_resources(resource_name(p))] for p in ("lora-w", "lora-r")}
    roles = {(c["role"], c["policy"]) for c in calls}
    # the warm start's evaluation ran on the base model (no adapter served yet); the training rollouts on the
    # policies: the writer on its own, the checker (and the rewriter, when called) on the default
    assert ("writer", "lora-w") in roles and ("checker", "lora-r") in roles and ("writer", "base") in roles
    assert {c["policy"] for c in calls if c["role"] == "writer"} <= {"base", "lora-w"}
    assert {c["policy"] for c in calls if c["role"] in ("checker", "rewriter")} <= {"base", "lora-r"}
    assert all(c["version"] is not None for c in calls if c["policy"] != "base")

    for policy in ("lora-w", "lora-r"):
        first = _adapter(Path(pushed[policy][0]["path"]))
        final = _adapter(run_dir / "final" / policy)
        changed = any(not torch.equal(t, final[k]) for k, t in first.items())
        trained = step[f"{policy}/n_samples"] > 0 and step.get(f"{policy}/skipped") == 0.0
        # moved exactly when its roles' groups had a signal: rewards that varied among samples that differ
        assert changed == trained, _diagnosis(policy, step, changed=changed, trained=trained)
        assert len(pushed[policy]) == 1 + trained  # pushed at the start, and again only after a change
        assert {"loss", "reward_mean", "n_samples"} <= {k.split("/", 1)[1] for k in step
                                                        if k.startswith(f"{policy}/")} or not trained
    assert step["n_samples"] == step["lora-w/n_samples"] + step["lora-r/n_samples"] > 0
    assert step["skipped"] == (0.0 if step["policies_updated"] else 1.0)

    final = run_dir / "final"
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    assert json.loads((final / "policies.json").read_text())["default"] == "lora-r"
    for policy in ("lora-w", "lora-r"):
        assert json.loads((final / policy / "adapter_config.json").read_text())["r"] == 8
    serve_line = [text for _, text in end_lines(report, run_dir) if "serve it" in text]
    assert serve_line and f"spanlab serve --model {final}" in serve_line[0]
    served = serve_config({}, model=str(final))  # what that line starts: the base and every policy's adapter
    assert served.engine.enable_lora and dict(served.engine.lora_modules) == {
        "lora-w": str((final / "lora-w").resolve()), "lora-r": str((final / "lora-r").resolve())}
    assert served.policies is not None and served.policies.roles == {"writer": "lora-w"}
