"""The recording gateway: an OpenAI-compatible proxy in front of vLLM that stores exact token IDs.

Agents keep their OpenAI client and point ``base_url`` at the gateway; each call comes back as an
ordinary OpenAI response and is stored as an ``llm_call`` span with the prompt and sampled token IDs
and logprobs vLLM returned. See docs/gateway.md.
"""

from spanlab.gateway.app import GatewayServer, create_app
from spanlab.gateway.attribution import ATTEMPT_HEADER, ROLLOUT_HEADER
from spanlab.gateway.config import GatewayConfig
from spanlab.gateway.proxy import SPAN_IDS_HEADER, Gateway
from spanlab.gateway.writer import SpanWriter

__all__ = [
    "ATTEMPT_HEADER",
    "ROLLOUT_HEADER",
    "SPAN_IDS_HEADER",
    "Gateway",
    "GatewayConfig",
    "GatewayServer",
    "SpanWriter",
    "create_app",
]
