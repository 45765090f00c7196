"""Trajectory records tau = (x, y, r, v, Omega) (paper appendix F.1) and their validation.

Records are immutable values. They cross the wire in a typed binary layout (runtime/protocol/groups.py; never
pickle) that decodes back to the `to_wire` map; `from_wire` re-validates everything, so a peer cannot smuggle a
wrong type, a NaN reward or a negative version past intake.
Checks that need context the record does not carry (the learner's version, the vocabulary size, the
maximum length, the run's reward bound) live in `check_admissible`.

Intake bounds (docs/security.md): every number a record carries is finite and bounded before the learner
sees it. Log-probs lie in [MIN_LOGPROB, 0]; a loss mask holds 0 and 1 only; task metadata (`meta.extra`) has
at most MAX_EXTRA_KEYS keys of at most MAX_ID_CHARS characters, numbers with |x| <= MAX_EXTRA_NUMBER (floats
finite) and strings of at most MAX_EXTRA_TEXT characters (MAX_EXTRA_CHARS of keys and strings in all); the reward
is finite here and |r| <= reward_bound in `check_admissible`. Types are strict: "0.1" is not a reward and True is not a mask entry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgpack
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from echo2sdk.errors import TrajectoryRejected

__all__ = [
    "Message", "Meta", "Trajectory", "SCHEMA_VERSION", "check_admissible", "pack", "unpack",
    "REWARD_BOUND", "MIN_LOGPROB", "MAX_EXTRA_NUMBER", "MAX_EXTRA_TEXT", "MAX_EXTRA_KEYS", "sampler_logprob",
    "bounded_extra", "MAX_CHARS_PER_TOKEN", "MAX_EXTRA_CHARS", "held_bytes", "prompt_chars", "text_limit",
]

SCHEMA_VERSION = 1

REWARD_BOUND = 1e6  # default |r| bound (learner.reward_bound)
MIN_LOGPROB = -1e4  # a sampler log-prob below this is no probability a sampler draws from (exp() is 0)
MAX_EXTRA_NUMBER = float(1 << 63)  # |x| of a number in meta.extra (ids such as seeds are 64-bit)
MAX_EXTRA_TEXT = 4096  # characters of a string in meta.extra
# characters of text per token of the run's max_len (learner.max_len): the bound on a record's prompt text and on
# its response text. Decoded text is a few characters a token; 64 is far above any tokenizer's average, so only
# text that no max_len tokens decode to (a token holder's padding) is refused ("text_too_long").
MAX_CHARS_PER_TOKEN = 64
RECORD_OVERHEAD_BYTES = 1024  # a held record's objects besides its text and token sequences (estimate)
MESSAGE_BYTES = 512  # a chat message's objects besides its content (measured ~480)
MAX_EXTRA_KEYS = 256
MAX_EXTRA_CHARS = 32768  # characters of meta.extra's keys and strings together (a record's bytes stay small)
# what bounded_extra leaves of those for an adapter's info: the runtime adds its own keys after it (correct, turns,
# failed, aborted, ...)
_INFO_KEYS, _INFO_CHARS = MAX_EXTRA_KEYS - 16, MAX_EXTRA_CHARS - 1024
MAX_ID_CHARS = 256  # group ids (task ids), worker ids, meta.extra keys

_FROZEN = ConfigDict(frozen=True, strict=True, extra="forbid")

Scalar = str | int | float | bool | None


def _bounded_scalar(value: Scalar) -> Scalar:
    """A meta.extra value: floats finite, numbers within MAX_EXTRA_NUMBER, strings within MAX_EXTRA_TEXT."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("non_finite", "a number in meta.extra must be finite")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_EXTRA_NUMBER:
        raise PydanticCustomError("out_of_range", "a number in meta.extra must lie in [-2**63, 2**63]")
    if isinstance(value, str) and len(value) > MAX_EXTRA_TEXT:
        raise PydanticCustomError("out_of_range", f"a string in meta.extra has at most {MAX_EXTRA_TEXT} characters")
    return value


def sampler_logprob(lp: float) -> float:
    """A backend's log-prob as a record holds it: in [MIN_LOGPROB, 0] (NaN, from a broken kernel, as MIN_LOGPROB)."""
    return MIN_LOGPROB if math.isnan(lp) else min(max(lp, MIN_LOGPROB), 0.0)


