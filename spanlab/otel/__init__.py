"""OpenTelemetry in: OTLP/HTTP trace requests as spans of the store (``POST /v1/traces``, store server).

:func:`read_request` decodes a body (:mod:`.decode`: protobuf or JSON, gzip) and maps its spans
(:mod:`.mapping`: attribution by ``spanlab.rollout_id``/``spanlab.attempt_id``, kinds; :mod:`.genai`: GenAI
semantic-convention fields). Needs the ``otel`` extra (``opentelemetry-proto``).
"""

from __future__ import annotations

from spanlab.otel.decode import (
    JSON,
    PROTOBUF,
    OtlpError,
    OtlpUnavailableError,
    answer,
    gunzip,
    media_type,
    parse_traces,
)
from spanlab.otel.mapping import to_spans
from spanlab.types import Span

__all__ = ["JSON", "PROTOBUF", "OtlpError", "OtlpUnavailableError", "answer", "read_request"]


def read_request(body: bytes, content_type: str | None, content_encoding: str | None,
                 max_bytes: int) -> tuple[str, list[Span]]:
    """(the body's media type, its spans); :class:`OtlpError` or ``InvalidSpanError`` for bad input."""
    kind = media_type(content_type)
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = gunzip(body, max_bytes)
    elif encoding != "identity":
        raise OtlpError(f"Content-Encoding {encoding!r} is not supported (gzip or none)", 415)
    return kind, to_spans(parse_traces(body, kind))
