"""Data-plane contracts (paper appendix F.1): what a task adapter is, and the parts a SandboxAdapter is
assembled from. Small Protocols, no base classes.

A *task adapter* turns a workload into version-tagged records tau = (x, y, r, v, Omega):

- single-turn (`TaskAdapter`): `tasks(seed)` yields prompts, `score(task, response)` is R(x, y);
- multi-turn (`EpisodicTaskAdapter`): `tasks(seed)` yields one Task per GRPO group, `start(task, i)`
  opens the i-th live `Episode` of that group in a rollout worker.

How Omega becomes learner signals is fixed by the record: `meta.loss_mask` (1 on assistant tokens
only: the turn-aware mask), `meta.group_id` (the GRPO group whose rewards are normalized together,
A_i = (R_i - mean_G) / (std_G + eps)) and the sampler's log-probs (for the truncated importance
weight). A `MetadataSpec` chooses the grouping: by initial state (the n episodes of a group replay one
seeded deal) or by batch (n different seeds share one group id).

A *sandbox* is one environment instance seen from the seat the model plays. Sandboxes come from env
plug-ins (entry-point group `echo2sdk.envs`, one name per URL scheme: `poker`, `gym`, `pettingzoo`,
`moba`); a `SandboxPlugin` makes them from the id after `scheme://` and may ship its own serializers
and action renderers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from echo2sdk.core.contracts import Episode, EpisodicTaskAdapter, Score, StepResult, Task, TaskAdapter

__all__ = [
    "TaskAdapter",
    "EpisodicTaskAdapter",
    "Episode",
    "StepResult",
    "Task",
    "Score",
    "Observation",
    "Transition",
    "Sandbox",
    "SandboxPlugin",
    "Serializer",
    "ParsedAction",
    "ActionRenderer",
    "RewardSpec",
    "MetadataSpec",
]


@dataclass(frozen=True)
class Observation:
    """A decision point of the model's seat.

    state: the acting seat's view only (never another player's private information), JSON-able:
           what serializers render and what offline logs keep
    legal: the legal action names at this point, in the env's order (what the model must answer)
    """

    state: Mapping[str, Any]
    legal: tuple[str, ...]


@dataclass(frozen=True)
class Transition:
    """What follows the seat's action: its reward since the last decision (r_{i,t}) and the next decision
    point, or None when the episode is over."""

    observation: Observation | None
    reward: float
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Sandbox(Protocol):
    """One environment instance; opponents (if any) act inside `reset` and `step`."""

    def reset(self, seed: int) -> Observation:
        """Start a seeded episode and run it to the model seat's first decision. The same seed gives the
        same initial state. An env whose episode could end before the seat acts re-deals deterministically."""
        ...

    def step(self, action: str) -> Transition:
        """Apply a legal action name; run opponents until the seat decides again or the episode ends."""
        ...

    def fallback(self, observation: Observation) -> str:
        """The defined action taken when the model's text is malformed or names an illegal action."""
        ...

    def forfeit(self) -> float:
        """End the episode now with a defined outcome (e.g. the seat folds); return the reward it adds."""
        ...

    def summary(self) -> Mapping[str, Any]:
        """Scalar statistics of the finished episode for the record's metadata (e.g. 'chips')."""
        ...

    def close(self) -> None: ...

    # Optional: `example_turns() -> Sequence[tuple[Observation, str]]`, worked turns in the sandbox's own view (its
    # options applied) that an episode shows before the first state, rendered by the serializer's `user` and the
    # renderer's `answer`; a serializer with its own `examples(renderer)` takes precedence.


@runtime_checkable
class SandboxPlugin(Protocol):
    """What an `echo2sdk.envs` entry point loads (an object or a class with these attributes)."""

    scheme: str
    default_serializer: str
    default_penalty: float

    def env_ids(self) -> Sequence[str]:
        """Known env ids (for 'did you mean' suggestions); may be empty for open-ended schemes."""
        ...

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        """Raise NameNotFound / ConfigError for an unknown id or bad options, cheaply (no env built)."""
        ...

    def make(self, env_id: str, options: Mapping[str, Any]) -> Sandbox: ...

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        """Extra named components: {"serializer": {name: obj}, "action_renderer": {...}, ...}."""
        ...


@runtime_checkable
class Serializer(Protocol):
    """Env state -> chat prompt: the system prompt (rules) and one user message per decision point."""

    def system(self, env: str) -> str: ...

    def user(self, observation: Observation, turn: int) -> str: ...


@dataclass(frozen=True)
class ParsedAction:
    """status: "ok" (a legal action), "illegal" (an answer naming no legal action), "unparsable" (no answer)."""

    action: str | None
    status: Literal["ok", "illegal", "unparsable"]
    answer: str = ""


@runtime_checkable
class ActionRenderer(Protocol):
    """Model text <-> env action: tells the model how to answer, and parses its text (never raises)."""

    def instructions(self, legal: Sequence[str]) -> str: ...

    def parse(self, text: str, legal: Sequence[str]) -> ParsedAction: ...

    # Optional: `answer(action) -> str`, a reply naming `action` in this format: what a sandbox's example_turns()
    # are answered with (without it they are not shown, and a warning says so).


@runtime_checkable
class RewardSpec(Protocol):
    """Step rewards r_{i,1..T} (penalties included) -> the record's scalar reward R_i."""

    def __call__(self, step_rewards: Sequence[float]) -> float: ...


@runtime_checkable
class MetadataSpec(Protocol):
    """How Omega becomes learner signals: turn-aware loss masks, and the grouping of advantage normalization."""

    turn_mask: bool
    adv_norm: bool
    grouping: Literal["state", "batch"]
