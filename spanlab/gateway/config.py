"""Gateway settings, validated when built (a bad URL or a zero timeout fails here, not mid-rollout).

``tito`` turns on Token-In Token-Out sessions (docs/tito.md): attributed chat calls are served from one token
buffer per attempt, sent to the engine as token IDs. Off by default: per-call recording is what every
OpenAI-compatible engine supports, TITO needs vLLM's token-in completions and the served model's tokenizer.

``upstream_urls`` puts several engines (replicas of one model) behind the gateway: each attempt is pinned to
one of them (:mod:`spanlab.gateway.routing`, docs/replicas.md); ``upstream_base_url`` is then the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from spanlab.policies.config import PoliciesConfig


class GatewayConfig(BaseModel):
    """Where the engine is and how the gateway talks to it and to the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream_base_url: str = Field(description="the engine, e.g. http://127.0.0.1:8000 (a trailing /v1 is dropped)")
    upstream_urls: tuple[str, ...] = Field(
        default=(), description="several engines serving the same model; default: (upstream_base_url,)"
    )
    health_interval_s: float = Field(default=5.0, ge=0, description="seconds between /health probes of each "
                                     "engine when there are several (0: only failed calls mark one down)")
    health_timeout_s: float = Field(default=5.0, gt=0, description="a probe slower than this counts as failed")
    health_failures: int = Field(default=2, ge=1, description="failed probes in a row that mark an engine down")
    request_timeout_s: float = Field(default=600.0, gt=0, description="read timeout per upstream call; 504 past it")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_upstream_connections: int = Field(default=512, ge=1)
    upstream_keepalive_s: float = Field(
        default=2.0, gt=0, description="how long an idle pooled connection to the engine is kept; below the "
        "engine's own keep-alive (vLLM/uvicorn: 5 s), so the engine never closes one just as a call reuses it")
    flush_interval_s: float = Field(default=0.05, ge=0, description="how long the writer gathers spans per batch")
    max_batch_spans: int = Field(default=512, ge=1)
    close_timeout_s: float = Field(default=30.0, ge=0, description="how long shutdown retries a failing store")
    fallback_path: Path | None = Field(default=None, description="JSONL file for spans the store cannot take")
    attempt_cache_size: int = Field(default=65_536, ge=1, description="known (attempt -> rollout) pairs kept")
    tito: bool = Field(default=False, description="Token-In Token-Out: one token buffer per attempt (docs/tito.md)")
    tokenizer: Path | None = Field(
        default=None,
        description="TITO: the served model's folder (tokenizer + chat template); default: the folder the engine "
        "reports as its model root in /v1/models",
    )
    tito_render: Literal["auto", "engine", "local"] = Field(
        default="auto", description="TITO: the engine's render/generate/derender when it serves them (auto), "
        "always (engine: refuse without them), or the gateway's own renderer and hermes parser (local)")
    tool_call_parser: str | None = Field(default=None, description="the engine's --tool-call-parser, recorded in "
                                         "TITO spans (spanlab serve/train fill it in from the engine config)")
    reasoning_parser: str | None = Field(default=None, description="the engine's --reasoning-parser, recorded")
    tito_max_sessions: int = Field(default=16_384, ge=1, description="TITO buffers kept (least recently used go)")
    max_body_bytes: int | None = Field(
        default=None, ge=1024, description="the largest request body taken (413 above, before the engine is called), "
        "counted as it arrives, chunked or not; default and most: the store's record limit (its max_json_bytes, "
        "16 MiB), so that no call is generated that its record could not hold")
    policies: PoliciesConfig | None = Field(default=None, description="a LoRA policy per agent role: each role's "
                                            "calls go to its policy's adapter (spanlab.gateway.policy_routing)")
    served_models: tuple[str, ...] = Field(default=(), description="the model names the engines serve (spanlab "
                                           "serve fills them in): a call naming another gets the gateway's 404 "
                                           "listing them; empty: not checked (the engine answers)")
    token: SecretStr | None = Field(default=None, description="a bearer token every call must carry (the agents' "
                                    "api_key); the gateway's own, not forwarded to the engine")

    @model_validator(mode="before")
    @classmethod
    def _first_upstream(cls, data: Any) -> Any:
        """With only ``upstream_urls`` given, the first is ``upstream_base_url`` (TITO checks its model)."""
        if isinstance(data, dict) and data.get("upstream_urls") and not data.get("upstream_base_url"):
            data = {**data, "upstream_base_url": next(iter(data["upstream_urls"]))}
        return data

    @field_validator("upstream_base_url")
    @classmethod
    def _normalize_url(cls, v: str) -> str:
        return _normalize(v, "upstream_base_url")

    @field_validator("upstream_urls")
    @classmethod
    def _normalize_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        normalized = tuple(_normalize(v, "upstream_urls") for v in urls)
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"upstream_urls lists an engine twice: {list(normalized)}")
        return normalized

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every engine the gateway forwards to, ``upstream_base_url`` first."""
        return self.upstream_urls or (self.upstream_base_url,)

    @model_validator(mode="after")
    def _tito_options(self) -> GatewayConfig:
        if self.upstream_urls and self.upstream_base_url not in self.upstream_urls:
            raise ValueError(f"upstream_base_url {self.upstream_base_url} is not one of upstream_urls; give only "
                             "upstream_urls")
        if self.tokenizer is not None and not self.tito:
            raise ValueError("tokenizer is only used in TITO mode: set tito=True, or drop tokenizer")
        if self.token is not None and not self.token.get_secret_value():
            raise ValueError("token is empty: give a token, or none")
        if self.tokenizer is not None and self.tito_render == "engine":
            raise ValueError("tokenizer is only read by the gateway's own renderer: set tito_render to local or auto")
        return self


def _normalize(v: str, key: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"{key} must start with http:// or https://, not {v!r}")
    v = v.rstrip("/")
    return v[: -len("/v1")] if v.endswith("/v1") else v
