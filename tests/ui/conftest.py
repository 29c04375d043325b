"""A span store file written for the UI tests, and the UI served from it over real HTTP.

The store holds known numbers so tests can check what the API and the page show: rollouts per status and
mode, two resource versions, calls with known token counts, one TITO session of two segments, one call whose
sampled IDs are a non-canonical split (re-tokenizing changes them), and two training runs. A second store
(``roles_store``) holds a multi-agent run with a policy per role and a single-agent run, for the per-role table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spanlab.store import SpanStore
from spanlab.threaded_server import ThreadedServer
from spanlab.types import LLMCall, RolloutConfig, Span, reward_span
from spanlab.ui import create_app
from tests.conftest import scripted_spans

TOKENIZER_DIR = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "tokenizers" / "qwen2.5"


@dataclass
class UiStore:
    """The test store's file and what was written to it."""

    path: Path
    by_status: dict[str, int] = field(default_factory=dict)
    by_mode: dict[str, int] = field(default_factory=dict)
    by_version: dict[str, int] = field(default_factory=dict)
    rewarded: int = 0  # rollouts whose final reward is 1.0
    calls: dict[str, tuple[int, int]] = field(default_factory=dict)  # span_id -> (prompt_len, response_len)
    tito_attempt: str = ""
    drift_span: str = ""  # sampled "four" as f+o+u+r: re-encoding gives one token
    canonical_span: str = ""
    first_rollout: str = ""  # a succeeded rollout with two calls and a tool call


def load_test_tokenizer() -> Any:
    if not TOKENIZER_DIR.is_dir():
        pytest.skip(f"tokenizer fixture missing: {TOKENIZER_DIR}")
    pytest.importorskip("transformers")
    from spanlab.tito.templates import load_tokenizer

    return load_tokenizer(TOKENIZER_DIR)


def _call(rid: str, aid: str, prompt: list[int], response: list[int], **kw: Any) -> Span:
    attributes = kw.pop("attributes", {})
    llm = LLMCall(model="test-model", prompt_token_ids=prompt, response_token_ids=response,
                  response_logprobs=[-0.5] * len(response), finish_reason="stop",
                  response_message={"role": "assistant", "content": f"answer {len(response)}"}, **kw)
    return Span(rollout_id=rid, attempt_id=aid, name="chat.completions", kind="llm_call", llm=llm,
                attributes=attributes)


def _tito(call: int, segment: int, offset: int) -> dict[str, Any]:
    return {"tito": {"mode": "tito", "call": call, "segment": segment, "offset": offset, "event": "extend"}}


def write_store(path: Path, tok: Any) -> UiStore:
    rng = np.random.default_rng(7)
    out = UiStore(path)
    with SpanStore(path) as store:
        store.add_resource("prompt", {"text": "v1"}, kind="prompt_template")
        once = RolloutConfig(max_attempts=1)
        for i in range(57):
            store.enqueue_one({"question": f"q{i}", "i": i}, mode="val" if i % 5 == 0 else "train", config=once)
        n = 0
        while (got := store.dequeue(worker_id="w0")) is not None:
            rollout, attempt = got
            rid, aid = rollout.rollout_id, attempt.attempt_id
            if n == 20:
                store.add_resource("prompt", {"text": "v2"}, kind="prompt_template")
            n += 1
            mode = rollout.mode
            out.by_mode[mode] = out.by_mode.get(mode, 0) + 1
            out.by_version[attempt_version(store, rid)] = out.by_version.get(attempt_version(store, rid), 0) + 1
            if n % 11 == 0:
                store.finish_attempt(aid, "failed")
                out.by_status["failed"] = out.by_status.get("failed", 0) + 1
                continue
            spans = []
            for k in range(2):
                p, r = 10 + (n + k) % 7, 3 + (n + k) % 4
                ids = rng.integers(0, 100_000, p + r).tolist()
                spans.append(_call(rid, aid, ids[:p], ids[p:]))
                out.calls[spans[-1].span_id] = (p, r)
                if k == 0:
                    spans.append(Span(rollout_id=rid, attempt_id=aid, name="calc", kind="tool_call",
                                      attributes={"result": "4"}))
            reward = float(n % 3 == 0)
            out.rewarded += reward == 1.0
            spans.append(reward_span(rid, aid, reward))
            store.add_spans(spans)
            store.finish_attempt(aid, "succeeded")
            out.by_status["succeeded"] = out.by_status.get("succeeded", 0) + 1
            out.first_rollout = out.first_rollout or rid
        _write_special(store, out, tok)
        for step in range(12):
            store.add_metrics("run-a", "grpo", step, {"reward_mean": step / 11, "loss": 1.0 / (step + 1)})
        store.add_metrics("run-b", "grpo", 0, {"reward_mean": 0.5, "loss": float("nan")})
    return out


def attempt_version(store: SpanStore, rollout_id: str) -> str:
    return store.get_rollout(rollout_id).resources_version or ""


