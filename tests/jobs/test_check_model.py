"""``spanlab train --check`` refuses, in one line and before anything starts, configs that are valid key by key but
would fail later or train something else (issue 53, item 4): LoRA target modules the model has no layer of,
roles the agent never calls with, and booleans or strings where an integer or a boolean belongs.

The real CLI in-process; the model is a tiny Llama ``config.json`` in a temporary folder (its module names come
from a meta-device model built from it, so its weights file is an empty placeholder).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 512}
SQL = "algorithm: grpo\nagent: {name: sql}\n"
CALC = "algorithm: grpo\nagent: {name: calc}\n"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    (folder / "model.safetensors").write_bytes(b"")  # a folder with no weights is refused (engine.model)
    return folder


def _check(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    path.write_text(text + f"db: {tmp_path}/run.duckdb\nout_dir: {tmp_path}/runs\n")
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    return result.exit_code, " ".join(result.output.split())


def _refused(tmp_path: Path, text: str, message: str) -> None:
    code, output = _check(tmp_path, text)
    assert code == 2 and output.startswith("error:") and "Traceback" not in output, output
    assert re.search(message, output), output
    assert not (tmp_path / "runs").exists()


LORA_BAD = {
    "a name the model lacks": ("policies: {roles: {writer: a}, lora: {target_modules: [no_such_proj]}}",
                               r"policies\.lora\.target_modules: 'no_such_proj' names no layer of the model "
                               r"\(its layers: down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj"),
    "one good name, one bad": ("policies: {roles: {writer: a}, lora: {target_modules: [q_proj, no_such_proj]}}",
                               r"policies\.lora\.target_modules: 'no_such_proj' names no layer"),
    "a policy's own": ("policies: {roles: {writer: a, checker: b}, lora_per_policy: {b: {target_modules: [qproj]}}}",
                       r"policies\.lora_per_policy\.b\.target_modules: 'qproj' names no layer"),
    "grpo's own": ("grpo: {lora: {target_modules: [q_proj, no_such_proj]}}",
                   r"grpo\.lora\.target_modules: 'no_such_proj' names no layer"),
    "a block, not a layer": ("grpo: {lora: {target_modules: [mlp]}}",
                             r"grpo\.lora\.target_modules: 'mlp' names model\.layers\.0\.mlp \(LlamaMLP\), which is "
                             "not a layer LoRA can adapt"),
    "empty, policies": ("policies: {roles: {writer: a}, lora: {target_modules: []}}",
                        r"policies\.lora\.target_modules: .*is empty"),
    "empty, grpo": ("grpo: {lora: {target_modules: []}}", r"grpo\.lora\.target_modules: .*is empty"),
}


@pytest.mark.parametrize("case", list(LORA_BAD), ids=list(LORA_BAD))
def test_lora_target_modules_must_name_layers_of_the_model(tmp_path: Path, model: Path, case: str) -> None:
    lora, message = LORA_BAD[case]
    _refused(tmp_path, f"{SQL}engine: {{model: {model}}}\n{lora}\n", message)


def test_target_modules_the_model_has_pass_as_names_or_dotted_suffixes(tmp_path: Path, model: Path) -> None:
    for lora in ("policies: {roles: {writer: a}, lora: {target_modules: [q_proj, self_attn.v_proj, down_proj]}}",
                 "grpo: {lora: {target_modules: [q_proj, v_proj]}}"):
        code, output = _check(tmp_path, f"{SQL}engine: {{model: {model}}}\n{lora}\n")
        assert code == 0 and "nothing started" in output, output


def test_a_model_whose_config_cannot_be_read_here_is_left_to_peft_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A hub name not in the local cache (no network here): the check says it could not run, and does not refuse."""
    with caplog.at_level(logging.WARNING, logger="spanlab.jobs.model_checks"):
        code, output = _check(tmp_path, f"{SQL}engine: {{model: nobody/no-such-model}}\n"
                                        "grpo: {lora: {target_modules: [q_proj]}}\n")
    assert code == 0, output
    assert "cannot read the config of nobody/no-such-model to check LoRA target_modules" in caplog.text


ROLES_BAD = {
    "agents, sql": (f"{SQL}agents: [writer, ghost]\n",
                    r"agents: 'ghost' is not a role of agent 'sql' \(its roles: writer, checker, rewriter\), so no "
                    "call would ever be trained"),
    "agents, sql without the checker": ("algorithm: grpo\nagent: {name: sql, kwargs: {roles: [writer]}}\n"
                                        "agents: [checker]\n", r"agents: 'checker' is not a role of agent 'sql' "
                                        r"\(its roles: writer\)"),
    "agents, calc": (f"{CALC}agents: [writer]\n",
                     r"agents: 'writer' is not a role of agent 'calc' \(its calls name no role\)"),
    "policies, no agents": (f"{SQL}policies: {{roles: {{writer: a, ghost: b}}}}\n",
                            r"policies\.roles: 'ghost' is not a role of agent 'sql' .*its policy would never answer"),
}


@pytest.mark.parametrize("case", list(ROLES_BAD), ids=list(ROLES_BAD))
def test_roles_must_be_roles_the_agent_calls_with(tmp_path: Path, case: str) -> None:
    text, message = ROLES_BAD[case]
    _refused(tmp_path, text, message)


STRICT_BAD = {
    "steps: true": ("grpo: {steps: true}", r"grpo\.steps: expects an integer, not true"),
    "steps: '3'": ("grpo: {steps: '3'}", r"grpo\.steps: expects an integer, not '3'"),
    "steps: 3.0": ("grpo: {steps: 3.0}", r"grpo\.steps: expects an integer, not 3\.0"),
    "rank: false": ("grpo: {lora: {rank: false}}", r"grpo\.lora\.rank: expects an integer, not false"),
    "tito: 1": ("tito: 1", r"tito: expects true or false, not 1"),
    "eval.base: 'no'": ("eval: {base: 'no'}", r"eval\.base: expects true or false, not 'no'"),
    "temperature: true": ("rollouts: {temperature: true}", r"rollouts\.temperature: expects a number, not true"),
    "a level: true": ("dataset: {levels: [1, true]}", r"dataset\.levels\[1\]: expects an integer, not true"),
}


@pytest.mark.parametrize("case", list(STRICT_BAD), ids=list(STRICT_BAD))
def test_booleans_and_integers_are_strict(tmp_path: Path, case: str) -> None:
    text, message = STRICT_BAD[case]
    _refused(tmp_path, f"{CALC}{text}\n", message)


def test_numbers_written_as_yaml_writes_them_still_pass(tmp_path: Path) -> None:
    """An integer where a float belongs, ``1.0e-4``, and ``1e-4`` (a string to YAML 1.1) keep working."""
    code, output = _check(tmp_path, f"{CALC}grpo: {{lr: 1e-4, steps: 2, max_grad_norm: 1}}\n"
                                    "rollouts: {temperature: 1}\nwarm_start: {lr: 1.0e-4, epochs: 1}\ntito: false\n")
    assert code == 0, output
    for expected in ("lr: 0.0001", "temperature: 1.0", "steps: 2", "tito: false"):
        assert expected in output, (expected, output)
