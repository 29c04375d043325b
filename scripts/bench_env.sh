#!/usr/bin/env bash
# Set up ./.venv-bench with the systems benchmarks/vs_*.py compare spanlab against, apart from spanlab's
# own ./.venv so their dependencies never disturb spanlab's pins (constraints.txt):
#   * agentlightning==0.3.0 (Agent Lightning: LightningStore, in-memory and over HTTP), which also brings
#     LiteLLM with its proxy extras (agentlightning depends on litellm[proxy]);
#   * litellm[proxy], named again so the gateway benchmark still gets it if agentlightning's deps change.
# Neither needs torch; a CUDA torch or nvidia-* CUDA wheels must never come in: the script checks the
# resolution first (pip --dry-run) and stops if one would. (nvidia-ml-py, the NVML bindings gpustat uses,
# is pure Python and allowed.) TRL's GRPOTrainer is compared inside ./.venv, where trl is already installed.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv-bench
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24"

PKGS=("agentlightning==0.3.0" "litellm[proxy]")
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"${PIP[@]}" install -q --dry-run --report "$report" "${PKGS[@]}"
bad=$("$VENV/bin/python" - "$report" <<'PY'
import json, re, sys
names = [i["metadata"]["name"].lower() for i in json.load(open(sys.argv[1])).get("install", [])]
print(" ".join(n for n in names if n == "torch" or (re.match(r"nvidia[-_]", n) and n != "nvidia-ml-py")))
PY
)
if [ -n "$bad" ]; then
  echo "bench_env.sh: the resolution would install $bad; refusing (see the comment at the top)" >&2
  exit 1
fi
"${PIP[@]}" install -q "${PKGS[@]}"

LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "
import importlib.metadata as m
import agentlightning
from agentlightning.store import InMemoryLightningStore
print('agentlightning', m.version('agentlightning'), '| litellm', m.version('litellm'))"
