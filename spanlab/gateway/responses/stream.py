"""Chat completion chunks in, Responses API events out, as they arrive.

A streamed ``/v1/responses`` call runs as a streamed chat call; :class:`ResponsesStream` turns each chat
chunk into the Responses events it implies (an output item opened on its first text or tool-call delta,
then ``output_text.delta`` / ``function_call_arguments.delta``), and, once the chat stream has ended,
closes every item and sends ``response.completed`` (``response.incomplete`` when cut by the token limit)
with the whole response, built from the folded chunks by the same :func:`to_response` as an unstreamed
call. The chat stream ends only after the gateway stored the call's span, so ``response.completed``
always follows a stored span. An error inside the chat stream ends the events with an ``error`` event,
which the openai SDK raises as ``APIError``.
"""

from __future__ import annotations

import time
from typing import Any

from spanlab.gateway.protocol import dumps
from spanlab.gateway.records import StreamAccumulator
from spanlab.gateway.responses.protocol import base_id, to_response
from spanlab.gateway.translated import chunk_error, first_choices


class ResponsesStream:
    """The Responses events of one streamed call (``start``, ``add`` per chat chunk, ``finish``)."""

    def __init__(self, body: dict[str, Any], response_id: str) -> None:
        self.body = body
        self.response_id = response_id
        self.acc = StreamAccumulator("chat")
        self.error: dict[str, Any] | None = None
        self._seq = 0
        self._base: str | None = None
        self._opened: list[str] = []  # item IDs in the order they were opened (their output_index)
        self._message: str | None = None
        self._calls: dict[int, str] = {}  # tool-call index -> item ID
        self._logprobs: list[dict[str, Any]] = []
        self._created = int(time.time())  # the same in response.created and response.completed

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = dumps({"type": kind, **fields, "sequence_number": self._seq})
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _open(self, item: dict[str, Any]) -> list[bytes]:
        self._opened.append(item["id"])
        return [self._event("response.output_item.added", output_index=len(self._opened) - 1, item=item)]

    def start(self) -> bytes:
        empty = {"id": None, "created": self._created, "model": self.body.get("model"), "choices": [{}]}
        pending = {**to_response(empty, self.body), "id": self.response_id, "status": "in_progress", "usage": None}
        return self._event("response.created", response=pending) + self._event("response.in_progress",
                                                                                response=pending)

    def add(self, chunk: dict[str, Any]) -> bytes:
        if (error := chunk_error(chunk)) is not None:
            self.error = error
            return b""
        self.acc.add(chunk)
        if self._base is None:
            self._base = base_id(chunk.get("id"))
        out: list[bytes] = []
        for choice in first_choices(chunk):
            out += self._choice(choice)
        return b"".join(out)

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta") or {}
        if (choice.get("logprobs") or {}).get("content"):
            self._logprobs += choice["logprobs"]["content"]
        if text := delta.get("content"):
            if self._message is None:
                self._message = f"msg_{self._base}"
                out += self._open({"type": "message", "id": self._message, "role": "assistant",
                                   "status": "in_progress", "content": []})
                out.append(self._event("response.content_part.added", item_id=self._message,
                                       output_index=self._opened.index(self._message), content_index=0,
                                       part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
            out.append(self._event("response.output_text.delta", item_id=self._message,
                                   output_index=self._opened.index(self._message), content_index=0, delta=text,
                                   logprobs=[]))
        for call in delta.get("tool_calls") or ():
            index, fn = call.get("index", 0), call.get("function") or {}
            if index not in self._calls:
                self._calls[index] = f"fc_{self._base}_{index}"
                out += self._open({"type": "function_call", "id": self._calls[index], "call_id": call.get("id"),
                                   "name": fn.get("name"), "arguments": "", "status": "in_progress"})
            if fn.get("arguments"):
                out.append(self._event("response.function_call_arguments.delta", item_id=self._calls[index],
                                       output_index=self._opened.index(self._calls[index]), delta=fn["arguments"]))
        return out

    def finish(self) -> bytes:
        """Close every item and send the whole response (or the error that ended the stream)."""
        if self.error is not None:
            return self._event("error", code=self.error.get("code") or self.error.get("type"),
                               message=str(self.error.get("message")), param=None)
        record = self.acc.result()
        choice = record.choices[0] if record.choices else None
        chat = {"id": record.response_id, "created": self._created, "model": record.model, "usage": record.usage,
                "choices": [{
            "index": 0, "message": choice.message if choice else {}, "finish_reason": choice and choice.finish_reason,
            "logprobs": {"content": self._logprobs} if self._logprobs else None}]}
        response = {**to_response(chat, self.body), "id": self.response_id}
        streamed = {item_id: i for i, item_id in enumerate(self._opened)}
        response["output"].sort(key=lambda item: streamed.get(item["id"], len(streamed)))
        out: list[bytes] = []
        for index, item in enumerate(response["output"]):
            if item["id"] not in streamed:  # e.g. reasoning, which is not streamed: opened and closed here
                out.append(self._event("response.output_item.added", output_index=index, item=item))
            ref = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                part = item["content"][0]
                out += [self._event("response.output_text.done", **ref, content_index=0, text=part["text"],
                                    logprobs=part.get("logprobs") or []),
                        self._event("response.content_part.done", **ref, content_index=0, part=part)]
            elif item["type"] == "function_call":
                out.append(self._event("response.function_call_arguments.done", **ref, name=item["name"],
                                       arguments=item["arguments"]))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        out.append(self._event(final, response=response))
        return b"".join(out)
