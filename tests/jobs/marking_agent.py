"""The calc agent, appending a line to a file each time a rollout's answer is scored: a test outside the
``spanlab train`` process can then tell how far the run got without opening the store the run holds.

``reward: sample_parity`` replaces the score by the sample's index mod 2 (0 for the first sample of a
group, 1 for the second): the untrained model rarely earns a reward in a few tokens, and a GRPO group
whose rewards are equal gives no gradient, so this makes every step a real update (optimizer moments,
changed weights) while the rollouts still run the real agent, gateway and engine. ``reward: zero`` is the
opposite: every sample 0, so no group has reward variance and no step updates (a run that learns nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from spanlab.agents.calc import CalcAgent
from spanlab.runner.agent import RolloutContext


class MarkingCalcAgent(CalcAgent):
    def __init__(self, marks: str, reward: Literal["score", "sample_parity", "zero"] = "score", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marks, self.reward = Path(marks), reward

    async def run(self, task: Any, ctx: RolloutContext) -> float:
        score = await super().run(task, ctx)
        if self.reward == "sample_parity":
            score = float(int(ctx.rollout.metadata.get("sample", 0)) % 2)
        elif self.reward == "zero":
            score = 0.0
        with self.marks.open("a") as fh:
            fh.write(f"{task.get('task_id')}\n")
        return score
