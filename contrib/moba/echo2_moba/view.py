"""What one hero sees: a JSON-able dict, in its own perspective (0 = its fountain, 24 = the enemy's).

The rule-based bots and the LLM serializer read the same dict. Heroes are named by side: `A0..` for
the hero's team (itself included), `E0..` for the enemy team, with the index the action names use
(`attack_e1` hits E1). The game has no fog of war: every unit is visible to both teams.
"""

from __future__ import annotations

from typing import Any

from .game import Game, Hero
from .rules import ABILITIES, BASE, TOWER, XP_LEVELS

__all__ = ["hero_view"]


def _other(g: Game, h: Hero, viewer: Hero) -> dict[str, Any]:
    side = "A" if h.team == viewer.team else "E"
    return {
        "name": f"{side}{h.index}",
        "class": h.cls.name,
        "lane": g.variant.lanes[h.lane],
        "pos": viewer.own(h.pos),
        "hp": int(h.hp),
        "max_hp": h.max_hp,
        "level": h.level,
        "alive": h.alive,
        "respawn": h.respawn,
    }


def _you(g: Game, h: Hero) -> dict[str, Any]:
    out = _other(g, h, h)
    nxt = XP_LEVELS[h.level] if h.level < len(XP_LEVELS) else None
    out.update(
        {
            "mana": int(h.mana),
            "max_mana": h.max_mana,
            "xp": h.xp,
            "next_xp": nxt,
            "gold": h.gold,
            "attack": h.attack,
            "range": h.cls.range,
            "items": list(h.items),
            "cooldowns": {s: (h.cooldowns[s] if h.level >= ABILITIES[s].min_level else None) for s in ABILITIES},
            "at_fountain": g.at_fountain(h),
        }
    )
    return out


def _lane(g: Game, lane: int, viewer: Hero) -> dict[str, Any]:
    team = viewer.team
    creeps = sorted(g.creeps[lane], key=lambda c: viewer.own(c.pos))
    return {
        "ally_creeps": [[viewer.own(c.pos), int(c.hp)] for c in creeps if c.team == team],
        "enemy_creeps": [[viewer.own(c.pos), int(c.hp)] for c in creeps if c.team != team],
        "ally_towers": [[viewer.own(s.pos), int(max(0, s.hp))] for s in g.towers[team][lane]],
        "enemy_towers": [[viewer.own(s.pos), int(max(0, s.hp)), g.vulnerable(s)] for s in g.towers[1 - team][lane]],
    }


def _lane_summary(g: Game, lane: int, team: int) -> dict[str, Any]:
    creeps = g.creeps[lane]
    return {
        "ally_towers": [int(max(0, s.hp)) for s in g.towers[team][lane]],
        "enemy_towers": [int(max(0, s.hp)) for s in g.towers[1 - team][lane]],
        "ally_creeps": sum(c.team == team for c in creeps),
        "enemy_creeps": sum(c.team != team for c in creeps),
    }


def hero_view(g: Game, k: int) -> dict[str, Any]:
    """The state hero k acts on (see the module docstring)."""
    h = g.heroes[k]
    team, lanes = h.team, g.variant.lanes
    stats = g.team_stats(team)
    enemy_base = g.bases[1 - team]
    return {
        "variant": g.variant.name,
        "tick": g.tick,
        "max_ticks": g.max_ticks,
        "you": _you(g, h),
        "allies": [_other(g, a, h) for a in g.team[team] if a is not h],
        "enemies": [_other(g, e, h) for e in g.team[1 - team]],
        "lane": _lane(g, h.lane, h),
        "other_lanes": {lanes[k]: _lane_summary(g, k, team) for k in range(len(lanes)) if k != h.lane},
        "bases": {
            "ally": int(max(0, g.bases[team].hp)),
            "enemy": int(max(0, enemy_base.hp)),
            "max": BASE.hp,
            "enemy_vulnerable": g.vulnerable(enemy_base),
        },
        "tower_max": TOWER.hp,
        "score": {k: stats[k] for k in ("kills", "deaths", "gold_diff", "xp_diff", "towers_destroyed", "towers_lost")},
    }