def _write_special(store: SpanStore, out: UiStore, tok: Any) -> None:
    """One rollout with a TITO session (segments of 20 and 8 tokens) and the drift/canonical calls."""
    store.enqueue_one({"question": "tito"}, mode="test")
    rollout, attempt = store.dequeue(worker_id="w1")
    rid, aid = rollout.rollout_id, attempt.attempt_id
    out.by_mode["test"] = 1
    out.by_version[rollout.resources_version or ""] = out.by_version.get(rollout.resources_version or "", 0) + 1
    p0, r0, d1, r1, p2, r2 = ([int(x) for x in range(100 * j, 100 * j + n)] for j, n in
                              enumerate((8, 4, 3, 5, 6, 2), start=1))
    prompt = tok.encode("What is 2 + 2?", add_special_tokens=False)
    four = [tok.convert_tokens_to_ids(c) for c in "four"]
    canonical = tok.encode(" The answer is four.", add_special_tokens=False)
    spans = [
        _call(rid, aid, p0, r0, loss_mask=[0] * 8 + [1] * 4, attributes=_tito(0, 0, 0)),
        _call(rid, aid, p0 + r0 + d1, r1, loss_mask=[0] * 8 + [1] * 4 + [0] * 3 + [1] * 5, attributes=_tito(1, 0, 0)),
        _call(rid, aid, p2, r2, loss_mask=[0] * 6 + [1] * 2, attributes=_tito(2, 1, 20)),
        _call(rid, aid, prompt, four),
        _call(rid, aid, prompt, canonical),
    ]
    store.add_spans([*spans, reward_span(rid, aid, 1.0)])
    store.finish_attempt(aid, "succeeded")
    out.by_status["succeeded"] += 1
    out.rewarded += 1
    out.tito_attempt = aid
    out.drift_span, out.canonical_span = spans[3].span_id, spans[4].span_id
    for s in spans:
        out.calls[s.span_id] = (len(s.llm.prompt_token_ids), len(s.llm.response_token_ids))


ROLES_RUN, SINGLE_RUN = "team/roles", "single"
# a version tag that is markup: the page must show it as text (HTML-escaped), never as an element
HOSTILE_VERSION = '<img src=x onerror="document.body.dataset.pwned=1">lora-b-v2'
ROLE_STEPS = [  # run ROLES_RUN: (step, the attempt's steps as scripted_spans takes them)
    (0, [("call", ("writer", "lora-a", "lora-a-v1")), ("reward", 0.5),
         ("call", ("checker", "lora-b", "lora-b-v1")), ("final", 1.0)]),
    (0, [("call", ("writer", "lora-a", "lora-a-v1")), ("reward", 0.0),
         ("call", ("checker", "lora-b", "lora-b-v1")), ("final", 0.0)]),
    (1, [("call", ("writer", "lora-a", "lora-a-v2")), ("reward", 1.0), ("call", ("writer", "lora-a", "lora-a-v2")),
         ("call", ("checker", "lora-b", HOSTILE_VERSION)), ("final", 1.0)]),
]


@dataclass
class RolesStore:
    """The per-role test store: its file and the rollout IDs of each run, in the order written."""

    path: Path
    rollouts: dict[str, list[str]] = field(default_factory=dict)


def write_roles_store(path: Path) -> RolesStore:
    """ROLE_STEPS as run ROLES_RUN's rollouts, two single-agent rollouts as run SINGLE_RUN, metrics for both."""
    out = RolesStore(path)
    single = [(0, [("call", None), ("final", 1.0)]), (0, [("call", None), ("call", None), ("final", 0.0)])]
    with SpanStore(path) as store:
        for run_id, steps in ((ROLES_RUN, ROLE_STEPS), (SINGLE_RUN, single)):
            for n, (step, script) in enumerate(steps):
                store.enqueue_one({"task_id": f"t{n}"}, metadata={"run_id": run_id, "step": step},
                                  config=RolloutConfig(max_attempts=1))
                got = store.dequeue(worker_id="w")
                assert got is not None
                spans, _ = scripted_spans(*got, script, seed=10 * n)
                store.add_spans(spans)
                store.finish_attempt(got[1].attempt_id, "succeeded")
                out.rollouts.setdefault(run_id, []).append(got[0].rollout_id)
            for step in range(2):
                store.add_metrics(run_id, "grpo", step, {"reward_mean": 0.5 + step / 4})
    return out


@pytest.fixture(scope="session")
def roles_store(tmp_path_factory: pytest.TempPathFactory) -> RolesStore:
    return write_roles_store(tmp_path_factory.mktemp("ui-roles") / "roles.duckdb")


@pytest.fixture(scope="session")
def roles_server(roles_store: RolesStore) -> Iterator[ThreadedServer]:
    with ThreadedServer(create_app(roles_store.path), name="ui-roles") as server:
        yield server


@pytest.fixture(scope="session")
def ui_store(tmp_path_factory: pytest.TempPathFactory) -> UiStore:
    tok = load_test_tokenizer()
    return write_store(tmp_path_factory.mktemp("ui") / "ui.duckdb", tok)


@pytest.fixture(scope="session")
def ui_server(ui_store: UiStore) -> Iterator[ThreadedServer]:
    app = create_app(ui_store.path, load_test_tokenizer)
    with ThreadedServer(app, name="ui") as server:
        yield server
