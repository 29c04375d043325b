"""Chat completion chunks in, Anthropic Messages stream events out, as they arrive.

A streamed ``/v1/messages`` call runs as a streamed chat call (with ``include_usage``); :class:`MessagesStream`
turns each chat chunk into the events the ``anthropic`` SDK parses: ``message_start`` first, then per content
block ``content_block_start``, its deltas (``text_delta``, ``thinking_delta``, ``input_json_delta`` with the
tool call's argument pieces as the engine streamed them) and ``content_block_stop`` when the next block opens
or the stream ends; after the chat stream ended, ``message_delta`` (``stop_reason``, ``stop_sequence``, the
usage: input and output token counts) and ``message_stop``. The chat stream ends only after the gateway stored
the call's span, so ``message_stop`` always follows a stored span. An error inside the chat stream ends the
events with an ``error`` event, which the SDK raises as ``APIStatusError``.
"""

from __future__ import annotations

from typing import Any

from spanlab.gateway.messages.reply import error_type, stop_reason, usage
from spanlab.gateway.protocol import dumps
from spanlab.gateway.translated import chunk_error, first_choices

BlockKind = str  # "text", "thinking" or "tool_use"


class MessagesStream:
    """The Messages events of one streamed call (``start``, ``add`` per chat chunk, ``finish``)."""

    def __init__(self, body: dict[str, Any], message_name: str) -> None:
        self.body = body
        self.message_name = message_name
        self.error: dict[str, Any] | None = None
        self._blocks = 0  # blocks opened so far; the next block's index
        self._active: tuple[BlockKind, int | None] | None = None  # (kind, chat tool-call index) of the open block
        self._tool_blocks: dict[int, int] = {}  # chat tool-call index -> block index
        self._finish: str | None = None
        self._stop: Any = None
        self._usage: dict[str, Any] | None = None
        self._model: str | None = None

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields}) + b"\n\n"

    def start(self) -> bytes:
        message = {"id": self.message_name, "type": "message", "role": "assistant", "content": [],
                   "model": self.body.get("model"), "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return self._event("message_start", message=message)

    def _close(self) -> list[bytes]:
        if self._active is None:
            return []
        self._active = None
        return [self._event("content_block_stop", index=self._blocks - 1)]

    def _open(self, kind: BlockKind, block: dict[str, Any], tool_index: int | None = None) -> list[bytes]:
        out = self._close()
        self._active = (kind, tool_index)
        self._blocks += 1
        return [*out, self._event("content_block_start", index=self._blocks - 1, content_block=block)]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        return self._event("content_block_delta", index=self._blocks - 1 if index is None else index, delta=delta)

    def add(self, chunk: dict[str, Any]) -> bytes:
        if (error := chunk_error(chunk)) is not None:
            self.error = error
            return b""
        self._model = self._model or chunk.get("model")
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        out: list[bytes] = []
        for choice in first_choices(chunk):
            out += self._choice(choice)
        return b"".join(out)

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta") or {}
        if thinking := delta.get("reasoning") or delta.get("reasoning_content"):
            if self._active != ("thinking", None):
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        if text := delta.get("content"):
            if self._active != ("text", None):
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            index, fn = call.get("index", 0), call.get("function") or {}
            if index not in self._tool_blocks:
                out += self._open("tool_use", {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                                               "input": {}}, index)
                self._tool_blocks[index] = self._blocks - 1
            if fn.get("arguments"):  # to its own block, should a parser send a piece of an earlier call late
                out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]},
                                       self._tool_blocks[index]))
        if choice.get("finish_reason") is not None:
            self._finish, self._stop = choice["finish_reason"], choice.get("stop_reason")
        return out

    def finish(self) -> bytes:
        """Close the open block and end the message (or send the error that ended the stream)."""
        if self.error is not None:
            status = self.error.get("code") if isinstance(self.error.get("code"), int) else 500
            return self._event("error", error={"type": error_type(status), "message": str(self.error.get("message"))})
        out = self._close()
        if self._blocks == 0:  # an empty answer is one empty text block, as unstreamed
            out += self._open("text", {"type": "text", "text": ""}) + self._close()
        reason, sequence = stop_reason(self._finish, self._stop, bool(self._tool_blocks))
        out.append(self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                               usage=usage(self._usage)))
        out.append(self._event("message_stop"))
        return b"".join(out)
