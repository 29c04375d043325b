"""Gateway settings, validated when built (a bad URL or a zero timeout fails here, not mid-rollout).

``tito`` turns on Token-In Token-Out sessions (docs/tito.md): attributed chat calls are served from one token
buffer per attempt, sent to the engine as token IDs. Off by default: per-call recording is what every
OpenAI-compatible engine supports, TITO needs vLLM's token-in completions and the served model's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class GatewayConfig(BaseModel):
    """Where the engine is and how the gateway talks to it and to the store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream_base_url: str = Field(description="the engine, e.g. http://127.0.0.1:8000 (a trailing /v1 is dropped)")
    request_timeout_s: float = Field(default=600.0, gt=0, description="read timeout per upstream call; 504 past it")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    max_upstream_connections: int = Field(default=512, ge=1)
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
    tito_max_sessions: int = Field(default=16_384, ge=1, description="TITO buffers kept (least recently used go)")

    @field_validator("upstream_base_url")
    @classmethod
    def _normalize_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"upstream_base_url must start with http:// or https://, not {v!r}")
        v = v.rstrip("/")
        return v[: -len("/v1")] if v.endswith("/v1") else v

    @model_validator(mode="after")
    def _tito_options(self) -> GatewayConfig:
        if self.tokenizer is not None and not self.tito:
            raise ValueError("tokenizer is only used in TITO mode: set tito=True, or drop tokenizer")
        return self
