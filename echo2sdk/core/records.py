"""Trajectory records tau = (x, y, r, v, Omega) (paper appendix F.1) and their validation.

Records are immutable values. They cross the wire as msgpack (never pickle); `from_wire` re-validates
everything, so a peer cannot smuggle a wrong type, a NaN reward or a negative version past intake.
Checks that need context the record does not carry (the learner's version, the vocabulary size, the
maximum length) live in `check_admissible`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from echo2sdk.errors import TrajectoryRejected

__all__ = ["Message", "Meta", "Trajectory", "SCHEMA_VERSION", "check_admissible", "pack", "unpack"]

SCHEMA_VERSION = 1

_FROZEN = ConfigDict(frozen=True, strict=True, extra="forbid")

Scalar = str | int | float | bool | None


class Message(BaseModel):
    """One chat message of a prompt."""

    model_config = _FROZEN
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Meta(BaseModel):
    """Omega: what the learner needs besides (x, y, r, v)."""

    model_config = _FROZEN
    group_id: str = Field(min_length=1, description="GRPO group: n samples of one prompt under one version")
    prompt_ids: tuple[int, ...] = Field(min_length=1, description="prompt token ids as the sampler saw them")
    response_ids: tuple[int, ...] = Field(min_length=1, description="sampled response token ids")
    logprobs: tuple[Annotated[float, Field(allow_inf_nan=False, le=0.0)], ...] = Field(
        description="the sampler's per-token log-probs of response_ids (pi_sampler)"
    )
    loss_mask: tuple[int, ...] | None = Field(
        default=None, description="1 where a response token carries loss (multi-turn); None = all"
    )
    off_policy: bool = Field(
        default=False,
        description="response tokens replayed from a log, not sampled: logprobs are placeholders and the "
        "learner takes pi_sampler = pi_old (w_t = 1)",
    )
    worker: str = Field(default="", description="id of the worker that produced the record")
    extra: dict[str, Scalar] = Field(default_factory=dict, description="task metadata (e.g. 'correct')")

    @model_validator(mode="after")
    def _lengths_agree(self) -> Meta:
        n = len(self.response_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"logprobs has {len(self.logprobs)} entries, response_ids has {n}")
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries, response_ids has {n}")
        return self


class Trajectory(BaseModel):
    """tau = (x, y, r, v, Omega): prompt, response, reward, snapshot version, metadata."""

    model_config = _FROZEN
    prompt: str | tuple[Message, ...] = Field(description="x: text or chat messages")
    response: str = Field(description="y: the decoded response")
    reward: Annotated[float, Field(allow_inf_nan=False)] = Field(description="r = R(x, y), finite")
    version: int = Field(ge=0, description="v: the snapshot version that generated y")
    meta: Meta = Field(description="Omega")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="python")

    @classmethod
    def from_wire(cls, obj: object) -> Trajectory:
        """Validate a decoded wire object; raise TrajectoryRejected naming the first bad field."""
        try:
            return cls.model_validate(obj)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "<record>"
            reason = "nan_reward" if field == "reward" and _is_nan(err.get("input")) else "schema"
            raise TrajectoryRejected(reason, field, err.get("input"), err["msg"]) from None


def _is_nan(x: object) -> bool:
    return isinstance(x, float) and math.isnan(x)


def check_admissible(
    t: Trajectory, *, learner_version: int, staleness: int, vocab_size: int, max_len: int
) -> None:
    """Context checks on intake: version window [v_t - S, v_t], token ids in vocabulary, length."""
    if t.version > learner_version:
        raise TrajectoryRejected("future_version", "version", t.version, f"learner is at v_t={learner_version}")
    if t.version < learner_version - staleness:
        raise TrajectoryRejected(
            "stale", "version", t.version, f"older than v_t - S = {learner_version - staleness}"
        )
    for name in ("prompt_ids", "response_ids"):
        ids = getattr(t.meta, name)
        bad = next((i for i in ids if i < 0 or i >= vocab_size), None)
        if bad is not None:
            raise TrajectoryRejected("token_out_of_vocab", f"meta.{name}", bad, f"vocabulary size {vocab_size}")
    total = len(t.meta.prompt_ids) + len(t.meta.response_ids)
    if total > max_len:
        raise TrajectoryRejected("too_long", "meta.response_ids", total, f"prompt+response exceeds {max_len} tokens")


def pack(obj: object) -> bytes:
    """msgpack without any extension types: safe to decode from an untrusted peer."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # use_list=False: sequences decode as tuples, which the strict record schema expects.
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True)
