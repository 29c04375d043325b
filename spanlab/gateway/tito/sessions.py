"""The gateway's TITO state: one :class:`~spanlab.tito.buffer.SessionBuffer` per (rollout, attempt, agent).

Why per attempt: an attempt is one agent run, so its chat calls form one conversation; the gateway keeps
that conversation's token buffer and serves each extending call from it (prompt = buffer + stop gap +
delta). A call that does not extend the buffer (history rewritten, compacted, edited, tools changed)
starts a new *segment* whose prompt is the engine's own render; earlier segments stay as they were
(frozen). The roles of a multi-agent attempt (``agent`` in the call's URL) are separate conversations, so
each gets its own buffer. A call of an attempt whose previous call is still in flight cannot extend the buffer (its last
turn is not sampled yet), so it is served per call instead (:meth:`TitoSessions.acquire` returns None).

The tokenizer work (two or three template renders per call) is pure CPU; callers run :meth:`plan` in a
worker thread. Buffers are kept for the ``max_sessions`` most recently used attempts.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from spanlab.tito.buffer import SessionBuffer, normalize_message
from spanlab.tito.messages import engine_form
from spanlab.tito.readiness import TitoTemplate

logger = logging.getLogger(__name__)

TurnEvent = Literal["start", "extend", "new_segment"]
SessionKey = tuple[str, str, str]  # (rollout_id, attempt_id, agent or "")
Message = dict[str, Any]


@dataclass
class Session:
    """One attempt's buffer plus what the gateway needs between its calls."""

    buffer: SessionBuffer | None = None
    busy: bool = False
    calls: int = 0
    last_finish_reason: str | None = None
    last_turn_closed: bool = False  # engine path: the last turn ended on its stop token (not cut)
    opened: list[int] | None = None  # engine path: the render that prompted the last turn (for the stop gap)


@dataclass
class TitoTurn:
    """One call being served from a session: the prompt sent and how it came about."""

    session: Session
    call: int
    event: TurnEvent
    reason: str | None = None  # why a new segment started
    checkpoint: Any = None  # SessionBuffer.checkpoint() before this call (None: the session had no buffer)
    prompt_ids: list[int] = field(default_factory=list)
    segment: int = 0
    offset: int = 0  # where the segment starts in the whole session
    added_tokens: int = 0  # prompt tokens this call added (gap + delta, or the whole new segment)
    rendered: list[int] | None = None  # engine path: the engine's render of this call's conversation

    def attributes(self) -> dict[str, Any]:
        """``attributes.tito`` of the call's span: what the ``tito_sessions`` view and drift report read."""
        out: dict[str, Any] = {"mode": "tito", "call": self.call, "segment": self.segment, "offset": self.offset,
                               "event": self.event, "added_tokens": self.added_tokens}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class TitoSessions:
    """Buffers of the attributed sessions, the tokenizer and the template they are rendered with."""

    def __init__(self, tokenizer: Any, template: TitoTemplate | None, max_sessions: int,
                 close_ids: list[int] | None = None) -> None:
        self.tokenizer = tokenizer  # None on the engine path (the engine renders)
        self.template = template
        self.max_sessions = max_sessions
        self.close_ids = close_ids if template is None else template.close_ids
        self._sessions: OrderedDict[SessionKey, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def acquire(self, key: SessionKey) -> Session | None:
        """The attempt's session, marked busy; None when another call of it is in flight (event loop only)."""
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session()
            self._evict()
        elif session.busy:
            return None
        self._sessions.move_to_end(key)
        session.busy = True
        return session

    def _evict(self) -> None:
        while len(self._sessions) > self.max_sessions:
            key, oldest = next(iter(self._sessions.items()))
            if oldest.busy:  # never drop a session mid-call; the next idle one goes instead
                self._sessions.move_to_end(key)
                if all(s.busy for s in self._sessions.values()):
                    return
                continue
            del self._sessions[key]
            logger.debug("TITO: dropped the buffer of attempt %s (least recently used)", key[1])

    def plan(self, session: Session, messages: list[Message], tools: list[Message] | None) -> TitoTurn:
        """Extend the session's buffer for ``messages`` (worker thread). A turn whose ``prompt_ids`` is empty
        needs a new segment: the caller gets the engine's render and calls :meth:`start_segment`."""
        turn = self.begin(session)
        buf = session.buffer
        if buf is None:
            return turn
        before = len(buf.ids)
        if buf.extend(engine_form(messages), self.tokenizer, tools, close_ids=self.close_ids) is None:
            turn.event, turn.reason = "new_segment", self.why_not(buf, messages, tools, session.last_finish_reason)
            return turn
        turn.added_tokens = len(buf.ids) - before
        return self.fill(turn, buf)

    @staticmethod
    def begin(session: Session) -> TitoTurn:
        """A new call of ``session``: ``start`` without a buffer, else ``extend`` (with a checkpoint to undo)."""
        session.calls += 1
        buf = session.buffer
        if buf is None:
            return TitoTurn(session, session.calls - 1, "start")
        return TitoTurn(session, session.calls - 1, "extend", checkpoint=buf.checkpoint())

    def start_segment(self, turn: TitoTurn, prompt_ids: list[int], messages: list[Message],
                      tools: list[Message] | None) -> TitoTurn:
        """Begin the session (or a new segment) with the engine's render of ``messages`` (all prompt, mask 0)."""
        session = turn.session
        # The local renderer wants transformers' form (arguments as dicts); the engine's render the OpenAI form.
        kept = engine_form(messages) if self.tokenizer is not None else [dict(m) for m in messages]
        if session.buffer is None:
            session.buffer = SessionBuffer.start(prompt_ids, kept, tools)
        else:
            session.buffer.new_segment(prompt_ids, kept, tools)
        turn.added_tokens = len(prompt_ids)
        return self.fill(turn, session.buffer)

    @staticmethod
    def fill(turn: TitoTurn, buf: SessionBuffer) -> TitoTurn:
        turn.segment, turn.offset = len(buf.segments) - 1, buf.segments[-1]
        turn.prompt_ids = buf.ids[turn.offset :]
        return turn

    def commit(self, turn: TitoTurn, sampled_ids: list[int], message: Message, finish_reason: str | None) -> list[int]:
        """Append the sampled turn; returns the segment's loss mask over prompt + response."""
        session, buf = turn.session, turn.session.buffer
        assert buf is not None, "commit needs a planned turn"
        buf.append_sampled(sampled_ids, message)
        session.last_finish_reason = finish_reason
        session.busy = False
        return buf.mask[turn.offset :]

    def abort(self, turn: TitoTurn | None, session: Session) -> None:
        """The call failed: undo whatever this turn added, free the session."""
        if turn is not None:
            if turn.checkpoint is not None and session.buffer is not None:
                session.buffer.rollback(turn.checkpoint)
            elif turn.event == "start":
                session.buffer = None
        session.busy = False

    @staticmethod
    def why_not(buf: SessionBuffer, messages: list[Message], tools: list[Message] | None,
                 last_finish: str | None) -> str:
        """Why a call did not extend the buffer, for ``attributes.tito.reason``."""
        if json.dumps(tools, sort_keys=True) != json.dumps(buf.tools, sort_keys=True):
            return "tools_changed"
        n = len(buf.messages)
        if len(messages) <= n or any(normalize_message(a) != normalize_message(b)
                                     for a, b in zip(messages[:n], buf.messages, strict=False)):
            return "history_rewritten"
        if last_finish == "length":
            return "truncated"
        return "no_safe_seam"
