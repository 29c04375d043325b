"""The data model every spanlab component speaks: rollouts, attempts, spans, rewards, resources.

Pydantic models sit at the boundaries (store API, HTTP, config) and validate on construction, so a
span that reaches the store is already well-formed: token IDs are real ints (never strings or
floats), logprobs are finite floats, an ``llm_call`` span carries its LLM fields and a ``reward``
span its reward. Timestamps are Unix epoch seconds (float) to keep conversions cheap.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from spanlab.vectors import float_vector, int_vector, to_list

RolloutStatus = Literal["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "timeout", "unresponsive"]
FinishedAttemptStatus = Literal["failed", "succeeded", "timeout", "unresponsive"]
RetryableStatus = Literal["failed", "timeout", "unresponsive"]
RolloutMode = Literal["train", "val", "test"]
SpanKind = Literal["llm_call", "tool_call", "reward", "message", "custom", "demonstration"]
TOKEN_SPAN_KINDS: frozenset[str] = frozenset({"llm_call", "demonstration"})  # the kinds that carry `llm` token fields
SpanStatus = Literal["ok", "error", "unset"]
ResourceKind = Literal["prompt_template", "model_checkpoint", "lora_adapter", "llm_endpoint", "other"]

TERMINAL_ROLLOUT_STATUSES: frozenset[str] = frozenset({"failed", "succeeded", "cancelled"})
ACTIVE_ATTEMPT_STATUSES: frozenset[str] = frozenset({"preparing", "running"})

# Every number of the model is bounded to what its DuckDB column holds and to what makes sense: a value the
# column cannot hold (2**31 in an INTEGER) would be accepted here and fail only when the store writes its
# tables, so one bad record could stop every later write. Refused at construction instead.
MAX_INT32 = 2**31 - 1
MAX_TOKEN_ID = MAX_INT32  # stored as INTEGER (int32)
MAX_ATTEMPTS = 1000  # retries of one rollout; more is a bug in the caller, not a policy
MAX_TIMEOUT_S = 366 * 24 * 3600.0  # a year: longer is "no limit", which None says
Int32 = Annotated[int, Field(ge=0, le=MAX_INT32)]
Count = Int32  # token counts: the same bound, named for what they are
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)]
Timestamp = Annotated[float, Field(ge=0, allow_inf_nan=False, description="Unix epoch seconds")]


_ListSerializer = PlainSerializer(to_list, when_used="json")
# PlainValidator: our NumPy check is the whole validation (pydantic must not walk elements again).
TokenIds = Annotated[
    Any,
    PlainValidator(lambda v: int_vector(v, "token IDs", 0, MAX_TOKEN_ID, np.int32)),
    _ListSerializer,
    WithJsonSchema({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}}),
]
LossMask = Annotated[
    Any,
    PlainValidator(lambda v: int_vector(v, "loss_mask", 0, 1, np.uint8)),
    _ListSerializer,
    WithJsonSchema({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1}}),
]
Logprobs = Annotated[
    Any,
    PlainValidator(lambda v: float_vector(v, "response_logprobs")),
    _ListSerializer,
    WithJsonSchema({"type": "array", "items": {"type": "number"}}),
]


def now() -> float:
    return time.time()


def version_tag(policy: str, version: int) -> str:
    """What spans record as the version of ``policy`` that answered them (``lora-a-v3``)."""
    return f"{policy}-v{version}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class StrictModel(BaseModel):
    """Base for boundary models: unknown keys are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class RolloutConfig(StrictModel):
    """Per-rollout policy: how long an attempt may run and when a failed attempt is retried."""

    timeout_s: Seconds | None = Field(default=None, description="wall-clock limit per attempt")
    unresponsive_s: Seconds | None = Field(default=None, description="max seconds between heartbeats")
    max_attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS)
    retry_on: tuple[RetryableStatus, ...] = ("failed", "timeout", "unresponsive")


