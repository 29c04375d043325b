"""Experiment tracking backends on real local files: MLflow (sqlite store, read back with MlflowClient),
TensorBoard (event files read back with EventAccumulator), W&B offline (its run folder checked). No network."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spanlab.errors import ConfigError
from spanlab.jobs.tracking import TrackingConfig, check_tracking, open_trackers

CONFIG = {"algorithm": "grpo", "grpo": {"lr": 1e-5, "steps": 2}, "run_name": "t"}


def _feed(trackers, tmp_path: Path) -> None:
    trackers.log_params(CONFIG)
    trackers.log_metrics({"eval_accuracy_base": 0.25}, 0)
    trackers.log_metrics({"reward_mean": 0.5, "loss": 1.5, "flag": True}, 0)
    trackers.log_metrics({"reward_mean": 0.75, "loss": 1.25}, 1)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"steps": 2}))
    trackers.log_artifact(report)
    trackers.log_artifact(tmp_path / "absent.png")  # a missing file is skipped, not an error
    trackers.close()


def test_mlflow_sqlite_run_reads_back(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = TrackingConfig.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "exp",
                                                       "artifact_location": str(tmp_path / "artifacts")}})
    _feed(open_trackers(config, run_id="run-abc", run_name="t", run_dir=tmp_path, resume=False), tmp_path)
    # --resume continues the same MLflow run (found by its spanlab.run_id tag) instead of starting another
    again = open_trackers(config, run_id="run-abc", run_name="t", run_dir=tmp_path, resume=True)
    again.log_params({**CONFIG, "grpo": {"lr": 1e-5, "steps": 3}})
    again.log_metrics({"reward_mean": 1.0}, 2)
    again.close()

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["spanlab.run_id"] == "run-abc"
    assert run.data.params["grpo.lr"] == "1e-05" and run.data.params["grpo.steps"] == "2"
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward_mean")]
    assert sorted(history) == [(0, 0.5), (1, 0.75), (2, 1.0)]
    assert "flag" not in run.data.metrics  # booleans are not metrics
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.json"]


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = TrackingConfig.model_validate({"tensorboard": {"dir": str(tmp_path / "tb")}})
    _feed(open_trackers(config, run_id="run-abc", run_name="t", run_dir=tmp_path, resume=False), tmp_path)
    events = EventAccumulator(str(tmp_path / "tb" / "t"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(0, 0.5), (1, 0.75)]
    assert {"eval_accuracy_base", "loss", "reward_mean"} <= set(events.Tags()["scalars"])
    texts = set(events.Tags()["tensors"])
    assert {"config/text_summary", "report.json/text_summary"} <= texts


def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B ``.wandb`` file: a 7-byte header, then LevelDB log framing in 32 KiB blocks
    (4-byte CRC, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last). wandb ships no reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, parts, records = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record still being written
            break
        parts, pos = parts + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_folder(tmp_path: Path) -> None:
    config = TrackingConfig.model_validate({"wandb": {"project": "p", "mode": "offline", "dir": str(tmp_path)}})
    _feed(open_trackers(config, run_id="run-abc", run_name="t", run_dir=tmp_path, resume=False), tmp_path)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-run-abc")
    # wandb-core writes the run's records on its own after finish() returns: wait (bounded) for the exit record
    for _ in range(300):
        records = wandb_records(run_dir / "run-run-abc.wandb")
        if any(r.HasField("exit") for r in records):
            break
        time.sleep(0.1)
    history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.HasField("history")]
    assert [(h["_step"], h.get("reward_mean"), h.get("eval_accuracy_base")) for h in history] == [
        (0, 0.5, 0.25), (1, 0.75, None)]
    config_keys = {_key(i) for r in records if r.HasField("config") for i in r.config.update}
    assert {"algorithm", "grpo", "run_name"} <= config_keys
    assert json.loads((run_dir / "files" / "report.json").read_text()) == {"steps": 2}
    assert any(r.HasField("exit") and r.exit.exit_code == 0 for r in records)


def test_bad_tracking_config_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="tracking_uri"):
        TrackingConfig.model_validate({"mlflow": {"experiment": "x"}})
    with pytest.raises(ValidationError, match="mode"):
        TrackingConfig.model_validate({"wandb": {"project": "p", "mode": "sometimes"}})
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tracking\.wandb: needs the 'wandb' package.*spanlab\[tracking\]"):
        check_tracking(TrackingConfig.model_validate({"wandb": {"project": "p", "mode": "offline"}}))
