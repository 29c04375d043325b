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
from pathlib import Path

from spanlab.errors import ConfigError
from spanlab.jobs.tracking.tracker import (
    MLflowConfig,
    TensorBoardConfig,
    Tracker,
    Trackers,
    TrackingConfig,
    WandbConfig,
    flatten,
)

__all__ = ["MLflowConfig", "TensorBoardConfig", "Tracker", "Trackers", "TrackingConfig", "WandbConfig",
           "check_tracking", "flatten", "open_trackers"]

EXTRA_HINT = "pip install 'spanlab[tracking]' (scripts/setup.sh installs it)"
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
