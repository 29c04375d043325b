"""The gateway's role -> policy routing, without an engine: which model a call is sent to, which version it records."""

from __future__ import annotations

import pytest

from spanlab.gateway.policy_routing import PolicyRouter, base_model_of
from spanlab.policies.config import PoliciesConfig


def test_a_role_goes_to_its_policy_and_the_rest_to_the_base_or_the_default() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a", "checker": "lora-b"}))
    router.set_version("lora-a", "lora-a-v1")
    router.set_version("lora-b", "lora-b-v1")
    writer = router.route("writer")
    assert (writer.policy, writer.version, writer.model("smollm2")) == ("lora-a", "lora-a-v1", "lora-a")
    for role in ("judge", None):
        base = router.route(role)
        assert (base.policy, base.model("smollm2")) == ("base", "smollm2")
    router.set_version("lora-a", "lora-a-v3")
    assert router.route("writer").version == "lora-a-v3" and router.route("checker").version == "lora-b-v1"

    with_default = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}, default="lora-c"))
    with_default.set_version("lora-c", "lora-c-v1")
    assert with_default.route("judge").policy == with_default.route(None).policy == "lora-c"


def test_a_policy_no_engine_serves_yet_answers_as_the_base_model() -> None:
    """Before its first push (a job's base evaluation and warm start) the engine knows no adapter of that name."""
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}, default="lora-c"))
    for role in ("writer", "judge", None):
        route = router.route(role)
        assert (route.policy, route.version, route.model("smollm2")) == ("base", None, "smollm2")
    router.set_version("lora-a", "lora-a-v1")
    assert router.route("writer").policy == "lora-a" and router.route("judge").policy == "base"


def test_a_version_of_an_unknown_policy_is_refused() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}))
    with pytest.raises(KeyError, match="'lora-z' is not one of the gateway's policies"):
        router.set_version("lora-z", "v1")


def test_the_base_model_is_the_served_model_with_no_parent() -> None:
    """vLLM's /v1/models lists each LoRA adapter with its base as ``parent``; the base is the one without."""
    listing = (b'{"object":"list","data":[{"id":"lora-a","root":"/a","parent":"smollm2"},'
               b'{"id":"smollm2","root":"/m","parent":null},{"id":"lora-b","root":"/b","parent":"smollm2"}]}')
    assert base_model_of(200, listing, "http://e") == "smollm2"
    for status, raw in [(200, b'{"data":[{"id":"lora-a","parent":"smollm2"}]}'), (200, b"[]"), (200, b"not json"),
                        (404, b'{"data":[{"id":"smollm2"}]}')]:
        with pytest.raises(ValueError, match="the engine at http://e names no base model in /v1/models"):
            base_model_of(status, raw, "http://e")
