"""`gym://<id>`: text-renderable gymnasium envs with a discrete action space, as sandboxes.

    SandboxAdapter(env="gym://FrozenLake-v1", env_options={"is_slippery": False})

The state a model sees is the env's ansi rendering with colour codes stripped (when the env has one),
plus a plain description of the observation for envs whose rendering hides it (FrozenLake and
CliffWalking: the position; Taxi: taxi, passenger and destination; Blackjack: the sums). Actions are
named (FrozenLake: left/down/right/up, ...), or numbered for other Discrete spaces. The fallback for a
malformed or illegal reply is the first action; the penalty defaults to 0.1. `env_options` go to
`gymnasium.make` (e.g. `is_slippery`, `map_name`). An episode cut by max_turns forfeits with reward 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from echo2sdk.adapters.contracts import Observation, Transition
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound


class _Missing(DependencyNotInstalled):
    def __init__(self, package: str, pip: str):
        Exception.__init__(self, f"{package} is not installed: run  pip install {pip}")
        self.package, self.extra = package, ""


__all__ = ["GymPlugin", "GymSandbox", "ACTION_NAMES"]

ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLake": ("left", "down", "right", "up"),
    "FrozenLake8x8": ("left", "down", "right", "up"),
    "CliffWalking": ("up", "right", "down", "left"),
    "CliffWalkingSlippery": ("up", "right", "down", "left"),
    "Taxi": ("south", "north", "east", "west", "pickup", "dropoff"),
    "Blackjack": ("stick", "hit"),
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAXI_PLACES = ("R", "G", "Y", "B")


def _gymnasium():
    try:
        import gymnasium
    except ImportError as e:
        raise _Missing("gymnasium", "gymnasium") from e
    return gymnasium


def _family(env_id: str) -> str:
    return env_id.split("/")[-1].split("-v")[0]


def _describe(env_id: str, env: Any, obs: Any) -> dict[str, Any]:
    fam = _family(env_id)
    base = env.unwrapped
    if fam.startswith("FrozenLake") or fam.startswith("CliffWalking"):
        ncol = int(getattr(base, "ncol", 0) or (base.shape[1] if hasattr(base, "shape") else 0))
        return {"position": f"row {int(obs) // ncol}, column {int(obs) % ncol}"} if ncol else {"observation": int(obs)}
    if fam == "Taxi":
        row, col, passenger, dest = base.decode(int(obs))
        where = "in the taxi" if passenger == 4 else f"at {_TAXI_PLACES[passenger]}"
        return {"taxi": f"row {row}, column {col}", "passenger": where, "destination": _TAXI_PLACES[dest]}
    if fam == "Blackjack":
        total, dealer, ace = obs
        return {"your_sum": int(total), "dealer_shows": int(dealer), "usable_ace": bool(ace)}
    if hasattr(obs, "tolist"):
        obs = obs.tolist()
    return {"observation": obs}


class GymSandbox:
    """One gymnasium env; the model is the only agent."""

    def __init__(self, env_id: str, options: Mapping[str, Any]):
        gym = _gymnasium()
        self.env = gym.make(env_id, **dict(options))
        self._ansi = "ansi" in (self.env.metadata.get("render_modes") or ())
        if self._ansi:  # remake with the text rendering on
            self.env.close()
            self.env = gym.make(env_id, **{**dict(options), "render_mode": "ansi"})
        self.env_id = env_id
        n = int(self.env.action_space.n)
        names = ACTION_NAMES.get(_family(env_id))
        self.names = names if names is not None and len(names) == n else tuple(str(i) for i in range(n))
        self.total = 0.0
        self.steps = 0
        self.outcome = "running"

    def _observe(self, obs: Any) -> Observation:
        state: dict[str, Any] = {}
        if self._ansi:
            state["text"] = _ANSI.sub("", str(self.env.render())).strip("\n")
        state.update(_describe(self.env_id, self.env, obs))
        return Observation(state=state, legal=self.names)

    def reset(self, seed: int) -> Observation:
        obs, _ = self.env.reset(seed=seed)
        self.total, self.steps, self.outcome = 0.0, 0, "running"
        return self._observe(obs)

    def step(self, action: str) -> Transition:
        obs, reward, terminated, truncated, _ = self.env.step(self.names.index(action))
        self.total += float(reward)
        self.steps += 1
        if terminated or truncated:
            self.outcome = "terminated" if terminated else "truncated"
            return Transition(None, float(reward))
        return Transition(self._observe(obs), float(reward))

    def fallback(self, observation: Observation) -> str:
        return observation.legal[0]

    def forfeit(self) -> float:
        self.outcome = "forfeit"
        return 0.0

    def summary(self) -> dict[str, Any]:
        return {"env_return": self.total, "env_steps": self.steps, "outcome": self.outcome, "won": self.total > 0}

    def close(self) -> None:
        self.env.close()


class GymPlugin:
    """The `gym` scheme (entry point `echo2sdk.envs: gym`)."""

    scheme = "gym"
    default_serializer = "state->text_v1"
    default_penalty = 0.1

    def env_ids(self) -> Sequence[str]:
        return sorted(_gymnasium().registry)

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        gym = _gymnasium()
        if env_id not in gym.registry:
            raise NameNotFound("gymnasium env", env_id, [k for k in gym.registry if "/" not in k])
        try:
            env = gym.make(env_id, **dict(options))
        except TypeError as e:
            raise ConfigError(f"gym://{env_id}: env_options = {dict(options)!r} rejected: {e}") from None
        try:
            if not hasattr(env.action_space, "n"):
                raise ConfigError(f"gym://{env_id}: action space {env.action_space} is not Discrete; the gym bridge needs named discrete actions")
        finally:
            env.close()

    def make(self, env_id: str, options: Mapping[str, Any]) -> GymSandbox:
        return GymSandbox(env_id, options)

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        return {}
