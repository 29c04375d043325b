"""Experiment tracking: a run's config, per-step metrics, held-out results and report to MLflow, W&B, TensorBoard.

Why a small interface rather than calls sprinkled through the job: the store's ``train_metrics`` stays
the record every algorithm writes to (``Job.log_step``, ``Job.held_out``); trackers are fed from those
two places only, so a metric in the store is a metric in every tracker, with the same step number.
``tracking:`` takes any combination of the three; each needs the ``tracking`` extra
(``pip install 'spanlab[tracking]'``; scripts/setup.sh installs it) and a missing package is a
one-line error naming it before anything starts. Nothing here talks to a network unless the config
points it there (an ``http`` MLflow URI, W&B ``mode: online``).
"""

from __future__ import annotations

import importlib.util
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spanlab.errors import ConfigError

logger = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'spanlab[tracking]' (scripts/setup.sh installs it)"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLflowConfig(_Section):
    tracking_uri: str = Field(description="e.g. sqlite:///runs/mlflow.db or http://host:5000")
    experiment: str = Field(default="spanlab", min_length=1)
    artifact_location: str | None = Field(default=None, description="a new experiment's artifact root")


class WandbConfig(_Section):
    project: str = Field(min_length=1)
    mode: Literal["online", "offline", "disabled"] = "online"
    entity: str | None = None
    dir: Path | None = Field(default=None, description="where W&B writes its files; default the run folder")


class TensorBoardConfig(_Section):
    dir: Path = Field(description="event files go to dir/RUN_NAME")


class TrackingConfig(_Section):
    """``tracking:``: any of ``mlflow``, ``wandb``, ``tensorboard``; none configured means none used."""

    mlflow: MLflowConfig | None = None
    wandb: WandbConfig | None = None
    tensorboard: TensorBoardConfig | None = None


class Tracker(ABC):
    """One tracking backend of one run. Steps are the ``train_metrics`` step numbers."""

    @abstractmethod
    def log_params(self, params: Mapping[str, Any]) -> None:
        """The run's resolved config (nested dicts), once at the start."""

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Flat numeric metrics of one step."""

    @abstractmethod
    def log_artifact(self, path: Path) -> None:
        """A file of the run (report.json, a plot)."""

    @abstractmethod
    def close(self, ok: bool = True) -> None:
        """End the run (``ok``: finished, else failed or interrupted)."""


class Trackers(Tracker):
    """All configured trackers as one; the job holds one of these (empty when ``tracking:`` is absent)."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log_params(self, params: Mapping[str, Any]) -> None:
        for t in self.trackers:
            t.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for t in self.trackers:
            t.log_metrics(numeric, step)

    def log_artifact(self, path: Path) -> None:
        if path.is_file():
            for t in self.trackers:
                t.log_artifact(path)

    def close(self, ok: bool = True) -> None:
        for t in self.trackers:
            try:
                t.close(ok)
            except Exception as exc:  # one tracker failing to close must not hide the others or the run's error
                logger.warning("closing %s failed: %s", type(t).__name__, exc)


_PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb"),
             "tensorboard": ("tensorboard", "tensorboard")}


def check_tracking(config: TrackingConfig) -> None:
    """Each configured tracker's package imports (found, not imported: cheap for ``--check``)."""
    for key, (module, dist) in _PACKAGES.items():
        if getattr(config, key) is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking.{key}: needs the '{dist}' package of the 'tracking' extra; {EXTRA_HINT}")
    ml = config.mlflow
    database = ml is not None and ml.tracking_uri.split(":", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")
    if database and (importlib.util.find_spec("sqlalchemy") is None or importlib.util.find_spec("alembic") is None):
        raise ConfigError(f"tracking.mlflow.tracking_uri: a database store needs sqlalchemy and alembic; "
                              f"{EXTRA_HINT}")


def open_trackers(config: TrackingConfig, *, run_id: str, run_name: str, run_dir: Path, resume: bool) -> Trackers:
    """Start (or, with ``resume``, continue) one run in each configured tracker."""
    from spanlab.jobs.tracking import backends

    check_tracking(config)
    opened: list[Tracker] = []
    if config.mlflow is not None:
        opened.append(backends.MLflowTracker(config.mlflow, run_id=run_id, run_name=run_name, resume=resume))
    if config.wandb is not None:
        opened.append(backends.WandbTracker(config.wandb, run_id=run_id, run_name=run_name,
                                            run_dir=run_dir, resume=resume))
    if config.tensorboard is not None:
        opened.append(backends.TensorBoardTracker(config.tensorboard, run_name=run_name))
    return Trackers(opened)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"grpo": {"lr": 1e-5}}`` -> ``{"grpo.lr": "1e-05"}``: the flat string params MLflow stores."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat
