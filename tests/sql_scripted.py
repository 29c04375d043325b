"""The real SQLAgent with its model's replies scripted, recorded by a real Worker into a real store.

Everything but the model is real: the agent's orchestration, the queries run on the real SQLite databases, every
span the agent records. Each writer draft is one whose right verdict is known (the gold query, an error, an empty
result, a column too many, rows twice, no SQL at all), which is what tests of mining role demonstrations need.
"""

from __future__ import annotations

import asyncio
from typing import Any

from spanlab.agents.sql import SQLAgent, make_tasks
from spanlab.agents.sql.prompts import sql_block
from spanlab.runner import Worker
from spanlab.store import StoreAPI
from spanlab.types import Rollout, RolloutConfig

TASKS = make_tasks("train", 7, seed=0, levels=[1, 2])


def _drafts(tasks: list[dict[str, Any]]) -> dict[str, str]:
    """The writer's reply per task: right twice, and once wrong in each way a checker should name."""
    g = [t["gold_sql"] for t in tasks]
    return {tasks[0]["task_id"]: sql_block(g[0]),
            tasks[1]["task_id"]: sql_block("SELECT nosuch_column FROM (" + g[1] + ")"),
            tasks[2]["task_id"]: sql_block(f"SELECT * FROM ({g[2]}) WHERE 0"),
            tasks[3]["task_id"]: sql_block(f"SELECT *, 1 FROM ({g[3]})"),
            tasks[4]["task_id"]: sql_block(f"SELECT * FROM ({g[4]}) UNION ALL SELECT * FROM ({g[4]})"),
            tasks[5]["task_id"]: "I do not know which table holds that.",
            tasks[6]["task_id"]: f"Here it is:\n{sql_block(g[6])}"}


class ScriptedSQLAgent(SQLAgent):
    """The real SQLAgent with the model's replies scripted per role and task; keeps what each role was sent."""

    def __init__(self, replies: dict[str, str], rewrites: dict[str, str]) -> None:
        super().__init__(model="scripted")
        self.replies, self.rewrites = replies, rewrites
        self.sent: list[tuple[str, str]] = []

    async def ask(self, role: str, user: str, base_url: str, api_key: str = "spanlab") -> str:  # type: ignore[override]
        self.sent.append((role, user))
        task = max((t for t in TASKS if t["question"] in user), key=lambda t: len(t["question"]))
        if role == "writer":
            return self.replies[task["task_id"]]
        if role == "checker":
            return "WRONG: it looks off"
        return self.rewrites.get(task["task_id"], "Sorry, no idea.")


def record_scripted(store: StoreAPI) -> ScriptedSQLAgent:
    """Run the seven scripted rollouts into ``store`` (the rewriter fixes the second draft); the agent."""
    rewrites = {TASKS[1]["task_id"]: sql_block(TASKS[1]["gold_sql"])}
    agent = ScriptedSQLAgent(_drafts(TASKS), rewrites)
    store.enqueue([Rollout(input=t, config=RolloutConfig(timeout_s=60, max_attempts=1)) for t in TASKS])
    stats = asyncio.run(Worker(store, agent, gateway_url="http://127.0.0.1:9", concurrency=1).run())
    assert stats.succeeded == len(TASKS)
    return agent
