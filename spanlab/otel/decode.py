"""OTLP/HTTP trace bodies (protobuf or JSON, optionally gzipped) as an ``ExportTraceServiceRequest``.

The OTLP JSON encoding is proto3 JSON with two differences (OTLP spec, "JSON Protobuf Encoding"):
trace and span IDs are hex strings, not base64, and enums are integers. IDs are rewritten to base64
before ``json_format.Parse`` so one parser serves both encodings. Needs the ``otel`` extra
(``opentelemetry-proto``); without it :func:`parse_traces` raises :class:`OtlpUnavailableError`.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

from spanlab.errors import SpanlabError
from spanlab.jsonpolicy import JSONPolicyError, decode

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


class OtlpError(SpanlabError, ValueError):
    """An OTLP body that cannot be read; ``status_code`` is the HTTP answer (400 or 415)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


class OtlpUnavailableError(OtlpError):
    def __init__(self) -> None:
        super().__init__("OTLP ingest needs the `otel` extra: pip install 'spanlab[otel]'", 501)


def _pb2() -> Any:
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError as exc:
        raise OtlpUnavailableError() from exc
    return trace_service_pb2


def media_type(content_type: str | None) -> str:
    """The body's encoding from its Content-Type; 415 for anything OTLP/HTTP does not define."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise OtlpError(f"Content-Type must be {PROTOBUF} or {JSON} for /v1/traces, not {kind or 'none'!r}", 415)
    return kind


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """Inflate a gzip body, refusing more than ``max_bytes`` out (a small bomb must not fill memory)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpError(f"Content-Encoding is gzip but the body is not: {exc}") from exc
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise OtlpError(f"the inflated body is over the {max_bytes}-byte limit", 413)
    return out


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError as exc:
                    raise OtlpError(f"{key} must be a hex string in OTLP JSON, not {value[:40]!r}") from exc
            out[key] = _hex_ids_to_base64(value)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def parse_traces(body: bytes, kind: str) -> Any:
    """The request message; :class:`OtlpError` (400) for a body that is not one."""
    pb2 = _pb2()
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    request = pb2.ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise OtlpError(f"the body is not an OTLP ExportTraceServiceRequest (protobuf): {exc}") from exc
        return request
    try:
        data = decode(body, what="the body")
    except JSONPolicyError as exc:  # not JSON: 400 as before; JSON the policy refuses: 422, as on every surface
        raise OtlpError(str(exc), 400 if exc.syntax else 422) from None
    if not isinstance(data, dict):
        raise OtlpError("the body must be a JSON object (an OTLP ExportTraceServiceRequest)")
    try:
        json_format.ParseDict(_hex_ids_to_base64(data), request)
    except (json_format.ParseError, binascii.Error, TypeError, ValueError) as exc:
        raise OtlpError(f"the body is not an OTLP ExportTraceServiceRequest (JSON): {exc}") from exc
    return request


def answer(kind: str) -> bytes:
    """The success body in the request's own encoding (an empty ExportTraceServiceResponse)."""
    return _pb2().ExportTraceServiceResponse().SerializeToString() if kind == PROTOBUF else b"{}"
