"""AnswerAgent through a real Worker into a real store, its model a scripted OpenAI server on loopback.

No vLLM: what is checked is the agent's own part. The prompt reaches the model with the family's question verbatim
and the answer tags; the answer between the last tags is scored by the family's ``score_answer`` and recorded as
the reward span with the family and its settings; an output without the tags says so in a ``no_answer_tag`` span;
``tools: [calculator]`` runs a call on the calc agent's real MCP server process and answers with its result.
"""

from __future__ import annotations

import asyncio
import http.server
import json
from typing import Any

import pytest

from spanlab.agents.answer import AnswerAgent, default_template, extract_answer
from spanlab.errors import ConfigError
from spanlab.runner import Worker
from spanlab.runner.agent import load_agent
from spanlab.store import SpanStore
from spanlab.tasksets.reasoning_gym import make_tasks
from spanlab.types import Rollout, RolloutConfig
from tests.local_http import serve_handler

TASKS = make_tasks("test", 3, seed=0, levels=[2], tasks=["basic_arithmetic"])
RIGHT, UNTAGGED, WITH_TOOL = (t["question"] for t in TASKS)


def _scripted(requests: list[dict[str, Any]]) -> type[http.server.BaseHTTPRequestHandler]:
    """A chat-completions server: a right answer, an untagged one, or a calculator call and then its result."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            question = next(m["content"] for m in body["messages"] if m["role"] == "user")
            task = next(t for t in TASKS if t["question"] == question)
            tool_results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
            message: dict[str, Any] = {"role": "assistant", "content": None}
            if question == WITH_TOOL and not tool_results:
                args = json.dumps({"expression": task["entry"]["metadata"]["expression"]})
                message["tool_calls"] = [{"id": "call_0", "type": "function",
                                          "function": {"name": "calculator", "arguments": args}}]
            elif question == WITH_TOOL:
                message["content"] = f"The calculator says so. <answer>{tool_results[-1]}</answer>"
            elif question == RIGHT:
                message["content"] = f"Step by step... <answer>wrong</answer> no: <answer> {task['answer']} </answer>"
            else:
                message["content"] = f"The answer is {task['answer']}."
            reply = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def _run(store: SpanStore, agent: AnswerAgent, url: str) -> list[str]:
    config = RolloutConfig(timeout_s=120, max_attempts=1)
    ids = [r.rollout_id for r in store.enqueue([Rollout(input=t, config=config) for t in TASKS])]

    async def main() -> None:
        try:
            stats = await Worker(store, agent, gateway_url=url, concurrency=3).run()
            assert stats.succeeded == 3 and stats.failed == 0
        finally:
            await agent.aclose()

    asyncio.run(main())
    return ids


def _spans(store: SpanStore, rollout_id: str, kind: str) -> list[dict[str, Any]]:
    rows = store.query(f"SELECT name, attributes, reward_value FROM spans WHERE rollout_id = '{rollout_id}' "
                       f"AND kind = '{kind}' ORDER BY sequence_id").to_pylist()
    return [{**r, "attributes": json.loads(r["attributes"] or "{}")} for r in rows]


def test_the_reward_is_the_family_score_of_the_tagged_answer_recorded_with_family_and_settings(
        store: SpanStore) -> None:
    requests: list[dict[str, Any]] = []
    agent = load_agent("answer", {"model": "scripted", "tools": ["calculator"], "max_turns": 2})
    assert isinstance(agent, AnswerAgent)
    with serve_handler(_scripted(requests)) as url:
        right, untagged, with_tool = _run(store, agent, url)
    first = next(r for r in requests if r["messages"][-1]["content"] == RIGHT)
    assert first["messages"][0]["role"] == "system" and "<answer></answer>" in first["messages"][0]["content"]
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]
    for rid, reward in ((right, 1.0), (untagged, 0.0), (with_tool, 1.0)):
        [final] = _spans(store, rid, "reward")
        assert final["reward_value"] == reward and final["attributes"]["final"] is True
        assert final["attributes"]["family"] == "basic_arithmetic" and final["attributes"]["level"] == 2
        assert final["attributes"]["settings"] == TASKS[0]["settings"]
    custom = {rid: {s["name"]: s["attributes"] for s in _spans(store, rid, "custom")} for rid in (right, untagged)}
    assert custom[right]["grade"]["answer"] == TASKS[0]["answer"] and "no_answer_tag" not in custom[right]
    assert custom[untagged]["grade"]["answer"] is None
    assert "no <answer>...</answer> pair" in custom[untagged]["no_answer_tag"]["why"]
    [tool] = _spans(store, with_tool, "tool_call")
    assert tool["name"] == "tool:calculator" and tool["attributes"]["result"] == TASKS[2]["answer"]


def test_the_answer_is_between_the_last_tags_and_the_prompt_places_both_variables() -> None:
    assert extract_answer("x <answer>1</answer> y <answer>\n 2 \n</answer>") == "2"
    assert extract_answer("<answer>1") is None and extract_answer(None) is None
    assert extract_answer("<final>7</final>", "final") == "7"
    assert "{{ question }}" in default_template() and "{{ answer_tags }}" in default_template()


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"tools": ["browser"]}, "unknown tool 'browser'"),
    ({"scorer": "fuzzy"}, "scorer must be one of"),
    ({"answer_tag": "<answer>"}, "answer_tag must be a plain name"),
])
def test_bad_kwargs_are_refused_by_name(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_agent("answer", {"model": "m", **kwargs})
