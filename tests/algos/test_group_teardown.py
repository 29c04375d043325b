"""A rank's gloo group really ends at ``destroy_process_group``, also when the rank loaded its model after
joining (a torchrun helper does): otherwise the group outlives it and is torn down while the interpreter
exits, which now and then aborts the process ("terminate called without an active exception") and fails
the torchrun job (seen in CI: tests/algos/test_grpo_torchrun.py, rank 1 SIGABRT).

Checked in a fresh interpreter, since what matters is which modules were imported before the group existed;
gloo's worker threads (``pt_gloo_runloop``, Linux thread names) tell whether the group is still alive.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.algos.test_grpo_parallel import toy_model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys, time
import torch.distributed as dist
from spanlab.training.data_parallel import load_trainable_model  # what a helper rank imports before joining

def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return [n for n in names if n.startswith(("pt_gloo", "gloo"))]

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
deadline = time.monotonic() + 30  # gloo names its threads as they start: on a loaded machine that can lag
while not gloo_threads() and time.monotonic() < deadline:
    time.sleep(0.05)
assert gloo_threads(), "no gloo threads while the group is alive: this check would prove nothing"
model = load_trainable_model(sys.argv[1])  # after joining, as serve_torchrun_rank does
dist.destroy_process_group()
print("left:", gloo_threads())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc (Linux)")
def test_group_ends_at_destroy_when_the_model_loads_after_joining(toy_model_dir: Path) -> None:  # noqa: F811
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(toy_model_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "left: []", done.stdout
