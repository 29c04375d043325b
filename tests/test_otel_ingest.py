"""OTLP/HTTP traces into a real ``spanlab store serve`` process, from the real OpenTelemetry SDK exporter.

Spans are made with the SDK's tracer (GenAI semantic conventions: new message attributes and the older
flattened ones, a tool span, a reward, a custom root), exported by ``OTLPSpanExporter`` (protobuf over
HTTP) and read back through ``StoreClient``. Hand-written OTLP JSON covers the JSON encoding. Bad
input (garbage, wrong content type, no token, an unknown attempt, a gzip bomb) gets a 4xx and stores
nothing.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the `otel` extra is not installed")
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from spanlab.store.client import StoreClient
from tests.stores import TOKEN, ServerProcess

AUTH = {"Authorization": f"Bearer {TOKEN}"}
INPUT = [
    {"role": "user", "parts": [{"type": "text", "content": "What is 2+3?"}]},
]
OUTPUT = [{"role": "assistant", "finish_reason": "tool_call",
           "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("otel") / "otel.duckdb", None, "--max-body-mb", "1").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[StoreClient]:
    with server.client() as c:
        yield c


@pytest.fixture
def attempt(client: StoreClient) -> tuple[str, str]:
    client.enqueue_one({"task": "otel"})
    rollout, att = client.dequeue(worker_id="otel-agent")
    return rollout.rollout_id, att.attempt_id


def _agent_spans(rollout_id: str, attempt_id: str) -> tuple[ReadableSpan, ...]:
    """What an OTel-instrumented agent emits for one attempt (captured in memory, exported below)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(
        {"service.name": "otel-agent", "spanlab.rollout_id": rollout_id, "spanlab.attempt_id": attempt_id}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.otel")
    with tracer.start_as_current_span("invoke_agent calc", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with tracer.start_as_current_span("chat m", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.response.model": "m-0",
            "gen_ai.input.messages": json.dumps(INPUT), "gen_ai.output.messages": json.dumps(OUTPUT),
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Use the tool."}]),
            "gen_ai.usage.input_tokens": 4, "gen_ai.usage.output_tokens": 3, "spanlab.agent": "solver",
            "spanlab.prompt_token_ids": [1, 2, 3, 4], "spanlab.response_token_ids": [7, 8, 2],
            "spanlab.response_logprobs": [-0.5, -0.25, -0.125], "temperature.custom": 0.7,
        }):
            pass
        with tracer.start_as_current_span("execute_tool add", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add", "gen_ai.tool.call.id": "c1"}) as tool:
            tool.set_status(Status(StatusCode.ERROR, "tool raised"))
        with tracer.start_as_current_span("openai.chat", attributes={  # the older flattened convention
            "gen_ai.request.model": "m", "gen_ai.prompt.0.role": "tool", "gen_ai.prompt.0.content": "5",
            "gen_ai.prompt.0.tool_call_id": "c1", "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "It is 5.", "gen_ai.completion.0.finish_reason": "stop",
            "gen_ai.usage.prompt_tokens": 9, "gen_ai.usage.completion_tokens": 4}):
            pass
        with tracer.start_as_current_span("score", attributes={"spanlab.reward": 1.0}):
            pass
    provider.shutdown()
    return memory.get_finished_spans()


def _count(client: StoreClient) -> int:
    return client.query("SELECT count(*) AS n FROM spans").to_pylist()[0]["n"]


def test_sdk_exporter_spans_land_on_their_attempt_with_genai_fields(
    server: ServerProcess, client: StoreClient, attempt: tuple[str, str]
) -> None:
    rollout_id, attempt_id = attempt
    spans = _agent_spans(rollout_id, attempt_id)
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=AUTH, timeout=10)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.export(spans) is SpanExportResult.SUCCESS  # an exporter's retry stores nothing twice
    stored = {s.name: s for s in client.iter_spans(attempt_ids=[attempt_id])}
    assert len(stored) == 5 and all(s.rollout_id == rollout_id for s in stored.values())
    assert {n: s.kind for n, s in stored.items()} == {
        "invoke_agent calc": "custom", "chat m": "llm_call", "execute_tool add": "tool_call",
        "openai.chat": "llm_call", "score": "reward"}

    chat = stored["chat m"]
    assert chat.llm.prompt_token_ids == [1, 2, 3, 4] and chat.llm.response_token_ids == [7, 8, 2]
    assert chat.llm.response_logprobs == [-0.5, -0.25, -0.125]
    assert chat.llm.model == "m-0" and chat.llm.finish_reason == "tool_call"
    assert chat.llm.request_messages == [{"role": "system", "content": "Use the tool."},
                                         {"role": "user", "content": "What is 2+3?"}]
    assert chat.llm.response_message["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert chat.llm.usage.model_dump() == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert chat.attributes["agent"] == "solver" and chat.attributes["temperature.custom"] == 0.7
    assert "gen_ai.input.messages" not in chat.attributes
    root = stored["invoke_agent calc"]
    assert chat.parent_id == root.span_id and root.parent_id is None
    assert chat.attributes["otel"]["resource"]["service.name"] == "otel-agent"

    old = stored["openai.chat"]
    assert old.llm.request_messages == [{"role": "tool", "content": "5", "tool_call_id": "c1"}]
    assert old.llm.response_message == {"role": "assistant", "content": "It is 5."}
    assert (old.llm.finish_reason, old.llm.usage.total_tokens) == ("stop", 13)
    assert stored["execute_tool add"].status == "error"
    assert stored["score"].reward.value == 1.0
    summary = client.rollout_summaries([rollout_id])[0]
    assert summary.llm_calls == 2


def _json_request(attempt_id: str | None, rollout_id: str | None, span_hex: str) -> dict:
    resource = [{"key": k, "value": {"stringValue": v}}
                for k, v in (("spanlab.rollout_id", rollout_id), ("spanlab.attempt_id", attempt_id)) if v]
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": span_hex, "name": "chat m", "kind": 3,
        "startTimeUnixNano": "1764640000000000000", "endTimeUnixNano": "1764640001500000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
            {"key": "spanlab.response_token_ids", "value": {"arrayValue": {"values": [
                {"intValue": "5"}, {"intValue": "6"}]}}},
        ]}
    scope = {"scope": {"name": "js"}, "spans": [span]}
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [scope]}]}


