"""APO's parts without a model: config validation, POML extraction, prompt versions, intervals."""

from __future__ import annotations

import pytest

from spanlab.algos.apo.config import OptimizerConfig
from spanlab.algos.apo.optimizer import Optimizer, extract_poml
from spanlab.algos.apo.rollouts import PromptBank, agent_key
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.stats import bootstrap, paired_difference
from spanlab.store import SpanStore

T = "<poml><human-msg>{{ request }}</human-msg></poml>"


def test_apo_config_is_validated_with_the_key_named() -> None:
    config = parse_train_config({"algorithm": "apo", "apo": {"beam_width": 3, "optimizer": {"edit_model": "e"}}})
    assert config.section.beam_width == 3 and config.section.optimizer.edit_model == "e"
    with pytest.raises(ConfigError, match=r"apo\.beam"):
        parse_train_config({"algorithm": "apo", "apo": {"beam": 3}})
    with pytest.raises(ConfigError, match=r"apo\.branch_factor"):
        parse_train_config({"algorithm": "apo", "apo": {"branch_factor": 0}})
    with pytest.raises(ConfigError, match="critique_examples cannot exceed gradient_tasks"):
        parse_train_config({"algorithm": "apo", "apo": {"gradient_tasks": 2, "critique_examples": 3}})
    with pytest.raises(ConfigError, match="not both"):
        parse_train_config({"algorithm": "apo", "apo": {"optimizer": {"base_url": "http://x/v1", "base_url_env": "X"}}})


def test_optimizer_endpoint_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = OptimizerConfig(base_url_env="APO_TEST_URL", api_key_env="APO_TEST_KEY")
    monkeypatch.delenv("APO_TEST_URL", raising=False)
    with pytest.raises(ConfigError, match="APO_TEST_URL is not set"):
        Optimizer(config, default_base_url="http://engine/v1", default_model="m")
    monkeypatch.setenv("APO_TEST_URL", "http://vendor.example/v1")
    monkeypatch.setenv("APO_TEST_KEY", "sk-test")
    opt = Optimizer(config, default_base_url="http://engine/v1", default_model="m")
    assert str(opt.client.base_url).startswith("http://vendor.example/v1") and opt.client.api_key == "sk-test"
    assert (opt.critique_model, opt.edit_model) == ("m", "m")
    opt.close()


@pytest.mark.parametrize(("answer", "expected"), [
    (f"Sure!\n```poml\n{T}\n```\nDone.", T),
    (f"```xml\n{T}\n```", T),
    (f"```\n{T}\n```", T),
    (f"Here: {T} hope it helps", T),
    ("  no template at all ", "no template at all"),
])
def test_extract_poml(answer: str, expected: str) -> None:
    assert extract_poml(answer) == expected


def test_prompt_versions_are_deduplicated_by_text_across_runs(file_store: SpanStore) -> None:
    bank = PromptBank(file_store)
    assert bank.version_of(T, origin="start") == (1, True)
    assert bank.version_of(T + "\n") == (2, True)
    assert bank.version_of(T) == (1, False)
    again = PromptBank(file_store)  # a later run on the same store
    assert again.version_of(T + "\n") == (2, False) and again.ref(2) == "prompt@2"
    (first, _) = file_store.list_resources("prompt")
    assert first.kind == "prompt_template" and first.payload["origin"] == "start"


def test_agent_key_changes_with_the_agent_settings() -> None:
    assert agent_key("rooms", {"model": "m", "temperature": 0.0}) == agent_key("rooms", {"temperature": 0.0,
                                                                                        "model": "m"})
    assert agent_key("rooms", {"model": "m", "temperature": 0.0}) != agent_key("rooms", {"model": "m",
                                                                                        "temperature": 1.0})


def test_bootstrap_intervals() -> None:
    iv = bootstrap([0.0, 1.0, 0.5, 1.0, 0.0, 1.0], seed=3)
    assert iv == bootstrap([0.0, 1.0, 0.5, 1.0, 0.0, 1.0], seed=3)  # seeded: deterministic
    assert iv.low < iv.mean < iv.high and iv.n == 6 and iv.mean == pytest.approx(0.5833, abs=1e-4)
    assert iv.low >= 0.0 and iv.high <= 1.0
    assert bootstrap([0.7]).low == 0.7
    same = paired_difference([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference([1.0], [1.0, 0.0])


def test_demos_pool_enlarges_the_train_tasks_drawn() -> None:
    """``demos.pool_tasks`` more train tasks can only be run if the job drew them for the train split."""
    from spanlab.jobs.job import build_algorithm

    plain = {"algorithm": "apo", "dataset": {"name": "rooms"}, "apo": {"gradient_tasks": 4}}
    assert build_algorithm(parse_train_config(plain)).train_tasks() == 8
    with_pool = {**plain, "apo": {"gradient_tasks": 4, "demos": {"pool_tasks": 40}}}
    assert build_algorithm(parse_train_config(with_pool)).train_tasks() == 40
