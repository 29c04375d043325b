"""`spanlab serve` end to end: gateway + store in one process, a recorded call, a clean Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from spanlab.config import parse
from spanlab.engine.config import detect_device
from spanlab.engine.served_folder import serve_command, served_name
from spanlab.errors import ConfigError
from spanlab.serve import ServeConfig, serve_config
from spanlab.store import SpanStore

SPANLAB = str(Path(sys.executable).with_name("spanlab"))


def test_serve_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.prot: unknown key; did you mean port\?"):
        parse(ServeConfig, {"gateway": {"prot": 1}})
    with pytest.raises(ConfigError, match="must differ"):
        parse(ServeConfig, {"gateway": {"port": 9000}, "store_server": {"port": 9000}})
    assert parse(ServeConfig, {}).engine.model  # the embedded default model


def test_serve_model_takes_a_trained_folder_and_this_machines_device(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "runs" / "calc-grpo" / "final"
    final.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = serve_config({}, model="runs/calc-grpo/final", db=Path("x.duckdb"), port=0)
    assert cfg.engine.model == str(final)  # vLLM's cwd cannot matter
    assert cfg.engine.name == "calc-grpo"  # clients ask for the run's name, not the path
    assert cfg.engine.device == detect_device() and cfg.db == Path("x.duckdb") and cfg.gateway.port == 0
    # a config's engine section wins over the command line's defaults, not over its options
    yaml_cfg = {"engine": {"kv_cache_gib": 2, "model": "other"}, "gateway": {"host": "127.0.0.1", "port": 9000}}
    cfg = serve_config(yaml_cfg, model="runs/calc-grpo/final", port=9100)
    assert cfg.engine.device == "cpu" and cfg.engine.kv_cache_gib == 2 and cfg.gateway.port == 9100
    assert serve_config({}, device="gpu").engine.device == "gpu"
    assert serve_config({}, model="Qwen/Qwen3-1.7B").engine.model == "Qwen/Qwen3-1.7B"  # a hub name
    with pytest.raises(ConfigError, match="runs/calc-grpo/fnial: no such folder"):
        serve_config({}, model="runs/calc-grpo/fnial")
    with pytest.raises(ConfigError, match="engine"):
        serve_config({"engine": "gpu"}, model="Qwen/Qwen3-1.7B")
    assert serve_command(Path("runs/my run/final")) == "spanlab serve --model 'runs/my run/final'"


def test_a_trained_folder_is_served_under_its_run_name(tmp_path: Path) -> None:
    """The name comes from the checkpoint info the run wrote, else from the run's folder; never the path."""
    import json

    from spanlab.serve import client_example

    step = tmp_path / "runs" / "calc-grpo" / "step-3"
    step.mkdir(parents=True)
    assert served_name(step) == "calc-grpo-step-3"
    moved = tmp_path / "elsewhere" / "final"
    moved.mkdir(parents=True)
    (moved / "spanlab_checkpoint.json").write_text(json.dumps({"run_name": "calc-grpo", "tag": "final"}))
    assert served_name(moved) == "calc-grpo"  # a moved or renamed folder keeps its name
    assert served_name(tmp_path / "elsewhere") == "elsewhere"  # a plain model folder: its own name
    (moved / "spanlab_checkpoint.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"spanlab_checkpoint\.json is not JSON"):
        serve_config({}, model=str(moved))
    assert 'model="calc-grpo"' in client_example("http://127.0.0.1:8800/v1", "calc-grpo")


def test_serve_model_with_a_policy_per_role_serves_each_adapter_and_routes_the_roles(tmp_path: Path) -> None:
    """A run with ``policies`` leaves ``policies.json`` and an adapter folder per policy in ``final/``: the engine
    serves them all (--lora-modules), the gateway routes each role, spans name the version the run wrote."""
    import json

    from spanlab.engine.config import build_command

    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    (final / "policies.json").write_text(json.dumps({"roles": {"writer": "w", "checker": "c"},
                                                     "lora_per_policy": {"c": {"rank": 16, "alpha": 32}}}))
    (final / "spanlab_checkpoint.json").write_text(json.dumps({"policy_versions": {"w": 3, "c": 1}}))
    with pytest.raises(ConfigError, match=r"no adapter folder .*/c \(named by policies\.json\)"):
        serve_config({}, model=str(final))
    for policy in ("w", "c"):
        (final / policy).mkdir()
        (final / policy / "adapter_config.json").write_text("{}")
    config = serve_config({}, model=str(final))
    engine = config.engine
    assert (engine.enable_lora, engine.max_loras, engine.max_lora_rank) == (True, 2, 16)
    assert config.policies is not None and config.policies.policy_for("checker") == "c"
    assert config.policy_versions == {"w": "w-v3", "c": "c-v1"}
    command = build_command(engine, model_path=str(final), port=8000, python="python")
    flag = command.index("--lora-modules")
    assert sorted(command[flag + 1:flag + 3]) == [f"c={(final / 'c').resolve()}", f"w={(final / 'w').resolve()}"]


@pytest.mark.vllm
def test_serve_records_calls_and_stops_on_ctrl_c(vllm_server, tmp_path: Path) -> None:
    db = tmp_path / "served.duckdb"
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({
        "db": str(db),
        "gateway": {"port": 0, "upstream_url": vllm_server.root_url},
        "store_server": {"port": 0},
    }))
    proc = subprocess.Popen([SPANLAB, "serve", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        base_url = None
        for line in proc.stdout:
            if line.startswith("base URL:"):
                base_url = line.split()[-1]
                break
        assert base_url, proc.stderr.read()
        resp = httpx.post(f"{base_url}/chat/completions", timeout=120, json={
            "model": vllm_server.model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi"}],
        })
        assert resp.status_code == 200, resp.text
        text = resp.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stderr.read()[-2000:]
    with SpanStore(db) as store:
        rows = store.query("SELECT rollout_id, response_len, response_message FROM llm_calls").to_pylist()
    assert len(rows) == 1 and rows[0]["rollout_id"] is None and rows[0]["response_len"] >= 1
    assert text in rows[0]["response_message"]


@pytest.mark.vllm
def test_live_demo_records_every_call_with_its_reward(vllm_server, tmp_path: Path) -> None:
    from spanlab.demo_live import run_live_demo

    db = tmp_path / "live.duckdb"
    summary = run_live_demo(db, n_rollouts=3, upstream=(vllm_server.root_url, vllm_server.model))
    assert "3 LLM calls recorded" in summary
    with SpanStore(db) as store:
        rows = store.query(
            "SELECT r.status, r.final_reward, c.prompt_len, c.response_len, c.response_token_ids "
            "FROM rollout_summary r JOIN llm_calls c ON c.attempt_id = r.last_attempt_id"
        ).to_pylist()
    assert len(rows) == 3
    assert all(r["status"] == "succeeded" and r["final_reward"] in (0.0, 1.0) for r in rows)
    assert all(r["prompt_len"] > 10 and r["response_len"] == len(r["response_token_ids"]) > 0 for r in rows)
