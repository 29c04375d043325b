"""Helpers shared by the gateway tests: what an upstream is, and ground-truth calls straight to vLLM."""

from __future__ import annotations

from typing import Any, Protocol

import httpx


class Upstream(Protocol):
    """What the tests need of a vLLM server (the engine's ``vllm_server`` fixture has both)."""

    base_url: str
    model: str


def root_url(upstream: Upstream) -> str:
    url = upstream.base_url.rstrip("/")
    return url.removesuffix("/v1")


def direct(upstream: Upstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same request sent straight to vLLM, asking for token IDs and logprobs: the ground truth."""
    logprobs: bool | int = True if path.endswith("/chat/completions") else 0
    resp = httpx.post(
        root_url(upstream) + path, json={**body, "return_token_ids": True, "logprobs": logprobs}, timeout=120
    )
    resp.raise_for_status()
    return resp.json()


def detokenize(upstream: Upstream, ids: list[int]) -> str:
    resp = httpx.post(root_url(upstream) + "/detokenize", json={"model": upstream.model, "tokens": ids}, timeout=30)
    resp.raise_for_status()
    return resp.json()["prompt"]