def test_otlp_json_is_read_too(server: ServerProcess, client: StoreClient, attempt: tuple[str, str]) -> None:
    rollout_id, attempt_id = attempt
    resp = httpx.post(f"{server.url}/v1/traces", headers=AUTH,
                      json=_json_request(attempt_id, rollout_id, "eee19b7ec3c1b174"))
    assert resp.status_code == 200 and resp.json() == {}
    (span,) = client.iter_spans(attempt_ids=[attempt_id])
    assert span.span_id == "otel-5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174"
    assert span.llm.response_token_ids == [5, 6] and span.attributes["otel"]["kind"] == "client"
    assert (span.start_time, span.end_time) == (1764640000.0, 1764640001.5)


def test_bad_otlp_input_gets_a_4xx_and_stores_nothing(server: ServerProcess, client: StoreClient,
                                                      attempt: tuple[str, str]) -> None:
    url, before = f"{server.url}/v1/traces", _count(client)
    good = json.dumps(_json_request(attempt[1], attempt[0], "0000000000000001")).encode()
    cases = [
        ({"content-type": "application/x-protobuf"}, b"\xff\xfenot protobuf at all", 400, "protobuf"),
        ({"content-type": "application/json"}, b"{not json", 400, "not JSON"),
        ({"content-type": "application/json"}, b'{"resourceSpans": 3}', 400, "JSON"),
        ({"content-type": "text/plain"}, good, 415, "Content-Type"),
        ({"content-type": "application/json", "content-encoding": "gzip"}, gzip.compress(b"\0" * (2 << 20)), 413,
         "limit"),
        ({"content-type": "application/json"},
         json.dumps(_json_request("at-nope", "ro-nope", "0000000000000002")).encode(), 422, "at-nope"),
    ]
    for headers, body, status, says in cases:
        resp = httpx.post(url, headers={**AUTH, **headers}, content=body)
        assert (resp.status_code, says in resp.json()["detail"]) == (status, True), (headers, resp.text)
    assert httpx.post(url, headers={"content-type": "application/json"}, content=good).status_code == 401
    exporter = OTLPSpanExporter(endpoint=url, headers={"Authorization": "Bearer wrong"}, timeout=5)
    assert exporter.export(_agent_spans(*attempt)) is SpanExportResult.FAILURE
    assert _count(client) == before


def test_unattributed_spans_are_stored_without_a_rollout(server: ServerProcess, client: StoreClient) -> None:
    resp = httpx.post(f"{server.url}/v1/traces", headers=AUTH, json=_json_request(None, None, "00000000000000aa"))
    assert resp.status_code == 200
    rows = client.query("SELECT rollout_id, kind FROM spans WHERE span_id LIKE 'otel-%-00000000000000aa'").to_pylist()
    assert rows == [{"rollout_id": None, "kind": "llm_call"}]


