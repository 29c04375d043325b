"""Default model conversion (GGUF -> HF folder), its crash safety, and resolve_model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spanlab.engine import model as model_mod
from spanlab.engine.model import (
    DEFAULT_MODEL_ALIASES,
    MARKER_FILE,
    ensure_default_model,
    is_converted,
    locate_gguf,
    resolve_model,
)


def test_locate_gguf_finds_wheel_file() -> None:
    path = locate_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_resolve_model_passes_other_names_through(tmp_path: Path) -> None:
    assert resolve_model("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert resolve_model(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("alias", sorted(DEFAULT_MODEL_ALIASES))
def test_resolve_model_default_aliases_give_converted_folder(alias: str, default_model_dir: Path) -> None:
    assert resolve_model(alias) == str(default_model_dir)


def test_converted_folder_is_plain_hf_with_fixed_tokenizer(default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == 2
    marker = json.loads((default_model_dir / MARKER_FILE).read_text())
    assert marker["verify_max_abs_logit_diff"] == 0.0
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    pre = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]
    assert [p["type"] for p in pre["pretokenizers"]] == ["Digits", "ByteLevel"]
    assert pre["pretokenizers"][0]["individual_digits"] is True
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    ids = tok("2024 is 12 + 30")["input_ids"]
    assert ids[0] != tok.bos_token_id  # add_bos_token is false
    assert tok.convert_ids_to_tokens(ids[:4]) == ["2", "0", "2", "4"]  # individual digits


def _fake_convert(gguf_path: Path, out_dir: Path, template: str) -> float:
    (out_dir / "config.json").write_text("{}")
    return 0.0


def test_conversion_is_atomic_and_cleans_stale_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "models" / "smollm2-135m-instruct"
    target.parent.mkdir(parents=True)
    stale = target.parent / ".smollm2-135m-instruct.tmp-999-deadbeef"  # left by a killed conversion
    stale.mkdir()
    (stale / "model.safetensors").write_text("half")

    def boom(gguf_path: Path, out_dir: Path, template: str) -> float:
        (out_dir / "model.safetensors").write_text("half")
        raise KeyboardInterrupt  # a conversion killed midway

    monkeypatch.setattr(model_mod, "convert_gguf", boom)
    with pytest.raises(KeyboardInterrupt):
        ensure_default_model(target)
    assert not target.exists() and not stale.exists()
    assert not list(target.parent.glob(".*tmp-*"))

    monkeypatch.setattr(model_mod, "convert_gguf", _fake_convert)
    assert ensure_default_model(target) == target and is_converted(target)
    assert (target / "chat_template.jinja").exists()


def test_stale_marker_version_triggers_reconversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / MARKER_FILE).write_text(json.dumps({"conversion_version": -1}))
    (target / "junk").write_text("x")
    monkeypatch.setattr(model_mod, "convert_gguf", _fake_convert)
    ensure_default_model(target)
    assert is_converted(target) and not (target / "junk").exists()


def test_spanlab_cache_env_moves_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPANLAB_CACHE", str(tmp_path))
    assert model_mod.default_model_dir() == tmp_path / "models" / "smollm2-135m-instruct"


def test_converted_weights_reproduce_gguf_logits(default_model_dir: Path) -> None:
    """Load both from disk and compare logits exactly (the conversion checks in memory too)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = locate_gguf()
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True,
                                  tokenize=True, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)(ids).logits
        got = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)(ids).logits
    assert torch.equal(ref, got)
