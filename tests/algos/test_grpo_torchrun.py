"""The data-parallel GRPO update launched by torchrun (``torch.distributed.run --standalone --nproc-per-node 2``,
2 gloo ranks on one machine, joined through torchrun's ``env://`` rendezvous) takes the one-process step.

Same check and tolerance as tests/algos/test_grpo_parallel.py's spawned ranks (atol 1e-6, SGD lr 1.0 without
clipping, so the update is the summed gradient itself). The helper rank is the real ``spanlab train cfg.yaml``
under torchrun; rank 0 is the ``DataParallel`` the GRPO loop builds (a whole job needs an engine). A helper
that built the wrong model, missed rank 0's weights or sat out the all-reduce moves the parameters visibly
differently. Only one machine is tested; several (``--nnodes``) go through the same rendezvous code in torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spanlab.algos.grpo.update import grpo_step
from spanlab.cli import app
from spanlab.training.data_parallel import load_trainable_model
from tests.algos.test_grpo_parallel import CONFIG, SAMPLES_SEED, _batch, _flat, toy_model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("torchrun_grpo_step.py")


def test_two_torchrun_ranks_take_the_single_process_step(toy_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    out, config = tmp_path / "rank0.pt", tmp_path / "train.yaml"
    config.write_text(json.dumps(_config(tmp_path, None)))  # trainer.processes: torchrun's WORLD_SIZE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(SCRIPT), str(toy_model_dir), str(out), str(config)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    two = torch.load(out)

    single = load_trainable_model(toy_model_dir)
    start = _flat(single)
    one = grpo_step(single, torch.optim.SGD(single.parameters(), lr=1.0), _batch(SAMPLES_SEED, 12), CONFIG, pad_id=0)

    assert (_flat(single) - start).abs().max() > 1e-2  # the step really moved the parameters
    torch.testing.assert_close(two["params"], _flat(single), rtol=0, atol=1e-6)
    for key in ("loss", "grad_norm", "loss_tokens", "tokens"):
        assert two["metrics"][key] == pytest.approx(one[key], rel=1e-5), key
    (sum0, sq0), (sum1, sq1) = two["fingerprints"]
    assert sum0 == pytest.approx(sum1, rel=1e-12) and sq0 == pytest.approx(sq1, rel=1e-12)  # the ranks agree


TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def _config(tmp_path: Path, trainer: dict[str, object] | None) -> dict[str, object]:
    return {"algorithm": "grpo", "agent": {"name": "calc"}, "dataset": {"name": "calc", "levels": [1]},
            "db": str(tmp_path / "run.duckdb"), "out_dir": str(tmp_path / "runs"),
            **({"trainer": trainer} if trainer is not None else {})}


def _check(tmp_path: Path, trainer: dict[str, object] | None) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(_config(tmp_path, trainer)))
    result = CliRunner().invoke(app, ["train", str(path), "--check"], env=TORCHRUN_ENV)
    return result.exit_code, result.output


def test_under_torchrun_processes_is_world_size_or_a_one_line_error(tmp_path: Path) -> None:
    code, output = _check(tmp_path, {"processes": 2})
    text = " ".join(output.split())
    assert code == 2 and "Traceback" not in output and text.count("error: ") == 1, output
    assert "trainer.processes: 2 but torchrun started WORLD_SIZE=3 ranks; set it to 3 or leave it out" in text
    code, output = _check(tmp_path, None)  # unset: torchrun's count
    assert code == 0, output
    assert "processes: 3" in output