class Rollout(StrictModel):
    """One task to run: its input, which split it belongs to, and where it stands in the queue."""

    rollout_id: str = Field(default_factory=lambda: new_id("ro"), min_length=1)
    input: Any = None
    mode: RolloutMode = "train"
    status: RolloutStatus = "queuing"
    resources_version: str | None = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    enqueue_time: Timestamp = Field(default_factory=now)
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    num_attempts: int = Field(default=0, ge=0, le=MAX_ATTEMPTS)

    @model_validator(mode="after")
    def _attempts_within_policy(self) -> Rollout:
        """A waiting rollout must have an attempt left: its next attempt's number is ``num_attempts + 1``,
        and one past ``max_attempts`` would make a record that no later read accepts."""
        if self.num_attempts > self.config.max_attempts:
            raise ValueError(f"num_attempts {self.num_attempts} is over config.max_attempts "
                             f"{self.config.max_attempts}")
        if self.status in ("queuing", "requeuing") and self.num_attempts >= self.config.max_attempts:
            raise ValueError(f"a {self.status} rollout needs an attempt left: num_attempts {self.num_attempts} "
                             f"must be under config.max_attempts {self.config.max_attempts}")
        return self


class Attempt(StrictModel):
    """One try at a rollout by one worker; spans belong to attempts."""

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(ge=1, le=MAX_ATTEMPTS, description="1 for the first attempt, 2 for the retry, ...")
    worker_id: str | None = None
    status: AttemptStatus = "preparing"
    start_time: Timestamp = Field(default_factory=now)
    end_time: Timestamp | None = None
    last_heartbeat_time: Timestamp | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Usage(StrictModel):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count


