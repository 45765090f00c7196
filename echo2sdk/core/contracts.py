"""The two extension points the core talks to: an inference backend (rollout plane) and a task adapter
(data plane). Small Protocols, no base classes; plug-ins register by entry point (see echo2sdk.plugins)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "SamplingParams",
    "Sample",
    "InferenceBackend",
    "Task",
    "Score",
    "TaskAdapter",
    "StepResult",
    "Episode",
    "EpisodicTaskAdapter",
    "is_episodic",
]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the k most likely tokens (0: off)
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability (0: off)
    seed: int | None = None


@dataclass(frozen=True)
class Sample:
    """One generated response. `logprobs[i]` is log pi_sampler(token_ids[i] | prefix) under the
    distribution actually sampled from (logits / temperature), so the learner can form the
    truncated importance weight min(pi_old / pi_sampler, C)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str  # "stop" (end-of-sequence token sampled, and included in token_ids) or "length"


@runtime_checkable
class InferenceBackend(Protocol):
    """Generates under an installed snapshot version; installs new snapshots in place.

    Constructed as Backend(model: str, **options) where `model` is a local HF model folder.
    """

    @property
    def version(self) -> int:
        """The snapshot version whose weights are installed (0 = the initial model)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt token ids for chat messages, with the generation prompt appended."""
        ...

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        """One Sample per prompt (repeat a prompt n times for a GRPO group)."""
        ...

    def install(self, version: int, weights: bytes) -> None:
        """Install a safetensors snapshot: `weights` is bytes-like (bytes or a memoryview of the relay's buffer,
        valid for the duration of the call; copy what must outlive it). On any mismatch raise BackendError and
        keep the old weights."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Task:
    """One prompt handed to a worker: chat messages plus whatever the scorer needs (hidden from the model)."""

    id: str
    messages: tuple[dict[str, str], ...]
    answer: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TaskAdapter(Protocol):
    """Data plane: makes prompts (learner side) and scores responses (rollout side).

    Constructed as Adapter(**options); the same options rebuild an equal adapter in a worker process.
    """

    def tasks(self, seed: int) -> Iterator[Task]:
        """An endless (or finite) stream of tasks, deterministic for a seed."""
        ...

    def score(self, task: Task, response: str) -> Score:
        """Reward R(x, y); must not raise on malformed responses (a bad rollout is data, not a crash)."""
        ...


# -- multi-turn (episodic) tasks ---------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What an episode says after the model's action: the next user message, or the end.

    observation: content of the next user message (the acting seat's view), or None when done
    reward:      r_{i,t}, the step reward (penalties for a malformed/illegal action included)
    done:        the episode is over; `observation` is then None
    info:        anything worth logging for this step (parsed action, fallback used, ...)
    """

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    """One live multi-turn episode, driven by a rollout worker (paper appendix F.3-F.4).

    The worker sends `messages` (system, then the first user state) to the model, passes each sampled
    response to `step`, appends the next observation as a user message, and repeats until `done`.
    """

    @property
    def messages(self) -> tuple[dict[str, str], ...]:
        """The opening messages: system prompt, then the first user state message."""
        ...

    def step(self, response: str) -> StepResult:
        """Apply the model's response text. Must not raise on malformed text (fallback + penalty);
        an exception here means the sandbox itself failed, and the worker records a failed episode."""
        ...

    def abort(self, reason: str) -> None:
        """End the episode early (turn or context limit); `result` must still work afterwards."""
        ...

    def result(self) -> Score:
        """The record's reward R_i (per the adapter's reward spec) and episode statistics in `info`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class EpisodicTaskAdapter(Protocol):
    """Data plane for interactive tasks: `tasks` yields one Task per GRPO group (its id is the group
    id); `start(task, index)` opens the index-th episode of that group in a worker process."""

    max_turns: int

    def tasks(self, seed: int) -> Iterator[Task]: ...

    def start(self, task: Task, index: int) -> Episode: ...


def is_episodic(adapter: object) -> bool:
    """True for adapters that play episodes (have `start`) rather than score single responses."""
    return callable(getattr(adapter, "start", None))
