"""The gateway's role -> policy routing, without an engine: which model a call is sent to, which version it records."""

from __future__ import annotations

import pytest

from spanlab.gateway.policy_routing import PolicyRouter
from spanlab.policies.config import PoliciesConfig


def test_a_role_goes_to_its_policy_and_the_rest_to_the_base_or_the_default() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a", "checker": "lora-b"}))
    body = {"model": "smollm2", "prompt": "hi"}
    writer = router.route("writer")
    assert (writer.policy, writer.version, writer.body_for(body)) == ("lora-a", None, {**body, "model": "lora-a"})
    assert body["model"] == "smollm2"  # the agent's body is left as it was
    for role in ("judge", None):
        base = router.route(role)
        assert (base.policy, base.body_for(body)) == ("base", body)
    router.set_version("lora-a", "lora-a-v3")
    assert router.route("writer").version == "lora-a-v3" and router.route("checker").version is None

    with_default = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}, default="lora-c"))
    assert with_default.route("judge").policy == with_default.route(None).policy == "lora-c"


def test_a_version_of_an_unknown_policy_is_refused() -> None:
    router = PolicyRouter(PoliciesConfig(roles={"writer": "lora-a"}))
    with pytest.raises(KeyError, match="'lora-z' is not one of the gateway's policies"):
        router.set_version("lora-z", "v1")