def bounded_extra(info: dict[Any, Any]) -> dict[str, Scalar]:
    """The entries of an adapter's `info` a record can carry: scalar values within the meta.extra bounds
    (strings cut to MAX_EXTRA_TEXT); non-finite or huge numbers, long keys and other types are left out, and so
    are the entries past MAX_EXTRA_KEYS - 16 keys or MAX_EXTRA_CHARS - 1024 characters of keys and strings (room
    for the keys the runtime adds)."""
    out: dict[str, Scalar] = {}
    chars = 0
    for k, v in info.items():
        if len(out) == _INFO_KEYS or not isinstance(k, str) or len(k) > MAX_ID_CHARS:
            continue
        if isinstance(v, str):
            v = v[:MAX_EXTRA_TEXT]
        elif not (v is None or isinstance(v, bool) or (isinstance(v, int | float) and abs(v) <= MAX_EXTRA_NUMBER)):
            continue  # NaN fails the comparison above
        n = len(k) + (len(v) if isinstance(v, str) else 0)
        if chars + n > _INFO_CHARS:
            continue
        out[k], chars = v, chars + n
    return out


def _extra_chars(extra: dict[str, Scalar]) -> dict[str, Scalar]:
    n = sum(len(k) + (len(v) if isinstance(v, str) else 0) for k, v in extra.items())
    if n > MAX_EXTRA_CHARS:
        raise PydanticCustomError("out_of_range", f"meta.extra holds {n} characters of keys and strings, "
                                  f"more than {MAX_EXTRA_CHARS}")
    return extra


Extra = Annotated[
    dict[Annotated[str, Field(max_length=MAX_ID_CHARS)], Annotated[Scalar, AfterValidator(_bounded_scalar)]],
    Field(max_length=MAX_EXTRA_KEYS),
    AfterValidator(_extra_chars),
]
LogProb = Annotated[float, Field(allow_inf_nan=False, ge=MIN_LOGPROB, le=0.0)]
MaskBit = Annotated[int, Field(ge=0, le=1)]
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]


class Message(BaseModel):
    """One chat message of a prompt."""

    model_config = _FROZEN
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Meta(BaseModel):
    """Omega: what the learner needs besides (x, y, r, v)."""

    model_config = _FROZEN
    group_id: Id = Field(min_length=1, description="GRPO group: n samples of one prompt under one version")
    # fail_fast: a sequence stops at its first bad item (a peer's 16 MiB of NaN log-probs is one error, not 2M)
    prompt_ids: tuple[int, ...] = Field(min_length=1, fail_fast=True, description="prompt token ids as the sampler saw them")
    response_ids: tuple[int, ...] = Field(min_length=1, fail_fast=True, description="sampled response token ids")
    logprobs: tuple[LogProb, ...] = Field(
        fail_fast=True, description="the sampler's per-token log-probs of response_ids (pi_sampler), in [MIN_LOGPROB, 0]"
    )
    loss_mask: tuple[MaskBit, ...] | None = Field(
        default=None, fail_fast=True, description="1 where a response token carries loss (multi-turn); None = all"
    )
    off_policy: bool = Field(
        default=False,
        description="response tokens replayed from a log, not sampled: logprobs are placeholders and the "
        "learner takes pi_sampler = pi_old (w_t = 1)",
    )
    worker: Id = Field(default="", description="id of the worker that produced the record")
    extra: Extra = Field(default_factory=dict, description="task metadata (e.g. 'correct'), bounded")

    @model_validator(mode="after")
    def _lengths_agree(self) -> Meta:
        n = len(self.response_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"logprobs has {len(self.logprobs)} entries, response_ids has {n}")
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries, response_ids has {n}")
        return self

    @property
    def trains(self) -> bool:
        """Whether a response token carries loss (a failed episode's all-zero loss mask: none)."""
        return self.loss_mask is None or any(self.loss_mask)


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
        """Validate a decoded wire object; raise TrajectoryRejected naming the first bad field. The error holds
        neither the ValidationError nor its context (a rejected record's objects are freed at once)."""
        try:
            return cls.model_validate(obj)
        except ValidationError as e:
            err = e.errors(include_url=False, include_context=False)[0]
        field = ".".join(str(p) for p in err["loc"]) or "<record>"
        reason = "nan_reward" if field == "reward" and _is_nan(err.get("input")) else _REASONS.get(err["type"], "schema")
        value = err.get("input")
        raise TrajectoryRejected(reason, field, value if isinstance(value, (int, float, str, type(None))) else
                                 f"{type(value).__name__} of {_size(value)}", err["msg"])


