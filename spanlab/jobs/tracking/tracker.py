"""The tracking interface: the ``tracking:`` config sections, the :class:`Tracker` every backend implements, and
:class:`Trackers`, all configured ones as one.

Why apart from the package's ``__init__``: the backends (:mod:`.backends`) implement this interface and the
package opens them; with the interface here, the backends import it and not the package that imports them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLflowConfig(_Section):
    tracking_uri: str = Field(description="e.g. sqlite:///runs/mlflow.db or http://host:5000")
    experiment: str = Field(default="spanlab", min_length=1, description="the MLflow experiment runs go to")
    artifact_location: str | None = Field(default=None, description="a new experiment's artifact root")


class WandbConfig(_Section):
    project: str = Field(min_length=1, description="the W&B project")
    mode: Literal["online", "offline", "disabled"] = Field(default="online", description="offline: files only, "
                                                          "synced later")
    entity: str | None = Field(default=None, description="the W&B team or user; default: your default entity")
    dir: Path | None = Field(default=None, description="where W&B writes its files; default the run folder")


class TensorBoardConfig(_Section):
    dir: Path = Field(description="event files go to dir/RUN_NAME")


class TrackingConfig(_Section):
    """``tracking:``: any of ``mlflow``, ``wandb``, ``tensorboard``; none configured means none used."""

    mlflow: MLflowConfig | None = Field(default=None, description="log to MLflow")
    wandb: WandbConfig | None = Field(default=None, description="log to Weights & Biases")
    tensorboard: TensorBoardConfig | None = Field(default=None, description="write TensorBoard event files")


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
