"""What a training run reports: held-out accuracy per phase (with n), per-step metrics, timings."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table


class Evaluation(BaseModel):
    phase: str  # base | warm_start | final
    split: str = "test"  # the held-out split: eval.split (by question) or one of eval.extra_splits
    n: int
    accuracy: float
    by_level: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    failed: int = 0


class TrainReport(BaseModel):
    run_id: str = Field(default_factory=lambda: f"run-{uuid.uuid4().hex[:12]}")
    run_name: str
    algorithm: str
    model: str
    db: str
    evaluations: list[Evaluation] = Field(default_factory=list)
    warm_start: dict[str, float] | None = None
    steps: list[dict[str, float]] = Field(default_factory=list)
    seconds: float = 0.0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(), indent=2) + "\n")

    def table(self) -> Table:
        """Held-out accuracy before and after, the figure a user runs the job for."""
        table = Table(title=f"{self.run_name}: held-out accuracy ({self.model})")
        for col in ("phase", "split", "n", "accuracy", "by level", "eval s"):
            table.add_column(col)
        for ev in self.evaluations:
            levels = "  ".join(f"L{k} {100 * v:.0f}%" for k, v in ev.by_level.items())
            table.add_row(ev.phase, ev.split, str(ev.n), f"{100 * ev.accuracy:.1f}%", levels, f"{ev.seconds:.0f}")
        return table

    def summary(self) -> dict[str, Any]:
        headline = self.evaluations[0].split if self.evaluations else "test"
        acc = {ev.phase: ev.accuracy for ev in self.evaluations if ev.split == headline}
        by_split: dict[str, dict[str, float]] = {}
        for ev in self.evaluations:
            by_split.setdefault(ev.split, {})[ev.phase] = ev.accuracy
        return {"run_id": self.run_id, "accuracy": acc, "accuracy_by_split": by_split, "steps": len(self.steps),
                "seconds": round(self.seconds)}
