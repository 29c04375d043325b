"""``warm_start.role_demos: mined`` end to end on the session's real vLLM: the SQL agent, a policy per role.

The writer's adapter is warm-started on its generated demonstrations, the job runs a few train tasks, mines the
checker's and the rewriter's demonstrations from what the real model wrote, stores them, and warm-starts the
other adapter (``default``, the checker's and the rewriter's; the session server has two LoRA slots) on those
only. The base weights stay as they were. The same rollouts are then mined again from the run's store file and
over the store server: both kinds give the same demonstrations, and each checker demonstration's prompt is the
request the live agent sent the checker for that draft, as the gateway recorded it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spanlab.adapters.recorded_rollouts import read_rollouts
from spanlab.agents.sql.mining import mine_demonstrations
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.policies.serving import resource_name
from spanlab.store import SpanStore, StoreClient
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer
from tests.jobs.quick_runs import SQL_POLICIES
from tests.stores import TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

def _config(engine: str, tmp_path: Path) -> dict:
    return {
        "algorithm": "grpo", "run_name": "sql-mined", "engine_url": engine, "out_dir": str(tmp_path / "runs"),
        "db": str(tmp_path / "run.duckdb"), "engine": {"model": "smollm2-135m-instruct", "max_model_len": 2048},
        "agent": {"name": "sql", "kwargs": {"temperature": 1.0, "max_tokens": 48, "rounds": 1,
                                            "roles": ["writer", "checker", "rewriter"]}},
        "policies": SQL_POLICIES,
        "dataset": {"name": "sql", "seed": 0, "levels": [1]},
        "eval": {"split": "test", "tasks": 1, "temperature": 0.0, "base": False},
        "warm_start": {"demos": 4, "epochs": 1, "lr": 1.0e-3, "batch_size": 4, "role_demos": "mined",
                       "mine_tasks": 6},
        "grpo": {"steps": 1, "tasks_per_step": 1, "group_size": 2, "lr": 1.0e-3, "micro_batch_tokens": 2048},
        "rollouts": {"concurrency": 6},
    }


def _adapter(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / "adapter_model.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_policy_is_warm_started_on_its_own_roles_mined_demonstrations(
        tmp_path: Path, policies_engine: str, default_model_dir: Path) -> None:
    config = parse_train_config(_config(policies_engine, tmp_path))
    report = run_job(config)
    assert report.warm_start is not None
    ws = report.warm_start
    assert ws["generated/lora-w/sft_steps"] == 1 and not any(k.startswith("generated/lora-r") for k in ws)
    assert ws["roles/lora-r/sft_steps"] >= 1 and not any(k.startswith("roles/lora-w") for k in ws)
    assert ws["mined/mine_rollouts"] == 6

    with SpanStore(config.db) as store:
        demos = store.query("SELECT attributes->>'source' AS source, attributes->>'role' AS role, "
                            "attributes->>'label' AS label, count(*) AS n FROM spans WHERE kind = 'demonstration' "
                            "GROUP BY ALL").to_pylist()
        mine_ids = [r.rollout_id for r in store.rollout_summaries(metadata={"purpose": "mine_role_demos"})]
        pushed = {p: [r.payload for r in store.list_resources(resource_name(p))] for p in ("lora-w", "lora-r")}
        writer_calls = store.query(
            "SELECT DISTINCT attributes->>'policy' AS policy, attributes->>'policy_version' AS version FROM spans "
            f"WHERE kind = 'llm_call' AND attributes->>'agent' = 'writer' AND rollout_id IN "
            f"({', '.join(repr(i) for i in mine_ids)})").to_pylist()
    counts = {(d["source"], d["role"], d["label"]): d["n"] for d in demos}
    assert counts[("warm_start", None, None)] == 4  # the writer's generated demonstrations
    checker_ok = sum(n for (s, _, label), n in counts.items() if s == "warm_start.checker" and label != "WRONG")
    assert checker_ok == counts[("warm_start.checker", "checker", "WRONG")] > 0  # balanced
    assert sum(n for (s, _, _), n in counts.items() if s == "warm_start.rewriter") > 0
    assert len(mine_ids) == 6
    # the mining rollouts' writer ran on its warm-started adapter (its second version)
    assert writer_calls == [{"policy": "lora-w", "version": pushed["lora-w"][1]["tag"]}]

    # each adapter moved in its own stage only: lora-w on the writer's demos, lora-r on the mined ones
    w1, w2 = (_adapter(p["path"]) for p in pushed["lora-w"][:2])
    r1, r2 = (_adapter(p["path"]) for p in pushed["lora-r"][:2])
    assert not _same(w1, w2) and not _same(r1, r2)
    assert pushed["lora-r"][1]["tag"] != pushed["lora-r"][0]["tag"]
    # the base weights are the model's own: a per-role warm start trains adapters only
    base = load_file(str(config.run_dir / "final" / "model.safetensors"))
    original = load_file(str(default_model_dir / "model.safetensors"))
    assert all(torch.equal(base[k], original[k]) for k in original if k in base) and set(base) & set(original)
    assert json.loads((config.run_dir / "final" / "policies.json").read_text())["default"] == "lora-r"

    # the same rollouts mined on both store kinds give the same demonstrations
    with SpanStore(config.db) as store:
        from_file = mine_demonstrations(read_rollouts(store, mine_ids))
        with ThreadedServer(create_store_app(store, token=TOKEN), name="store server") as server, \
                StoreClient(server.url, token=TOKEN, retry_for_s=5) as client:
            over_http = mine_demonstrations(read_rollouts(client, mine_ids))
        checker_requests = [
            [{"role": m["role"], "content": m["content"]} for m in span.llm.request_messages]
            for span in store.iter_spans(rollout_ids=mine_ids, kinds=["llm_call"])
            if span.attributes.get("agent") == "checker" and span.llm is not None]
    assert [(d.role, d.label, d.messages) for d in from_file] == [(d.role, d.label, d.messages) for d in over_http]
    recorded = [d for d in from_file if d.role == "checker" and d.label != "OK_gold"]
    assert recorded and all(d.messages[:2] in checker_requests for d in recorded)
