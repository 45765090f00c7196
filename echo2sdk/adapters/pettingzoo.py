"""`pettingzoo://<module>`: turn-based multi-agent (AEC) pettingzoo envs with action masks, as sandboxes.

    SandboxAdapter(env="pettingzoo://tictactoe_v3", env_options={"seat": 0, "opponent": "random"})

`<module>` is a module of `pettingzoo.classic` (tictactoe_v3, connect_four_v3, ...) or an environment
module of another pettingzoo family (`classic.tictactoe_v3`, `butterfly.knights_archers_zombies_v10`): a
name `<family>.<env>_v<N>` and nothing else, since the name can come from the coordinator's welcome and
importing is running code. The model plays one seat (`seat`, an index into
`possible_agents`); every other seat plays `opponent`: "random" (a seeded uniform choice among legal
actions) or "first" (the first legal action). The seat's step reward is what AEC's `last()` reports for
it when it is next to act (its cumulative reward since its previous action). Actions are the indices of
the action mask, as text; tictactoe and connect four states are drawn as grids, other envs show the
observation array. Other `env_options` go to the module's `env(...)`.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from echo2sdk.adapters.contracts import Observation, Transition
from echo2sdk.core import checks
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound


class _Missing(DependencyNotInstalled):
    def __init__(self, package: str, pip: str):
        Exception.__init__(self, f"{package} is not installed: run  pip install {pip}")
        self.package, self.extra = package, ""


__all__ = ["PettingZooPlugin", "PettingZooSandbox", "CLASSIC"]

CLASSIC = (
    "chess_v6",
    "connect_four_v3",
    "gin_rummy_v4",
    "go_v5",
    "hanabi_v5",
    "leduc_holdem_v4",
    "texas_holdem_no_limit_v6",
    "texas_holdem_v4",
    "tictactoe_v3",
)
FAMILIES = ("classic", "butterfly", "atari", "mpe", "sisl")
_ENV_ID = re.compile(rf"^(?:(?:{'|'.join(FAMILIES)})\.)?[a-z][a-z0-9_]*_v[0-9]+$")
_OPPONENTS = ("random", "first")
_OWN_OPTIONS = ("seat", "opponent")


def _module(env_id: str):
    if not _ENV_ID.fullmatch(env_id):
        raise ConfigError(f"pettingzoo env {env_id!r}: expected an environment module <env>_v<N> of "
                          f"pettingzoo.classic, or <family>.<env>_v<N> with family one of {', '.join(FAMILIES)}")
    path = f"pettingzoo.{env_id}" if "." in env_id else f"pettingzoo.classic.{env_id}"
    try:
        importlib.import_module("pettingzoo")
    except ImportError as e:
        raise _Missing("pettingzoo", "pettingzoo pygame-ce") from e
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("pettingzoo"):
            raise NameNotFound("pettingzoo env", env_id, CLASSIC) from None
        raise _Missing(e.name or env_id, f"{e.name} (needed by pettingzoo.{env_id})") from e


def _grid(obs: Any, marks: tuple[str, str] = ("X", "O")) -> str:
    """Board planes (rows, cols, 2): plane 0 the acting seat's pieces, plane 1 the opponent's."""
    rows = []
    for r in range(obs.shape[0]):
        cells = []
        for c in range(obs.shape[1]):
            cells.append(marks[0] if obs[r, c, 0] else marks[1] if obs[r, c, 1] else ".")
        rows.append(" ".join(cells))
    return "\n".join(rows)


def _describe(env_id: str, obs: Any) -> dict[str, Any]:
    name = env_id.split(".")[-1]
    if name.startswith("tictactoe"):
        # pettingzoo's tictactoe planes are indexed [column, row]; cells are numbered column-major
        board = _grid(obs.transpose(1, 0, 2))
        return {"text": "You are X.\n" + board, "cells": "numbered 0-8 down each column: 0 1 2 is the left column"}
    if name.startswith("connect_four"):
        return {"text": "You are X.\n" + _grid(obs), "columns": "0-6 from the left"}
    return {"observation": obs.tolist() if hasattr(obs, "tolist") else obs}


class PettingZooSandbox:
    def __init__(self, env_id: str, options: Mapping[str, Any]):
        opts = dict(options)
        self.seat_index = opts.pop("seat", 0)
        self.opponent = opts.pop("opponent", "random")
        self.env_id = env_id
        self.env = _module(env_id).env(**opts)
        self.seat = self.env.possible_agents[self.seat_index]
        self.rng = random.Random(0)
        self.total = 0.0
        self.steps = 0
        self._obs: Any = None

    def _advance(self) -> tuple[Observation | None, float]:
        """Let the other seats act until the model's seat must decide (or the game ends for it)."""
        env, reward = self.env, 0.0
        for agent in env.agent_iter():
            obs, rew, term, trunc, _ = env.last()
            if agent == self.seat:
                reward += float(rew)
                if term or trunc:
                    return None, reward
                mask = obs["action_mask"]
                legal = tuple(str(i) for i in range(len(mask)) if mask[i])
                return Observation(state=_describe(self.env_id, obs["observation"]), legal=legal), reward
            if term or trunc:
                env.step(None)
                continue
            choices = [i for i, ok in enumerate(obs["action_mask"]) if ok]
            env.step(choices[0] if self.opponent == "first" else self.rng.choice(choices))
        return None, reward

    def reset(self, seed: int) -> Observation:
        self.env.reset(seed=seed)
        self.rng = random.Random(seed)
        self.total, self.steps = 0.0, 0
        obs, reward = self._advance()
        if obs is None:
            raise ConfigError(f"pettingzoo://{self.env_id}: the game ended before seat {self.seat!r} could act")
        self.total += reward
        return obs

    def step(self, action: str) -> Transition:
        self.env.step(int(action))
        self.steps += 1
        obs, reward = self._advance()
        self.total += reward
        return Transition(obs, reward)

    def fallback(self, observation: Observation) -> str:
        return observation.legal[0]

    def forfeit(self) -> float:
        return 0.0

    def summary(self) -> dict[str, Any]:
        return {"env_return": self.total, "env_steps": self.steps, "won": self.total > 0}

    def close(self) -> None:
        self.env.close()


class PettingZooPlugin:
    """The `pettingzoo` scheme (entry point `echo2sdk.envs: pettingzoo`)."""

    scheme = "pettingzoo"
    default_serializer = "state->text_v1"
    default_penalty = 0.1

    def env_ids(self) -> Sequence[str]:
        return CLASSIC

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        opponent = options.get("opponent", "random")
        if opponent not in _OPPONENTS:
            raise ConfigError(f"pettingzoo://{env_id}: env_options.opponent = {opponent!r} must be one of {_OPPONENTS}")
        seat = options.get("seat", 0)
        checks.integer(f"pettingzoo://{env_id} env_options.seat", seat, lo=0, error=ConfigError)
        module = _module(env_id)
        if not hasattr(module, "env"):
            raise NameNotFound("pettingzoo env", env_id, CLASSIC)

    def make(self, env_id: str, options: Mapping[str, Any]) -> PettingZooSandbox:
        return PettingZooSandbox(env_id, options)

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        return {}