# pydantic error types -> rejection reasons (counter keys); any other violation is "schema"
_REASONS = {
    "finite_number": "non_finite",
    "non_finite": "non_finite",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
    "string_too_long": "out_of_range",
    "too_long": "out_of_range",
    "out_of_range": "out_of_range",
}


def _size(value: object) -> str:
    try:
        return f"{len(value)} items"  # type: ignore[arg-type]
    except TypeError:
        return "?"


def _is_nan(x: object) -> bool:
    return isinstance(x, float) and math.isnan(x)


def check_admissible(
    t: Trajectory, *, learner_version: int, staleness: int, vocab_size: int, max_len: int,
    reward_bound: float = REWARD_BOUND,
) -> None:
    """Context checks on intake: version window [v_t - S, v_t], token ids in vocabulary, length, and
    |r| <= reward_bound."""
    if abs(t.reward) > reward_bound:
        raise TrajectoryRejected("reward_out_of_range", "reward", t.reward, f"|r| must be <= learner.reward_bound = {reward_bound:g}")
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
    limit = text_limit(max_len)
    if not isinstance(t.prompt, str) and len(t.prompt) > max_len:  # every message costs a token at least
        raise TrajectoryRejected("text_too_long", "prompt", f"{len(t.prompt)} messages", f"more than max_len = {max_len}")
    for name, chars in (("prompt", prompt_chars(t.prompt)), ("response", len(t.response))):
        if chars > limit:
            raise TrajectoryRejected("text_too_long", name, f"{chars} characters",
                                     f"more than {MAX_CHARS_PER_TOKEN} characters per token of max_len = {max_len}")


def text_limit(max_len: int) -> int:
    """The most characters of a record's prompt text, and of its response text: MAX_CHARS_PER_TOKEN a token."""
    return MAX_CHARS_PER_TOKEN * max_len


def prompt_chars(prompt: str | tuple[Message, ...]) -> int:
    """Characters of a prompt: its text, or its messages' contents together."""
    return len(prompt) if isinstance(prompt, str) else sum(len(m.content) for m in prompt)


def held_bytes(records: Sequence[Trajectory]) -> int:
    """What a group of records takes in the learner's memory, estimated from its parts: text at its Python width
    (1, 2 or 4 bytes a character), 36 bytes per token id (a tuple slot and an int object), 32 per log-prob,
    8 per loss-mask bit, MESSAGE_BYTES per chat message, meta.extra's keys and strings (+64 bytes an entry),
    RECORD_OVERHEAD_BYTES for the rest
    (docs/security.md compares it with measured RSS)."""
    total = 0
    for t in records:
        texts = [t.prompt] if isinstance(t.prompt, str) else [m.content for m in t.prompt]
        texts.append(t.response)
        total += 0 if isinstance(t.prompt, str) else MESSAGE_BYTES * len(t.prompt)
        total += sum(len(x) * _width(x) for x in texts)
        m = t.meta
        total += 36 * (len(m.prompt_ids) + len(m.response_ids)) + 32 * len(m.logprobs)
        total += 8 * len(m.loss_mask or ()) + RECORD_OVERHEAD_BYTES
        total += sum(64 + len(k) * _width(k) + (len(v) * _width(v) if isinstance(v, str) else 0) for k, v in m.extra.items())
    return total


def _width(text: str) -> int:
    """Bytes per character of a Python str (PEP 393): 1 for Latin-1, 2 for the BMP, 4 beyond."""
    top = max(map(ord, text), default=0) if not text.isascii() else 0
    return 1 if top < 256 else 2 if top < 65536 else 4


def pack(obj: object) -> bytes:
    """msgpack without any extension types: safe to decode from an untrusted peer."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    # use_list=False: sequences decode as tuples, which the strict record schema expects.
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True)