def test_the_route_is_documented_in_openapi(server: ServerProcess) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert set(paths["/v1/traces"]["post"]["requestBody"]["content"]) == {"application/x-protobuf",
                                                                            "application/json"}


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    from spanlab.otel import OtlpUnavailableError, read_request

    real_import = builtins.__import__

    def no_proto(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("opentelemetry.proto"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_proto)
    with pytest.raises(OtlpUnavailableError, match=r"spanlab\[otel\]"):
        read_request(b"", "application/x-protobuf", None, 1 << 20)


def test_agent_lightning_tracer_names_are_read(server: ServerProcess, client: StoreClient,
                                               attempt: tuple[str, str]) -> None:
    rollout_id, attempt_id = attempt
    body = _json_request(None, None, "00000000000000bb")
    resource_spans = body["resourceSpans"][0]
    resource_spans["resource"]["attributes"] = [
        {"key": "agentlightning.rollout_id", "value": {"stringValue": rollout_id}},
        {"key": "agentlightning.attempt_id", "value": {"stringValue": attempt_id}}]
    span = resource_spans["scopeSpans"][0]["spans"][0]
    span.update(name="agentlightning.reward", attributes=[
        {"key": "agentlightning.reward.0.value", "value": {"doubleValue": 0.5}}])
    assert httpx.post(f"{server.url}/v1/traces", headers=AUTH, json=body).status_code == 200
    (stored,) = client.iter_spans(attempt_ids=[attempt_id])
    assert (stored.kind, stored.reward.value, stored.rollout_id) == ("reward", 0.5, rollout_id)
    assert client.rollout_summaries([rollout_id])[0].final_reward == 0.5


@pytest.mark.parametrize("ids", [[1.5, 2.0], ["1", "2"], [1, 2 ** 40]])
def test_token_ids_that_are_not_int32_integers_are_422(server: ServerProcess, client: StoreClient,
                                                       attempt: tuple[str, str], ids: list) -> None:
    body = _json_request(attempt[1], attempt[0], "00000000000000cc")
    attrs = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    kind = "doubleValue" if isinstance(ids[0], float) else "stringValue" if isinstance(ids[0], str) else "intValue"
    attrs[-1] = {"key": "spanlab.response_token_ids",
                 "value": {"arrayValue": {"values": [{kind: v if kind != "intValue" else str(v)} for v in ids]}}}
    resp = httpx.post(f"{server.url}/v1/traces", headers=AUTH, json=body)
    assert resp.status_code == 422 and "response_token_ids" in resp.json()["detail"], resp.text
    assert list(client.iter_spans(attempt_ids=[attempt[1]])) == []


def _with_messages(request: dict, messages: str) -> dict:
    span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"].append({"key": "gen_ai.input.messages", "value": {"stringValue": messages}})
    return request


def test_json_the_policy_refuses_gets_a_4xx_never_a_500(server: ServerProcess, client: StoreClient,
                                                         attempt: tuple[str, str]) -> None:
    """Issue 42, item 5: each of these answered 500 (AttributeError, RecursionError)."""
    url, before = f"{server.url}/v1/traces", _count(client)
    request = _json_request(attempt[1], attempt[0], "0000000000000042")
    deep = '[{"role":"user","parts":' + "[" * 5000 + "]" * 5000 + "}]"
    cases = [
        (json.dumps(_with_messages(json.loads(json.dumps(request)), "[{bad")).encode(), 422,
         "gen_ai.input.messages is not JSON"),
        (json.dumps(_with_messages(json.loads(json.dumps(request)), "[1, 2]")).encode(), 422,
         "gen_ai.input.messages must be a JSON list of message objects"),
        (json.dumps(_with_messages(json.loads(json.dumps(request)), deep)).encode(), 422, "nested deeper"),
        (b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 422, "nested deeper"),
        (b'{"resourceSpans":[],"x":NaN}', 422, "NaN"),
        (b'{"resourceSpans":[],"x":"\\ud800"}', 422, "surrogate"),
    ]
    for body, status, says in cases:
        resp = httpx.post(url, headers={**AUTH, "content-type": "application/json"}, content=body)
        assert (resp.status_code, says in resp.json()["detail"]) == (status, True), resp.text[:300]
    assert _count(client) == before
