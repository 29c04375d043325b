"""EngineConfig validation and the exact vLLM argv/env for CPU and GPU (no server needed)."""

from __future__ import annotations

import pydantic
import pytest

from spanlab.engine.config import EngineConfig, build_command, build_env


def _cmd(config: EngineConfig) -> list[str]:
    return build_command(config, model_path="/m", port=1234, python="py")


def test_cpu_command_has_cpu_flags_and_tools() -> None:
    cmd = _cmd(EngineConfig(max_model_len=2048))
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in ("--dtype float32", "--enforce-eager", "--no-enable-chunked-prefill", "--max-model-len 2048",
                 "--host 127.0.0.1", "--port 1234", "--served-model-name smollm2-135m-instruct",
                 "--enable-auto-tool-choice", "--tool-call-parser hermes"):
        assert flag in joined
    assert "--enable-lora" not in cmd


def test_cpu_env_sets_kv_cache_threads_and_dev_mode() -> None:
    env = build_env(EngineConfig(kv_cache_gib=2, cpu_threads=1, enable_lora=True, dev_routes=True),
                    model_is_local=True, base={})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_lora_flags() -> None:
    cmd = " ".join(_cmd(EngineConfig(enable_lora=True)))
    assert "--enable-lora --max-lora-rank 8 --max-loras 2" in cmd


def test_gpu_command_has_no_cpu_only_flags() -> None:
    config = EngineConfig(model="Qwen/Qwen3-1.7B", device="gpu", gpu_memory_utilization=0.5)
    cmd = _cmd(config)
    assert "--no-enable-chunked-prefill" not in cmd and "--enforce-eager" not in cmd
    assert cmd[cmd.index("--dtype") + 1] == "auto"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.5"
    env = build_env(config, model_is_local=False, base={})
    assert not any(k.startswith("VLLM_CPU_") for k in env) and "HF_HUB_OFFLINE" not in env


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device": "gpu", "kv_cache_gib": 1},
        {"device": "cpu", "gpu_memory_utilization": 0.9},
        {"extra_args": ("--port", "9")},
        {"extra_args": ("--max-model-len=9",)},
        {"unknown_option": 1},
        {"kv_cache_gib": 0},
    ],
)
def test_invalid_configs_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        EngineConfig(**kwargs)  # type: ignore[arg-type]


def test_extra_args_pass_through() -> None:
    assert _cmd(EngineConfig(extra_args=("--max-num-seqs", "8")))[-2:] == ["--max-num-seqs", "8"]


def test_parsers_and_scale_out_routes_are_engine_settings() -> None:
    """The TITO gateway's engine path needs --enable-scale-out; the parsers are what derender applies."""
    joined = " ".join(_cmd(EngineConfig(tool_call_parser="llama3_json", reasoning_parser="qwen3")))
    assert "--enable-auto-tool-choice --tool-call-parser llama3_json" in joined
    assert "--reasoning-parser qwen3" in joined and "--enable-scale-out" in joined
    bare = _cmd(EngineConfig(tool_call_parser=None, scale_out=False))
    assert not {"--enable-scale-out", "--reasoning-parser", "--tool-call-parser"} & set(bare)
    with pytest.raises(pydantic.ValidationError, match="use the config fields"):
        EngineConfig(extra_args=("--reasoning-parser=qwen3",))


def test_cpu_runs_the_model_in_the_engine_core_process_unless_told_otherwise() -> None:
    config = EngineConfig()
    cmd = _cmd(config)
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    assert build_env(config, model_is_local=True, base={})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    own = EngineConfig(extra_args=("--distributed-executor-backend=mp",))
    assert _cmd(own).count("--distributed-executor-backend") == 0
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in build_env(own, model_is_local=True, base={})
    gpu = EngineConfig(device="gpu")
    assert "--distributed-executor-backend" not in _cmd(gpu)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in build_env(gpu, model_is_local=False, base={})
