"""A chat SSE answer re-framed as another API's events: what the Responses and Messages routes stream.

Both serve a streamed request as a streamed chat call (:meth:`Gateway.forward <spanlab.gateway.proxy.Gateway.forward>`)
and translate each chat chunk as it arrives; only the translator differs. The chat answer is the relay's
``StreamingResponse`` or, in TITO mode, one body holding every chunk at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.responses import Response, StreamingResponse

from spanlab.gateway.protocol import loads


class ChunkTranslator(Protocol):
    """Turns one streamed call's chat chunks into another API's SSE events."""

    def start(self) -> bytes: ...

    def add(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes: ...


async def translated_events(answer: Response, translator: ChunkTranslator) -> AsyncIterator[bytes]:
    """The chat SSE stream in ``answer`` as ``translator``'s events; closing it closes the chat stream."""
    chunks = answer.body_iterator if isinstance(answer, StreamingResponse) else _once(answer.body)
    yield translator.start()
    pending = b""
    try:
        async for piece in chunks:
            pending += piece if isinstance(piece, bytes) else str(piece).encode()
            *frames, pending = pending.split(b"\n\n")
            out = [translator.add(chunk) for chunk in map(chat_chunk, frames) if chunk is not None]
            if out:
                yield b"".join(out)
        yield translator.finish()
    finally:
        closing = getattr(chunks, "aclose", None)
        if closing is not None:
            await closing()  # an agent that left: the relay records what was generated


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def chat_chunk(frame: bytes) -> dict[str, Any] | None:
    """A chat SSE frame's JSON object (None for ``[DONE]``, comments and anything else)."""
    for line in frame.split(b"\n"):
        if line.startswith(b"data:") and (data := line[5:].strip()) != b"[DONE]":
            try:
                chunk = loads(data)
            except ValueError:
                return None
            return chunk if isinstance(chunk, dict) else None
    return None


def chunk_error(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The error a chat stream chunk carries, as a dict (a bare string becomes its ``message``); None without one."""
    if "error" not in chunk:
        return None
    error = chunk["error"]
    return error if isinstance(error, dict) else {"message": str(error)}


def first_choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunk's choices of index 0: the translated APIs answer with one."""
    return [choice for choice in chunk.get("choices") or () if choice.get("index", 0) == 0]
