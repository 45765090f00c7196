"""The game: a compact, deterministic lane-battle MOBA in plain Python (no numpy, no pettingzoo).

    game = Game("lane_1v1_v1", seed=7)
    while not game.over:
        game.step([game.actions.index("advance")] * len(game.heroes))

One `step` is one tick; every hero acts at once. A tick runs in phases, so the order in which heroes
are listed never matters:

1. purchases and lane changes (at the fountain);
2. targets: every hero's attack or ability, every creep's and structure's shot, chosen on the state at
   the start of the tick (the state the action mask describes, so a legal attack always lands);
3. all damage at once; a unit at 0 HP dies. The hero that dealt a dying unit the most damage this tick
   gets the kill (gold); enemy heroes within XP_RANGE share its XP;
4. movement: heroes that advance or retreat, creeps that had nothing to shoot;
5. upkeep: regeneration (fast at the fountain), cooldowns, respawns, passive gold; a creep wave every
   WAVE_PERIOD ticks.

The game ends when a base falls (its team loses) or at `max_ticks`, where the tie-break decides: more
base HP wins, then more tower HP; equal is a draw. All randomness (the class line-up, +-10 % damage
rolls) comes from one `random.Random(seed)`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from . import rules
from .rules import ABILITIES, BASE, CLASSES, CREEPS, ITEMS, LANE_LEN, TOWER, HeroClass, UnitStats, Variant

__all__ = ["Game", "Hero", "Creep", "Structure", "TEAMS"]

TEAMS = ("blue", "red")


def absolute(team: int, own: int) -> int:
    """An own-perspective position (0 = the team's fountain) on the shared lane axis (blue's)."""
    return own if team == 0 else LANE_LEN - own


class Creep:
    __slots__ = ("team", "lane", "pos", "hp", "stats", "kind")

    def __init__(self, team: int, lane: int, kind: str):
        self.team, self.lane, self.kind = team, lane, kind
        self.stats: UnitStats = CREEPS[kind]
        self.pos = absolute(team, rules.SPAWN)
        self.hp = float(self.stats.hp)


class Structure:
    __slots__ = ("team", "lane", "tier", "pos", "hp", "stats")

    def __init__(self, team: int, lane: int | None, tier: int):
        self.team, self.lane, self.tier = team, lane, tier  # tier 0 outer, 1 inner, 2 base (lane None)
        self.stats: UnitStats = BASE if tier == 2 else TOWER
        self.pos = absolute(team, rules.BASE_POS if tier == 2 else rules.TOWER_POS[tier])
        self.hp = float(self.stats.hp)


class Hero:
    __slots__ = (
        "team", "index", "name", "cls", "lane", "pos", "hp", "mana", "level", "xp", "gold", "earned", "items",
        "cooldowns", "respawn", "kills", "deaths", "last_hits", "aggro", "max_hp", "max_mana", "attack", "power",
    )  # fmt: skip

    def __init__(self, team: int, index: int, cls: HeroClass, lane: int):
        self.team, self.index, self.cls, self.lane = team, index, cls, lane
        self.name = f"{TEAMS[team]}_{index}"
        self.pos = absolute(team, 0)
        self.level, self.xp, self.items = 1, 0, []
        self.gold = self.earned = rules.START_GOLD
        self.cooldowns = dict.fromkeys(ABILITIES, 0)
        self.respawn = self.kills = self.deaths = self.last_hits = 0
        self.aggro = -10  # the last tick it damaged an enemy hero (towers punish that)
        self.refresh()
        self.hp, self.mana = float(self.max_hp), float(self.max_mana)

    def refresh(self) -> None:
        """Derived stats from class, level and items."""
        c, up = self.cls, self.level - 1
        items = [ITEMS[i] for i in self.items]
        self.max_hp = c.hp + up * c.hp_per_level + sum(i.hp for i in items)
        self.max_mana = c.mana + up * c.mana_per_level + sum(i.mana for i in items)
        self.attack = c.attack + up * c.attack_per_level + sum(i.attack for i in items)
        self.power = 1.0 + 0.1 * up + sum(i.power for i in items)

    @property
    def alive(self) -> bool:
        return self.respawn == 0

    def own(self, pos: int) -> int:
        return pos if self.team == 0 else LANE_LEN - pos


def _decode(name: str) -> tuple[str, Any]:
    """'attack_e1' -> ('attack', 1), 'buy_orb' -> ('buy', 'orb'), 'hold' -> ('hold', None)."""
    for kind in ("attack_e", "strike_e", "ult_e"):
        if name.startswith(kind):
            return kind[:-2], int(name[len(kind) :])
    if name.startswith(("buy_", "lane_")):
        kind, arg = name.split("_", 1)
        return kind, arg
    return name, None


class Game:
    def __init__(self, variant: str | Variant, seed: int = 0, max_ticks: int | None = None):
        self.variant = rules.VARIANTS[variant] if isinstance(variant, str) else variant
        self.actions = rules.action_names(self.variant)
        self._decoded = [_decode(a) for a in self.actions]
        self.max_ticks = int(max_ticks or self.variant.max_ticks)
        self.seed = seed
        self.rng = random.Random(seed)
        n, lanes = self.variant.heroes, len(self.variant.lanes)
        lineup = [self.rng.choice(sorted(CLASSES)) for _ in range(n)]  # the same classes on both sides
        self.heroes = [Hero(t, i, CLASSES[lineup[i]], self.variant.lane_of(i)) for t in (0, 1) for i in range(n)]
        self.team = [self.heroes[:n], self.heroes[n:]]
        self.towers = [[[Structure(t, k, 0), Structure(t, k, 1)] for k in range(lanes)] for t in (0, 1)]
        self.bases = [Structure(0, None, 2), Structure(1, None, 2)]
        self.creeps: list[list[Creep]] = [[] for _ in range(lanes)]
        self.tick = 0
        self.over = False
        self.truncated = False
        self.winner: int | None = None
        self.illegal = [False] * len(self.heroes)
        self._masks: dict[int, list[bool]] = {}
        self._spawn_wave()

    # -- rules queries ---------------------------------------------------------------------------
    def structures(self, team: int, lane: int) -> list[Structure]:
        return [*self.towers[team][lane], self.bases[team]]

    def vulnerable(self, s: Structure) -> bool:
        if s.hp <= 0:
            return False
        if s.tier == 0:
            return True
        if s.tier == 1:
            return self.towers[s.team][s.lane][0].hp <= 0
        return any(inner.hp <= 0 for _, inner in self.towers[s.team])

    def at_fountain(self, h: Hero) -> bool:
        return h.own(h.pos) <= rules.FOUNTAIN

    def creep_target(self, h: Hero) -> Creep | None:
        """The lowest-HP enemy creep in the hero's range (the last-hit target), nearest on a tie."""
        best = None
        for c in self.creeps[h.lane]:
            if c.team != h.team and abs(c.pos - h.pos) <= h.cls.range:
                if best is None or (c.hp, abs(c.pos - h.pos)) < (best.hp, abs(best.pos - h.pos)):
                    best = c
        return best

    def structure_target(self, h: Hero) -> Structure | None:
        for s in self.structures(1 - h.team, h.lane):
            if abs(s.pos - h.pos) <= h.cls.range and self.vulnerable(s):
                return s
        return None

    def enemy_in_reach(self, h: Hero, j: int, reach: int) -> bool:
        e = self.team[1 - h.team][j]
        return e.alive and e.lane == h.lane and abs(e.pos - h.pos) <= reach

    def can_cast(self, h: Hero, spell: str) -> bool:
        a = ABILITIES[spell]
        return h.cooldowns[spell] == 0 and h.mana >= a.mana and h.level >= a.min_level

    def _nova_targets(self, h: Hero) -> list[Hero | Creep]:
        radius = h.cls.spells[1][1]
        units: list[Hero | Creep] = [c for c in self.creeps[h.lane] if c.team != h.team]
        units += [e for e in self.team[1 - h.team] if e.alive and e.lane == h.lane]
        return [u for u in units if abs(u.pos - h.pos) <= radius]

    def legal(self, k: int) -> list[bool]:
        """The action mask of hero k (cached for the tick). A dead hero may only hold."""
        if k not in self._masks:
            self._masks[k] = self._mask(self.heroes[k])
        return self._masks[k]

    def _mask(self, h: Hero) -> list[bool]:
        if not h.alive:
            return [i == 0 for i in range(len(self.actions))]
        own, fountain = h.own(h.pos), self.at_fountain(h)
        flags = {
            "hold": True,
            "advance": own < LANE_LEN,
            "retreat": own > 0,
            "attack_creep": self.creep_target(h) is not None,
            "attack_tower": self.structure_target(h) is not None,
            "nova": self.can_cast(h, "nova") and bool(self._nova_targets(h)),
        }
        spells = {"attack": h.cls.range, "strike": h.cls.spells[0][1], "ult": h.cls.spells[2][1]}
        mask = []
        for kind, arg in self._decoded:
            if kind in flags:
                ok = flags[kind]
            elif kind in spells:
                ok = (kind == "attack" or self.can_cast(h, kind)) and self.enemy_in_reach(h, arg, spells[kind])
            elif kind == "buy":
                ok = fountain and h.gold >= ITEMS[arg].cost and len(h.items) < rules.MAX_ITEMS
            else:  # lane
                ok = fountain and self.variant.lanes[h.lane] != arg
            mask.append(ok)
        return mask

    # -- one tick --------------------------------------------------------------------------------
    def step(self, actions: Sequence[int]) -> None:
        """Advance one tick; actions[k] is hero k's action index. An illegal action is played as hold
        (and flagged in `self.illegal`)."""
        if self.over:
            raise RuntimeError("Game.step() after the game is over")
        if len(actions) != len(self.heroes):
            raise ValueError(f"Game.step: {len(actions)} actions for {len(self.heroes)} heroes")
        chosen = []
        for k, a in enumerate(actions):
            ok = 0 <= int(a) < len(self.actions) and self.legal(k)[int(a)]
            self.illegal[k] = not ok
            chosen.append(self._decoded[int(a)] if ok else ("hold", None))
        self._shop(chosen)
        hits, idle = self._hero_hits(chosen), []
        hits += self._creep_hits(idle)
        hits += self._structure_hits()
        self._resolve(hits)
        self._move(chosen, idle)
        self._upkeep()
        self._masks.clear()
        self.tick += 1
        if self.tick % rules.WAVE_PERIOD == 0:
            self._spawn_wave()
        self._check_end()

    def _shop(self, chosen: list[tuple[str, Any]]) -> None:
        for h, (kind, arg) in zip(self.heroes, chosen):
            if kind == "buy":
                item = ITEMS[arg]
                h.gold -= item.cost
                h.items.append(arg)
                before = h.max_hp, h.max_mana
                h.refresh()
                h.hp += h.max_hp - before[0]
                h.mana += h.max_mana - before[1]
            elif kind == "lane":
                h.lane = self.variant.lanes.index(arg)

    def _roll(self, attack: float) -> float:
        s = rules.DAMAGE_SPREAD
        return float(round(attack * (1 - s + 2 * s * self.rng.random())))

    def _hero_hits(self, chosen: list[tuple[str, Any]]) -> list[tuple[Hero | None, Any, float]]:
        hits: list[tuple[Hero | None, Any, float]] = []
        for h, (kind, arg) in zip(self.heroes, chosen):
            enemy = self.team[1 - h.team][arg] if isinstance(arg, int) else None
            if kind == "attack_creep":
                hits.append((h, self.creep_target(h), self._roll(h.attack)))
            elif kind == "attack_tower":
                hits.append((h, self.structure_target(h), self._roll(h.attack)))
            elif kind == "attack":
                hits.append((h, enemy, self._roll(h.attack)))
            elif kind in ABILITIES:
                spell = ABILITIES[kind]
                h.mana -= spell.mana
                h.cooldowns[kind] = spell.cooldown
                damage = h.cls.spells[("strike", "nova", "ult").index(kind)][0] * h.power
                targets = self._nova_targets(h) if kind == "nova" else [enemy]
                hits += [(h, t, float(round(damage))) for t in targets]
        return hits

    def _creep_hits(self, idle: list[Creep]) -> list[tuple[Hero | None, Any, float]]:
        """Each creep shoots the nearest enemy creep in range, else an enemy hero, else a structure it can
        damage; a creep with nothing in range goes in `idle` (it walks on)."""
        hits: list[tuple[Hero | None, Any, float]] = []
        for lane, creeps in enumerate(self.creeps):
            heroes = [h for h in self.heroes if h.alive and h.lane == lane]
            for c in creeps:
                r = c.stats.range
                target = _nearest(c, [o for o in creeps if o.team != c.team], r)
                target = target or _nearest(c, [h for h in heroes if h.team != c.team], r)
                target = target or _nearest(c, [s for s in self.structures(1 - c.team, lane) if self.vulnerable(s)], r)
                if target is None:
                    idle.append(c)
                else:
                    hits.append((None, target, self._roll(c.stats.attack)))
        return hits

    def _structure_hits(self) -> list[tuple[Hero | None, Any, float]]:
        """A structure shoots an enemy hero that hit one of its heroes last tick, else the nearest enemy creep,
        else the nearest enemy hero."""
        hits: list[tuple[Hero | None, Any, float]] = []
        for team in (0, 1):
            for lane in range(len(self.creeps)):
                heroes = [h for h in self.team[1 - team] if h.alive and h.lane == lane]
                aggro = [h for h in heroes if h.aggro == self.tick - 1]
                creeps = [c for c in self.creeps[lane] if c.team != team]
                for s in self.structures(team, lane):
                    if s.hp <= 0 or (s.tier == 2 and lane > 0 and self._base_busy(s, lane)):
                        continue
                    r = s.stats.range
                    target = _nearest(s, aggro, r) or _nearest(s, creeps, r) or _nearest(s, heroes, r)
                    if target is not None:
                        hits.append((None, target, float(s.stats.attack)))
        return hits

    def _base_busy(self, base: Structure, lane: int) -> bool:
        """The base (one structure on every lane) shoots once a tick: at the first lane with a target."""
        for k in range(lane):
            enemies = [c for c in self.creeps[k] if c.team != base.team]
            enemies += [h for h in self.team[1 - base.team] if h.alive and h.lane == k]
            if _nearest(base, enemies, base.stats.range) is not None:
                return True
        return False

    def _resolve(self, hits: list[tuple[Hero | None, Any, float]]) -> None:
        credit: dict[Any, dict[Hero, float]] = {}
        for attacker, target, damage in hits:
            if target is None:
                continue
            target.hp -= damage
            by = credit.setdefault(target, {})
            if attacker is not None:
                by[attacker] = by.get(attacker, 0.0) + damage
                if isinstance(target, Hero):
                    attacker.aggro = self.tick
        # (unit, killer, level): levels as the tick began, so bounties do not depend on the order of deaths
        dying = [
            (t, max(by, key=lambda h: (by[h], -h.index)) if by else None, getattr(t, "level", 0))
            for t, by in credit.items()
            if t.hp <= 0
        ]
        for target, killer, level in dying:  # rewards first: a hero that dies this tick still shares in them
            self._bounty(target, killer, level)
        for target, _, level in dying:
            if isinstance(target, Hero):
                target.hp, target.respawn, target.deaths = 0.0, rules.respawn_ticks(level), target.deaths + 1
                target.pos = absolute(target.team, 0)
            elif isinstance(target, Structure):
                target.hp = 0.0
        for lane, creeps in enumerate(self.creeps):
            self.creeps[lane] = [c for c in creeps if c.hp > 0]

    def _bounty(self, unit: Any, killer: Hero | None, level: int) -> None:
        """Gold and XP for a unit that dies this tick (a hero at `level`)."""
        if isinstance(unit, Creep):
            if killer is not None:
                self._gold(killer, unit.stats.gold)
                killer.last_hits += 1
            self._share_xp(1 - unit.team, unit.lane, unit.pos, unit.stats.xp)
        elif isinstance(unit, Hero):
            if killer is not None:
                killer.kills += 1
                self._gold(killer, rules.HERO_KILL_GOLD[0] + rules.HERO_KILL_GOLD[1] * level)
            self._share_xp(1 - unit.team, unit.lane, unit.pos, rules.HERO_KILL_XP[0] + rules.HERO_KILL_XP[1] * level)
        else:
            for h in self.team[1 - unit.team]:
                self._gold(h, rules.STRUCTURE_GOLD)
                self._xp(h, rules.STRUCTURE_XP)

    def _gold(self, h: Hero, gold: int) -> None:
        h.gold += gold
        h.earned += gold

    def _share_xp(self, team: int, lane: int, pos: int, xp: int) -> None:
        near = [h for h in self.team[team] if h.alive and h.lane == lane and abs(h.pos - pos) <= rules.XP_RANGE]
        for h in near:
            self._xp(h, xp // len(near))

    def _xp(self, h: Hero, xp: int) -> None:
        h.xp += xp
        while h.level < len(rules.XP_LEVELS) and h.xp >= rules.XP_LEVELS[h.level]:
            h.level += 1
            before = h.max_hp, h.max_mana
            h.refresh()
            if h.alive:
                h.hp += h.max_hp - before[0]
                h.mana += h.max_mana - before[1]

    def _move(self, chosen: list[tuple[str, Any]], idle: list[Creep]) -> None:
        for h, (kind, _) in zip(self.heroes, chosen):
            if h.alive and kind in ("advance", "retreat"):
                step = rules.HERO_SPEED * (1 if kind == "advance" else -1) * (1 if h.team == 0 else -1)
                h.pos = min(LANE_LEN, max(0, h.pos + step))
        for c in idle:
            if c.hp > 0:
                c.pos = min(LANE_LEN, max(0, c.pos + (rules.CREEP_SPEED if c.team == 0 else -rules.CREEP_SPEED)))

    def _upkeep(self) -> None:
        for h in self.heroes:
            h.gold += rules.PASSIVE_GOLD
            h.earned += rules.PASSIVE_GOLD
            if not h.alive:
                h.respawn -= 1
                if h.respawn == 0:
                    h.hp, h.mana, h.pos = float(h.max_hp), float(h.max_mana), absolute(h.team, 0)
                continue
            regen = rules.REGEN
            share = rules.FOUNTAIN_REGEN if self.at_fountain(h) else 0.0
            h.hp = min(h.max_hp, h.hp + regen + share * h.max_hp)
            h.mana = min(h.max_mana, h.mana + regen + share * h.max_mana)
            for spell, cd in h.cooldowns.items():
                if cd:
                    h.cooldowns[spell] = cd - 1

    def _spawn_wave(self) -> None:
        for lane, creeps in enumerate(self.creeps):
            for team in (0, 1):
                creeps.extend(Creep(team, lane, kind) for kind in rules.WAVE)

    def _check_end(self) -> None:
        fallen = [b.hp <= 0 for b in self.bases]
        if any(fallen):
            self.over = True
            self.winner = fallen.index(False) if not all(fallen) else self.tiebreak()
        elif self.tick >= self.max_ticks:
            self.over, self.truncated, self.winner = True, True, self.tiebreak()

    def finish(self) -> None:
        """End the game now, decided by the tie-break (as at the step limit)."""
        if not self.over:
            self.over, self.truncated, self.winner = True, True, self.tiebreak()

    # -- outcome and statistics ------------------------------------------------------------------
    def tiebreak(self) -> int | None:
        """The leading team now: more base HP, then more tower HP; None when equal (a draw)."""
        keys = [
            (max(0.0, self.bases[t].hp), sum(max(0.0, s.hp) for lane in self.towers[t] for s in lane)) for t in (0, 1)
        ]
        if keys[0] == keys[1]:
            return None
        return 0 if keys[0] > keys[1] else 1

    def result(self, team: int) -> int:
        """+1 win, 0 draw (or not over), -1 loss."""
        if not self.over or self.winner is None:
            return 0
        return 1 if self.winner == team else -1

    def structure_share(self, team: int) -> float:
        """The team's remaining structure HP as a share of its full structure HP."""
        towers = [s for lane in self.towers[team] for s in lane]
        full = BASE.hp + TOWER.hp * len(towers)
        return (max(0.0, self.bases[team].hp) + sum(max(0.0, s.hp) for s in towers)) / full

    def potential(self, team: int) -> float:
        """Phi in [-1, 1] for reward shaping: half the gold+XP lead (tanh over 1000 per hero), half the
        structure lead. 0 at the start of every game (symmetric)."""
        lead = self.team_stats(team)
        econ = math.tanh((lead["gold_diff"] + lead["xp_diff"]) / (1000.0 * self.variant.heroes))
        return 0.5 * econ + 0.5 * (self.structure_share(team) - self.structure_share(1 - team))

    def team_stats(self, team: int) -> dict[str, Any]:
        mine, theirs = self.team[team], self.team[1 - team]
        towers = lambda t: sum(s.hp <= 0 for lane in self.towers[t] for s in lane)  # noqa: E731
        return {
            "kills": sum(h.kills for h in mine),
            "deaths": sum(h.deaths for h in mine),
            "gold": sum(h.earned for h in mine),
            "xp": sum(h.xp for h in mine),
            "last_hits": sum(h.last_hits for h in mine),
            "gold_diff": sum(h.earned for h in mine) - sum(h.earned for h in theirs),
            "xp_diff": sum(h.xp for h in mine) - sum(h.xp for h in theirs),
            "towers_destroyed": towers(1 - team),
            "towers_lost": towers(team),
        }


def _nearest(unit: Any, candidates: Sequence[Any], reach: int) -> Any:
    best, best_d = None, reach + 1
    for c in candidates:
        d = abs(c.pos - unit.pos)
        if d < best_d:
            best, best_d = c, d
    return best
