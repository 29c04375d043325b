"""RoomsAgent end to end: Worker -> gateway -> real vLLM (SmolLM2), the prompt a versioned POML resource.

Two prompt versions run on the same task; each rollout must record the version it was pinned to, and
its first LLM call must carry exactly that version's rendered system prompt. The spans -> messages
adapter must give back the conversation the agent had, with the grader's verdict as a note. The answer
turn has its own token cap (``answer_max_tokens``), the tool-call turn keeps ``max_tokens``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from spanlab.adapters.messages import conversations, transcript
from spanlab.agents.rooms import RoomsAgent, default_template, make_tasks
from spanlab.gateway import GatewayServer
from spanlab.prompts import PromptRenderer
from spanlab.runner import Worker
from spanlab.runner.agent import load_agent
from spanlab.store import SpanStore
from spanlab.types import Rollout, RolloutConfig

pytestmark = pytest.mark.vllm  # not slow: the only check that a rollout records its pinned prompt version

POLICY = """<poml>
<role>You book meeting rooms.</role>
<task>Call find_rooms with every detail of the request. Reply with one line: Answer: ROOM (the smallest room).</task>
<human-msg>{{ request }}</human-msg>
</poml>"""


def test_rollouts_use_and_record_their_prompt_version(store: SpanStore, gateway: GatewayServer,
                                                      vllm_server: Any) -> None:
    renderer = PromptRenderer()
    v1 = store.add_resource("prompt", {"template": default_template()}, kind="prompt_template")
    v2 = store.add_resource("prompt", {"template": POLICY}, kind="prompt_template")
    task = make_tasks("val", 1, seed=0)[0]
    config = RolloutConfig(timeout_s=300, max_attempts=1)
    ids = [r.rollout_id for r in store.enqueue([Rollout(input=task, config=config, resources_version=v.ref)
                                                for v in (v1, v2)])]
    agent = load_agent("rooms", {"model": vllm_server.model, "renderer": renderer, "answer_max_tokens": 16})
    assert isinstance(agent, RoomsAgent)
    stats = asyncio.run(Worker(store, agent, gateway_url=gateway.url, concurrency=2).run())
    gateway.flush()
    assert stats.succeeded == 2 and stats.failed == 0

    convs = conversations(store, ids)
    for rid, version in zip(ids, (v1, v2), strict=True):
        assert store.get_rollout(rid).resources_version == version.ref
        expected = renderer.render(version.payload["template"], {"request": task["request"]})
        conv = convs[rid]
        assert conv.messages[:2] == expected  # system (from the template) + user (the request)
        assert conv.messages[-1]["role"] == "assistant"
        grade = conv.notes["grade"]
        assert grade["expected"] == task["expected_room"] and conv.reward == grade["reward"]
        assert "user: " + task["request"] in transcript(conv)
        calls = store.spans_table(rollout_ids=[rid], kinds=["llm_call"], columns=["start_time", "response_token_ids"])
        lengths = [len(ids) for ids in calls.sort_by("start_time").column("response_token_ids").to_pylist()]
        assert len(lengths) == 2  # max_turns defaults to 2; the first turn is a forced (strict) tool call
        assert lengths[0] > 16 and lengths[1] <= 16  # a whole tool call, then an answer within its own cap
    assert renderer.node_renders == 2  # one skeleton per template, whatever the number of tasks