class LLMCall(StrictModel):
    """The first-class fields of an ``llm_call`` span: what went in, what came out, as exact token IDs.

    Token fields accept lists or 1-D NumPy arrays (kept as given; arrays make bulk ingest cheap).
    ``response_token_ids`` includes the stop token as vLLM returns it. ``loss_mask`` (0/1 per token of
    prompt + response) is set for session buffers, where tool-result tokens inside the sequence must not
    be trained on.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str
    request_messages: list[dict[str, Any]] = Field(default_factory=list)
    request_tools: list[dict[str, Any]] | None = None
    response_message: dict[str, Any] | None = None
    finish_reason: str | None = None
    prompt_token_ids: TokenIds = Field(default_factory=list)
    response_token_ids: TokenIds = Field(default_factory=list)
    response_logprobs: Logprobs | None = None
    loss_mask: LossMask | None = None
    usage: Usage | None = None

    @model_validator(mode="after")
    def _lengths_agree(self) -> LLMCall:
        n_resp = len(self.response_token_ids)
        if self.response_logprobs is not None and len(self.response_logprobs) != n_resp:
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries "
                f"but response_token_ids has {n_resp}"
            )
        n_all = len(self.prompt_token_ids) + n_resp
        if self.loss_mask is not None and len(self.loss_mask) != n_all:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries but prompt+response has {n_all} tokens")
        return self


class Reward(StrictModel):
    """A scalar reward; ``call_span_id`` attaches it to one LLM call (an intermediate reward). Whether it is the
    attempt's final reward is its span's ``attributes.final`` (:func:`reward_span`, :mod:`spanlab.adapters.trainable`).
    """

    name: str = "reward"
    value: float
    call_span_id: str | None = None

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward value must be finite")
        return v


class Span(StrictModel):
    """One recorded event of an attempt. ``sequence_id`` orders spans within the attempt.

    ``rollout_id``/``attempt_id`` are both None for an unattributed call (the gateway saw a request
    that named no rollout). ``sequence_id`` is assigned by the store when left None.
    """

    rollout_id: str | None = None
    attempt_id: str | None = None
    sequence_id: Int32 | None = None
    span_id: str = Field(default_factory=lambda: new_id("sp"), min_length=1)
    parent_id: str | None = None
    name: str
    kind: SpanKind
    start_time: Timestamp = Field(default_factory=now)
    end_time: Timestamp | None = None
    status: SpanStatus = "ok"
    attributes: dict[str, Any] = Field(default_factory=dict)
    llm: LLMCall | None = None
    reward: Reward | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> Span:
        if (self.rollout_id is None) != (self.attempt_id is None):
            raise ValueError("rollout_id and attempt_id must both be set or both be None")
        if self.kind in TOKEN_SPAN_KINDS and self.llm is None:
            raise ValueError(f"a {self.kind} span needs its `llm` fields")
        if self.kind not in TOKEN_SPAN_KINDS and self.llm is not None:
            raise ValueError(f"only llm_call and demonstration spans carry `llm` fields, not {self.kind!r}")
        if self.kind == "reward" and self.reward is None:
            raise ValueError("a reward span needs its `reward` field")
        if self.kind != "reward" and self.reward is not None:
            raise ValueError(f"only reward spans carry `reward`, not {self.kind!r}")
        if self.kind == "reward" and not isinstance(self.attributes.get("final", False), bool):
            raise ValueError(f"a reward span's attributes.final is true or false, not {self.attributes['final']!r}")
        return self


# A reward span that reached the store after its attempt had ended (a timed-out attempt whose agent finished late)
# is kept with ``attributes["late"] = true``, set by the store; it is never the attempt's final reward
# (:mod:`spanlab.adapters.trainable`, rule 3), in training or in any view.
LATE_ATTRIBUTE = "late"


def reward_span(rollout_id: str, attempt_id: str, value: float, *, name: str = "reward",
                call_span_id: str | None = None, final: bool | None = None,
                attributes: dict[str, Any] | None = None) -> Span:
    """A reward span for an attempt; ``call_span_id`` ties it to one call. ``final`` marks it the attempt's outcome
    (True: what the runner records from the agent's return) or an intermediate reward (False: ``ctx.add_reward``);
    None leaves it unmarked, read as stores before the marker were: final when it is the attempt's last reward
    tied to no call and none is marked final (:mod:`spanlab.adapters.trainable`). ``attributes``: what the reward
    was scored on (a task family and its settings), kept beside the marker."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=name,
        kind="reward",
        attributes={**(attributes or {}), **({} if final is None else {"final": final})},
        reward=Reward(name=name, value=value, call_span_id=call_span_id),
    )


METRIC_ATTRIBUTE = "metric"  # a measurement span's value: ``attributes["metric"]`` of a ``custom`` span
_METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def metric_span(rollout_id: str, attempt_id: str, name: str, value: float) -> Span:
    """A named measurement of an attempt (``calc.extra_ops``): a ``custom`` span named ``name`` whose
    ``attributes["metric"]`` is ``value``.

    Not a reward span on purpose: every reward span is credit some algorithm trains on (per-turn credit sums
    the rewards after a turn), and a measurement must never become one. Held-out evaluations report each
    name's mean per split and phase. ``accuracy`` is taken (the reward's own mean); a name has no ``/``
    (train_metrics keeps flat keys only).
    """
    if not _METRIC_NAME.fullmatch(name) or name == "accuracy":
        raise ValueError(f"metric name {name!r}: use a letter, then letters, digits, '_', '.' or '-' (at most 64), "
                         "and not 'accuracy'")
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"metric {name!r}: value must be a finite number, got {value!r}")
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name, kind="custom",
                attributes={METRIC_ATTRIBUTE: float(value)})


class Resource(StrictModel):
    """A versioned named payload: a prompt template, a checkpoint path, a LoRA adapter reference.

    Versions count up from 1 per name; rollouts record the version string ``name@version`` they used.
    """

    name: str = Field(min_length=1)
    version: int | None = Field(default=None, ge=1, le=MAX_INT32, description="assigned by the store")
    kind: ResourceKind = "other"
    payload: dict[str, Any] = Field(default_factory=dict)
    created_time: Timestamp = Field(default_factory=now)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"
