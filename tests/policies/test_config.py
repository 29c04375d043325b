"""``policies:`` in a train config: roles -> LoRA policies, validated before anything starts, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.policies.config import PoliciesConfig, engine_lora_settings
from spanlab.serve import serve_config


def test_roles_map_to_policies_and_several_roles_share_one() -> None:
    config = PoliciesConfig(roles={"writer": "lora-a", "checker": "lora-b", "rewriter": "lora-a"})
    assert config.names == ("lora-a", "lora-b")
    assert config.policy_for("rewriter") == "lora-a"
    assert config.policy_for("judge") is None and config.policy_for(None) is None  # the base model answers
    assert config.roles_of("lora-a") == ("rewriter", "writer")
    with_default = config.model_copy(update={"default": "lora-c"})
    assert with_default.policy_for("judge") == "lora-c" and with_default.names == ("lora-a", "lora-b", "lora-c")


def test_lora_settings_are_shared_unless_a_policy_has_its_own() -> None:
    config = PoliciesConfig(roles={"writer": "a", "checker": "b"}, lora={"rank": 4},
                            lora_per_policy={"b": {"rank": 16, "alpha": 32}})
    assert config.lora_for("a").rank == 4 and config.lora_for("b").alpha == 32
    assert config.engine_lora() == (2, 16)  # a slot per policy, the smallest vLLM rank holding 16
    assert PoliciesConfig(roles={"w": "a"}, lora={"rank": 2}).engine_lora() == (1, 8)


def test_no_policies_keeps_one_policy_for_every_role() -> None:
    config = parse_train_config({})
    assert config.policies is None and not config.engine.enable_lora


def test_policies_turn_lora_serving_on_with_a_slot_per_policy() -> None:
    config = parse_train_config({"policies": {"roles": {"w": "a", "c": "b", "r": "c"}, "lora": {"rank": 12}}})
    assert config.engine.enable_lora and config.engine.max_loras == 3 and config.engine.max_lora_rank == 16
    running = parse_train_config({"engine_url": "http://127.0.0.1:9", "policies": {"roles": {"w": "a"}}})
    assert not running.engine.enable_lora  # a running engine is the operator's; it must have been started so


def test_train_and_serve_give_the_engine_the_same_lora_settings(tmp_path: Path) -> None:
    """One merge (``engine_lora_settings``) for the engine ``spanlab train`` starts and the one ``spanlab serve``
    starts on the run's folder: a slot per policy and a rank holding the largest, unless the engine asks for more."""
    policies = {"roles": {"w": "a", "c": "b", "r": "c"}, "lora": {"rank": 12}}
    config = PoliciesConfig.model_validate(policies)
    assert engine_lora_settings(config) == {"enable_lora": True, "max_loras": 3, "max_lora_rank": 16}
    assert engine_lora_settings(config, 4, 32) == {"enable_lora": True, "max_loras": 4, "max_lora_rank": 32}
    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "policies.json").write_text(json.dumps(policies))
    for policy in config.names:
        (folder / policy).mkdir()
        (folder / policy / "adapter_config.json").write_text("{}")
    for engine, expected in (({}, (3, 16)), ({"max_loras": 5, "max_lora_rank": 64}, (5, 64)),
                             ({"max_loras": 1, "max_lora_rank": 8}, (3, 16))):
        trained = parse_train_config({"engine": engine, "policies": policies}).engine
        served = serve_config({"engine": engine}, model=str(folder)).engine
        for got in (trained, served):
            assert (got.enable_lora, got.max_loras, got.max_lora_rank) == (True, *expected), (engine, got)


