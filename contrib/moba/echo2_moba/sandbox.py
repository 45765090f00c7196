"""MobaSandbox: one game seen from the model's team, for `SandboxAdapter(env="moba://...")`.

The model controls the first `control` heroes of its team (`team` 0 = blue, 1 = red); every other hero
is a bot (`ally` for its team, `opponent` for the other). A decision step asks each controlled hero that
is alive for one action, one LLM turn each (in hero order, all on the same tick), then plays
`decision_ticks` ticks: the chosen action on the first; on later ticks a strike or ult continues as an
attack on that hero, a nova, purchase or lane change as hold, anything else repeats (hold if it has
become illegal). Dead controlled heroes are skipped until they respawn.

Rewards are the team's (SandboxAdapter's `episodic_return` sums them): +1 win, -1 loss, 0 draw when the
game ends, plus the potential-based shaping `shaping * (Phi_after - Phi_before)` of every step (see
`Game.potential`), so an episode's return is `outcome + shaping * Phi_T` with `shaping * |Phi_T| <=
shaping`. A malformed reply holds (SandboxAdapter subtracts its `penalty`, 0.1 by default). A forfeit
(turn or context limit) ends the game by the tie-break, as the step limit does.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from echo2sdk.adapters.contracts import Observation, Transition
from echo2sdk.errors import AdapterError

from .bots import make_bot
from .evaluation import bot_actions
from .game import TEAMS, Game
from .view import hero_view

__all__ = ["MobaSandbox", "continued"]


def continued(action: str) -> str:
    """What a decision's action becomes on its later ticks."""
    for spell in ("strike_", "ult_"):
        if action.startswith(spell):
            return "attack_" + action.removeprefix(spell)
    if action == "nova" or action.startswith(("buy_", "lane_")):
        return "hold"
    return action


class MobaSandbox:
    def __init__(self, variant: str, options: Mapping[str, Any]):
        self.variant = variant
        self.team = int(options.get("team", 0))
        self.control = int(options.get("control", 1))
        self.opponent = options.get("opponent", "pusher")
        self.ally = options.get("ally", "pusher")
        self.decision_ticks = int(options.get("decision_ticks", 4))
        self.max_ticks = options.get("max_ticks")
        self.shaping = float(options.get("shaping", 0.2))
        self.game: Game | None = None

    # -- views -----------------------------------------------------------------------------------
    def _observation(self, k: int) -> Observation:
        g = self.game
        legal = tuple(a for a, ok in zip(g.actions, g.legal(k)) if ok)
        return Observation(state={**hero_view(g, k), "decision_ticks": self.decision_ticks}, legal=legal)

    def _bots(self) -> dict[int, Any]:
        n = self.game.variant.heroes
        enemies = self.opponent if isinstance(self.opponent, (list, tuple)) else [self.opponent] * n
        bots = {}
        for k, h in enumerate(self.game.heroes):
            if h.team == self.team and h.index < self.control:
                continue
            bots[k] = make_bot(self.ally if h.team == self.team else enemies[h.index])
        return bots

    # -- play --------------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        self.game = Game(self.variant, seed, self.max_ticks)
        self.controlled = [k for k, h in enumerate(self.game.heroes) if h.team == self.team and h.index < self.control]
        self.bots = self._bots()
        self.rng = random.Random(f"{seed}|bots")
        self.chosen: dict[int, str] = {}
        self.pending = list(self.controlled)  # every hero is alive at tick 0
        self.total, self.decisions = 0.0, 0
        return self._observation(self.pending[0])

    def _tick(self, first: bool) -> float:
        g = self.game
        actions = bot_actions(g, self.bots, self.rng)
        for k in self.controlled:
            name = self.chosen.get(k, "hold") if first else continued(self.chosen.get(k, "hold"))
            index = g.actions.index(name)
            actions[k] = index if g.legal(k)[index] else 0
        before = g.potential(self.team)
        g.step([actions[k] for k in range(len(g.heroes))])
        return self.shaping * (g.potential(self.team) - before) + g.result(self.team)

    def _play(self) -> tuple[Observation | None, float]:
        """Play decision steps until a controlled hero is alive to decide, or the game is over."""
        g, reward = self.game, 0.0
        while not g.over:
            for t in range(self.decision_ticks):
                reward += self._tick(first=t == 0)
                if g.over:
                    break
            self.chosen = {}
            self.pending = [k for k in self.controlled if g.heroes[k].alive]
            if self.pending and not g.over:
                return self._observation(self.pending[0]), reward
        return None, reward

    def step(self, action: str) -> Transition:
        if self.game is None or self.game.over:
            raise AdapterError("moba: step() after the game is over (or before reset)")
        k = self.pending.pop(0)
        if action not in self.game.actions:
            raise AdapterError(f"moba: unknown action {action!r} for {self.game.heroes[k].name}")
        self.chosen[k] = action
        self.decisions += 1
        if self.pending:
            return Transition(self._observation(self.pending[0]), 0.0)
        obs, reward = self._play()
        self.total += reward
        return Transition(obs, reward)

    def fallback(self, observation: Observation) -> str:
        return "hold"

    def forfeit(self) -> float:
        """End the game now by the tie-break; the outcome is the reward it adds."""
        if self.game is None or self.game.over:
            return 0.0
        self.game.finish()
        reward = float(self.game.result(self.team))
        self.total += reward
        return reward

    def summary(self) -> dict[str, Any]:
        g = self.game
        result = g.result(self.team)
        return {
            "result": result,
            "won": result == 1,
            "finished": g.over,
            "ticks": g.tick,
            "decisions": self.decisions,
            "team": TEAMS[self.team],
            "opponent": self.opponent if isinstance(self.opponent, str) else ",".join(self.opponent),
            "team_return": self.total,
            **g.team_stats(self.team),
        }

    def close(self) -> None:
        self.bots = {}  # the finished game stays readable for summary()
