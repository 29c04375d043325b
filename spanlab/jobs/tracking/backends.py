"""The three tracking backends behind :class:`spanlab.jobs.tracking.Tracker`; each imports its package lazily.

MLflow goes through ``MlflowClient`` (no fluent API: that keeps an active run in a process global);
its run carries the tag ``spanlab.run_id``, by which ``--resume`` finds it again. W&B uses the spanlab
run ID as its own, with ``resume="allow"``. TensorBoard appends to the run's event folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spanlab.jobs.tracking.tracker import MLflowConfig, TensorBoardConfig, Tracker, WandbConfig, flatten

MLFLOW_RUN_TAG = "spanlab.run_id"
_MLFLOW_PARAM_MAX = 6000  # MLflow's limit on a param value's length
_MLFLOW_BATCH = 100  # params per log_batch call MLflow accepts


class MLflowTracker(Tracker):
    def __init__(self, config: MLflowConfig, *, run_id: str, run_name: str, resume: bool) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=config.tracking_uri)
        experiment = self.client.get_experiment_by_name(config.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(config.experiment,
                                                            artifact_location=config.artifact_location))
        found = (self.client.search_runs([experiment_id], f"tags.`{MLFLOW_RUN_TAG}` = '{run_id}'", max_results=1)
                 if resume else [])
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=run_name,
                                                 tags={MLFLOW_RUN_TAG: run_id}).info.run_id
        self.resumed = bool(found)

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.resumed:  # logged when the run started; MLflow refuses a param changed since
            return
        from mlflow.entities import Param

        items = [Param(k[:250], v[:_MLFLOW_PARAM_MAX]) for k, v in flatten(params).items()]
        for i in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _MLFLOW_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, ok: bool = True) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


class WandbTracker(Tracker):
    def __init__(self, config: WandbConfig, *, run_id: str, run_name: str, run_dir: Path, resume: bool) -> None:
        import wandb

        folder = config.dir or run_dir
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=config.project, entity=config.entity, mode=config.mode, dir=str(folder),
                              id=run_id, name=run_name, resume="allow" if resume else None, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class TensorBoardTracker(Tracker):
    """Scalars per metric; the config and JSON/text artifacts as text summaries, PNGs as images."""

    def __init__(self, config: TensorBoardConfig, *, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(config.dir / run_name))
        self.last_step = 0

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(dict(params), indent=2, default=str) + "\n```")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.last_step = max(self.last_step, step)
        self.writer.flush()

    def log_artifact(self, path: Path) -> None:
        if path.suffix == ".png":
            import numpy as np
            from PIL import Image

            with Image.open(path) as image:
                self.writer.add_image(path.stem, np.asarray(image.convert("RGB")), self.last_step, dataformats="HWC")
        else:
            self.writer.add_text(path.name, "```\n" + path.read_text(errors="replace")[:100_000] + "\n```",
                                 self.last_step)
        self.writer.flush()

    def close(self, ok: bool = True) -> None:
        self.writer.close()
