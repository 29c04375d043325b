"""The gateway's role -> policy routing, without an engine: which model a call is sent to, which version it records."""

from __future__ import annotations

import pytest

from spanlab.gateway.policy_routing import PolicyRouter
from spanlab.policies.config import PoliciesConfig


def test_a_role_goes_to_its_policy_and_the_rest_to_the_base_or_the_default() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a", "checker": "lora-b"}))
    router.set_version("lora-a", "lora-a-v1")
    router.set_version("lora-b", "lora-b-v1")
    body = {"model": "smollm2", "prompt": "hi"}
    writer = router.route("writer")
    assert (writer.policy, writer.version, writer.body_for(body)) == ("lora-a", "lora-a-v1",
                                                                     {**body, "model": "lora-a"})
    assert body["model"] == "smollm2"  # the agent's body is left as it was
    for role in ("judge", None):
        base = router.route(role)
        assert (base.policy, base.body_for(body)) == ("base", body)
    router.set_version("lora-a", "lora-a-v3")
    assert router.route("writer").version == "lora-a-v3" and router.route("checker").version == "lora-b-v1"

    with_default = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}, default="lora-c"))
    with_default.set_version("lora-c", "lora-c-v1")
    assert with_default.route("judge").policy == with_default.route(None).policy == "lora-c"


def test_a_policy_no_engine_serves_yet_answers_as_the_base_model() -> None:
    """Before its first push (a job's base evaluation and warm start) the engine knows no adapter of that name."""
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}, default="lora-c"))
    body = {"model": "smollm2"}
    for role in ("writer", "judge", None):
        route = router.route(role)
        assert (route.policy, route.version, route.body_for(body)) == ("base", None, body)
    router.set_version("lora-a", "lora-a-v1")
    assert router.route("writer").policy == "lora-a" and router.route("judge").policy == "base"


def test_a_version_of_an_unknown_policy_is_refused() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}))
    with pytest.raises(KeyError, match="'lora-z' is not one of the gateway's policies"):
        router.set_version("lora-z", "v1")
