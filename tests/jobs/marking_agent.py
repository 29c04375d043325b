"""The calc agent, appending a line to a file each time a rollout's answer is scored: a test outside the
``spanlab train`` process can then tell how far the run got without opening the store the run holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spanlab.agents.calc import CalcAgent
from spanlab.runner.agent import RolloutContext


class MarkingCalcAgent(CalcAgent):
    def __init__(self, marks: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks = Path(marks)

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        reward = await super().run(task, ctx)
        with self.marks.open("a") as fh:
            fh.write(f"{task.get('task_id')}\n")
        return reward