@pytest.mark.parametrize(("policies", "expected"), [
    ({"writer": "lora-a"}, "put the role -> policy map under roles, e.g. policies: {roles: {writer: lora-a}}"),
    ({"roles": {}}, "roles: Dictionary should have at least 1 item"),
    ({"roles": {"writer": "lora a"}}, "role 'writer': policy 'lora a': use 1-64 letters"),
    ({"roles": {"writer": "lora.a"}}, "policy 'lora.a': use 1-64 letters, digits, '_', '-'"),
    ({"roles": {"bad/role": "a"}}, "role 'bad/role': use 1-64 letters"),
    ({"roles": {"writer": "base"}}, "'base' names the base model in spans"),
    ({"roles": {"writer": "a"}, "lora_per_policy": {"b": {"rank": 4}}}, "lora_per_policy: 'b' is not a policy"),
    ({"roles": {"writer": "a"}, "lora": {"rank": 1024}}, "LoRA rank 1024 is above the largest vLLM serves"),
    ({"roles": {"writer": "a"}, "lora": {"rnak": 4}}, "policies.lora.rnak: unknown key; did you mean rank?"),
])
def test_bad_policies_are_one_line_naming_the_problem(policies: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_train_config({"policies": policies})
    message = str(err.value)
    assert "\n" not in message and expected in message, message


def test_a_role_outside_the_trained_agents_is_refused() -> None:
    with pytest.raises(ConfigError, match="role 'checker' is not one of agents"):
        parse_train_config({"agents": ["writer"], "policies": {"roles": {"writer": "a", "checker": "b"}}})


SYNC = {"policies": {"roles": {"writer": "a", "checker": "b"}}, "agent": {"name": "sql"}}


def test_spanlab_train_checks_a_grpo_sync_config_with_policies() -> None:
    from spanlab.jobs.job import check_job

    algorithm, _, _ = check_job(parse_train_config(dict(SYNC)))
    assert algorithm.trains_policies


@pytest.mark.parametrize(("extra", "expected"), [
    ({"loop": {"mode": "async"}}, "policies: the async loop trains one policy"),
    ({"trainer": {"processes": 2}}, "policies: a policy per role trains in one process"),
    ({"grpo": {"lora": {"rank": 8}}}, "grpo.lora: with policies each policy is a LoRA adapter"),
    ({"grpo": {"kl_beta": 0.1}}, "grpo.kl_beta: the KL term's reference model is not kept per policy"),
    ({"algorithm": "sft"}, "policies: algorithm 'sft' trains one policy for every role"),
    ({"algorithm": "apo"}, "policies: algorithm 'apo' trains one policy for every role"),
])
def test_what_the_policies_loop_does_not_run_is_refused_in_one_line(extra: dict, expected: str) -> None:
    from spanlab.jobs.job import check_job

    with pytest.raises(ConfigError) as err:
        check_job(parse_train_config(SYNC | extra))
    assert "\n" not in str(err.value) and expected in str(err.value), str(err.value)


def test_resuming_a_run_with_policies_is_refused_in_one_line() -> None:
    from spanlab.jobs.checkpoints import check_resumable
    from spanlab.jobs.job import build_algorithm

    config = parse_train_config(dict(SYNC))
    with pytest.raises(ConfigError, match=r"^--resume: a run with policies saves no state per policy; it cannot "
                                          r"resume$"):
        check_resumable(build_algorithm(config), config)


def test_the_sql_tutorials_policies_config_passes_the_checks() -> None:
    """tutorials/sql/policies.yaml: writer, checker and rewriter each with its own LoRA, every role trained."""
    from pathlib import Path

    from spanlab.jobs.config import load_train_config
    from spanlab.jobs.job import check_job

    config = load_train_config(Path(__file__).resolve().parents[2] / "tutorials" / "sql" / "policies.yaml")
    check_job(config)
    assert config.policies is not None and config.policies.names == ("checker", "rewriter", "writer")
    assert config.engine.enable_lora and config.engine.max_loras >= 3
    credit = config.resolved()["grpo"]["credit"]
    assert credit == {"mode": "per_turn", "discount": 0.5, "scope": "role", "normalize": None}


def test_the_sql_tutorials_shared_control_differs_from_policies_yaml_only_in_policy_and_credit() -> None:
    """tutorials/sql/policies_shared.yaml is the control arm: one adapter for every role, the final reward
    broadcast; everything else (start, budget, LoRA settings, evaluation) as in policies.yaml."""
    from pathlib import Path

    from spanlab.jobs.config import load_train_config

    folder = Path(__file__).resolve().parents[2] / "tutorials" / "sql"
    per_role, shared = (load_train_config(folder / f).resolved() for f in ("policies.yaml", "policies_shared.yaml"))
    assert shared["policies"]["roles"] == {"writer": "shared", "checker": "shared", "rewriter": "shared"}
    assert shared["grpo"]["credit"]["mode"] == "broadcast" and per_role["grpo"]["credit"]["mode"] == "per_turn"
    differ = {k for k in per_role.keys() | shared.keys() if per_role.get(k) != shared.get(k)}
    assert differ == {"run_name", "db", "policies", "grpo", "engine"}
    for section in ("policies", "grpo"):
        differ = {k for k in per_role[section] if per_role[section][k] != shared[section][k]}
        assert differ == {"roles" if section == "policies" else "credit"}, (section, differ)
    engine_differ = {k for k in per_role["engine"] if per_role["engine"][k] != shared["engine"][k]}
    assert engine_differ <= {"max_loras", "lora_modules"}, engine_differ
