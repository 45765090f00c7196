"""The MOBA as a PettingZoo ParallelEnv: every hero is an agent, all act at once, one step is one tick.

    from echo2_moba import parallel_env
    env = parallel_env("3v3_v1")
    obs, infos = env.reset(seed=0)
    while env.agents:
        actions = {a: env.action_space(a).sample(mask=obs[a]["action_mask"]) for a in env.agents}
        obs, rewards, terminations, truncations, infos = env.step(actions)

Agents are `blue_0..` and `red_0..`. The action space is `Discrete(len(ACTIONS))`, the same names for
every hero (`rules.action_names`); the legal ones are in the observation's `action_mask` (and in
`infos[agent]["action_mask"]`). A masked-out action is played as `hold` and flagged in
`infos[agent]["illegal"]`; a missing agent holds. Observations are `{"observation": float32 vector in
[0, 1], "action_mask": int8 vector}`, seen from the hero's side (positions mirrored for red).

Rewards are per team (zero-sum): the outcome when the game ends (+1 win, -1 loss, 0 draw) plus the
potential-based shaping term `shaping * (Phi_{t+1} - Phi_t)` every tick, with `Game.potential` in
[-1, 1] (half the gold+XP lead, half the structure-HP lead); over a game the shaping adds
`shaping * Phi_T`. A fallen base terminates every agent; the step limit truncates them.
`reset(seed=None)` continues a seeded sequence (from 0, or from the last seed given), so runs repeat.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from .game import Game
from .rules import ABILITIES, LANE_LEN, VARIANTS, XP_LEVELS, action_names

__all__ = ["MobaParallelEnv", "parallel_env", "observation_size"]

_HERO_FEATURES = 11


def observation_size(variant: str) -> int:
    v = VARIANTS[variant]
    return 2 * v.heroes * _HERO_FEATURES + 10 * len(v.lanes) + 3


def _hero_row(game: Game, u: Any) -> list[float]:
    """A hero's features; its position on blue's axis (mirrored later for red viewers)."""
    return [
        float(u.alive),
        u.lane / max(1, len(game.variant.lanes) - 1),
        u.pos / LANE_LEN,
        max(0.0, u.hp) / u.max_hp,
        u.mana / u.max_mana,
        u.level / len(XP_LEVELS),
        min(1.0, u.gold / 2000),
        *(u.cooldowns[s] / ABILITIES[s].cooldown for s in ABILITIES),
        min(1.0, u.respawn / 20),
    ]


def _lane_rows(game: Game, lane: int) -> list[tuple[float, float, float]]:
    """Per team: creep count, total creep HP, and its front (the furthest creep, in that team's perspective)."""
    out = []
    for team in (0, 1):
        own = [LANE_LEN - c.pos if team else c.pos for c in game.creeps[lane] if c.team == team]
        hp = sum(c.hp for c in game.creeps[lane] if c.team == team)
        out.append((min(1.0, len(own) / 12), min(1.0, hp / 1200), max(own, default=0) / LANE_LEN))
    return out


def encode_all(game: Game) -> list[np.ndarray]:
    """Every hero's observation vector (see `observation_size`): itself, its allies, the enemies (11
    features each); per lane the creeps of both sides (count, total HP, front) and the four towers; both
    bases; the time. All in the hero's own perspective, clipped to [0, 1]."""
    n = game.variant.heroes
    rows = np.asarray([_hero_row(game, h) for h in game.heroes], dtype=np.float32)
    mirrored = rows.copy()
    mirrored[:, 2] = 1.0 - mirrored[:, 2]
    lanes = [_lane_rows(game, k) for k in range(len(game.creeps))]
    out = []
    for k, h in enumerate(game.heroes):
        t, e = h.team, 1 - h.team
        order = [k, *(j for j in range(t * n, t * n + n) if j != k), *range(e * n, e * n + n)]
        tail: list[float] = []
        for lane, sides in enumerate(lanes):
            mine, theirs = sides[t], sides[e]
            tail += [mine[0], mine[1], theirs[0], theirs[1], mine[2], 1.0 - theirs[2]]
            tail += [max(0.0, s.hp) / s.stats.hp for side in (t, e) for s in game.towers[side][lane]]
        tail += [max(0.0, game.bases[side].hp) / game.bases[side].stats.hp for side in (t, e)]
        tail.append(game.tick / game.max_ticks)
        vec = np.concatenate([(mirrored if t else rows)[order].ravel(), np.asarray(tail, dtype=np.float32)])
        out.append(np.clip(vec, 0.0, 1.0))
    return out


class MobaParallelEnv(ParallelEnv):
    metadata = {"name": "moba_v1", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self, variant: str = "lane_1v1_v1", *, max_ticks: int | None = None, shaping: float = 0.2, render_mode: str | None = None
    ):
        if variant not in VARIANTS:
            from echo2sdk.errors import NameNotFound

            raise NameNotFound("moba variant", str(variant), VARIANTS)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode = {render_mode!r} must be None or 'ansi'")
        self.variant, self.max_ticks, self.shaping, self.render_mode = variant, max_ticks, float(shaping), render_mode
        n = VARIANTS[variant].heroes
        self.possible_agents = [f"blue_{i}" for i in range(n)] + [f"red_{i}" for i in range(n)]
        self.actions = action_names(VARIANTS[variant])
        size = observation_size(variant)
        self._obs_spaces = {
            a: spaces.Dict(
                {
                    "observation": spaces.Box(0.0, 1.0, (size,), np.float32),
                    "action_mask": spaces.Box(0, 1, (len(self.actions),), np.int8),
                }
            )
            for a in self.possible_agents
        }
        self._act_spaces = {a: spaces.Discrete(len(self.actions)) for a in self.possible_agents}
        self._seeds = random.Random(0)
        self.agents: list[str] = []
        self.game: Game | None = None

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_spaces[agent]

    def _mask(self, k: int) -> np.ndarray:
        return np.asarray(self.game.legal(k), dtype=np.int8)

    def _observe(self) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, infos = {}, {}
        vectors = encode_all(self.game)
        for k, agent in enumerate(self.possible_agents):
            mask = self._mask(k)
            obs[agent] = {"observation": vectors[k], "action_mask": mask}
            infos[agent] = {"action_mask": mask, "illegal": bool(self.game.illegal[k])}
        return obs, infos

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None:
            self._seeds = random.Random(seed)
        else:
            seed = self._seeds.randrange(2**31)
        self.game = Game(self.variant, seed, self.max_ticks)
        self.agents = list(self.possible_agents)
        return self._observe()

    def step(self, actions: dict[str, Any]):
        if self.game is None or not self.agents:
            raise RuntimeError("MobaParallelEnv.step() before reset() or after the game is over")
        g = self.game
        before = g.potential(0)
        g.step([int(actions.get(a, 0)) for a in self.possible_agents])
        blue = self.shaping * (g.potential(0) - before) + g.result(0)  # zero-sum: red gets -blue
        obs, infos = self._observe()
        n = len(self.possible_agents) // 2
        rewards = {a: (blue if k < n else -blue) for k, a in enumerate(self.possible_agents)}
        terminations = dict.fromkeys(self.possible_agents, g.over and not g.truncated)
        truncations = dict.fromkeys(self.possible_agents, g.truncated)
        if g.over:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.game is None:
            return None
        return render_text(self.game)

    def close(self) -> None:
        self.game = None


def render_text(game: Game) -> str:
    """One line per lane on blue's axis: structures `|` (fallen `x`), bases `H`, creeps `>` blue, `<` red,
    `*` both, heroes A.. blue and a.. red."""
    lines = [f"tick {game.tick}/{game.max_ticks}"]
    for lane, name in enumerate(game.variant.lanes):
        row = ["."] * (LANE_LEN + 1)
        for t in (0, 1):
            for s in [*game.towers[t][lane], game.bases[t]]:
                row[s.pos] = ("H" if s.tier == 2 else "|") if s.hp > 0 else "x"
        for c in game.creeps[lane]:
            mark = ">" if c.team == 0 else "<"
            row[c.pos] = "*" if row[c.pos] in "<>*" and row[c.pos] != mark else mark
        for h in game.heroes:
            if h.alive and h.lane == lane:
                row[h.pos] = chr((65 if h.team == 0 else 97) + h.index)
        lines.append(f"{name:>4} {''.join(row)}")
    return "\n".join(lines)


def parallel_env(variant: str = "lane_1v1_v1", **kwargs: Any) -> MobaParallelEnv:
    """PettingZoo's constructor convention: `parallel_env(variant, max_ticks=..., shaping=..., render_mode=...)`."""
    return MobaParallelEnv(variant, **kwargs)
