"""The rules of the lane-battle MOBA as data: variants, the map, hero classes, abilities, items, creeps,
structures, and the discrete action list. Nothing here runs the game (see `game.py`).

Geometry. Every lane is a line of integer cells 0..LANE_LEN. Positions are *own-perspective* in every
view a hero (or a model) gets: 0 is its own fountain, LANE_LEN the enemy's. Each team has, on every lane,
an outer and an inner tower, and one base shared by all lanes. A structure can be damaged only when the
one in front of it has fallen: the outer tower first, then the inner one, then the base (once the inner
tower of any lane is down). A team's heroes heal and shop at their fountain (own position <= FOUNTAIN).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Variant",
    "HeroClass",
    "Ability",
    "Item",
    "UnitStats",
    "VARIANTS",
    "CLASSES",
    "ABILITIES",
    "ITEMS",
    "CREEPS",
    "TOWER",
    "BASE",
    "action_names",
]

LANE_LEN = 24
FOUNTAIN = 1  # own position <= FOUNTAIN: at the fountain (heal, shop, change lane)
SPAWN = 2  # own position where creeps appear
BASE_POS = 1
TOWER_POS = (9, 5)  # outer, inner (own perspective)
HERO_SPEED = 2
CREEP_SPEED = 1
WAVE_PERIOD = 15  # ticks between creep waves (the first at tick 0)
WAVE = ("melee", "melee", "ranged")
XP_RANGE = 6  # heroes within this distance share the XP of a dying enemy
XP_LEVELS = (0, 120, 300, 540, 840, 1200)  # XP needed for levels 1..6
MAX_ITEMS = 4
START_GOLD = 300
PASSIVE_GOLD = 1  # per tick
REGEN = 2  # HP and mana per tick
FOUNTAIN_REGEN = 0.15  # share of max HP and mana per tick at the fountain
DAMAGE_SPREAD = 0.1  # every attack deals attack * uniform(1 - spread, 1 + spread), from the game's seeded RNG
HERO_KILL_GOLD = (150, 20)  # base + per victim level, to the killer
HERO_KILL_XP = (80, 20)  # base + per victim level, shared by the killer's team within XP_RANGE
STRUCTURE_GOLD = 100  # to every hero of the destroying team
STRUCTURE_XP = 80


def respawn_ticks(level: int) -> int:
    return 4 + 2 * level


@dataclass(frozen=True)
class Variant:
    name: str
    heroes: int  # per team
    lanes: tuple[str, ...]
    max_ticks: int  # the step limit; then the tie-break (base HP, then tower HP) decides

    def lane_of(self, index: int) -> int:
        """The lane a team's hero `index` starts in: mid, top, bot, top, bot (one lane: mid)."""
        if len(self.lanes) == 1:
            return 0
        return (1, 0, 2, 0, 2)[index % 5]


VARIANTS = {
    "lane_1v1_v1": Variant("lane_1v1_v1", 1, ("mid",), 300),
    "3v3_v1": Variant("3v3_v1", 3, ("top", "mid", "bot"), 400),
    "5v5_v1": Variant("5v5_v1", 5, ("top", "mid", "bot"), 450),
}


@dataclass(frozen=True)
class Ability:
    name: str
    mana: int
    cooldown: int
    min_level: int
    targeted: bool  # on one enemy hero (strike, ult) or on every enemy unit around the hero (nova)


ABILITIES = {
    "strike": Ability("strike", 40, 4, 1, True),
    "nova": Ability("nova", 60, 8, 1, False),
    "ult": Ability("ult", 100, 20, 3, True),
}


@dataclass(frozen=True)
class HeroClass:
    """Base stats at level 1 and growth per level; `spells` holds (damage, range) per ability."""

    name: str
    hp: int
    hp_per_level: int
    mana: int
    mana_per_level: int
    attack: int
    attack_per_level: int
    range: int
    spells: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]  # strike, nova (radius), ult
    build: tuple[str, ...]  # the order in which the focus-fire bot buys items


CLASSES = {  # name, hp (+/level), mana (+/level), attack (+/level), range, spells, build
    "warrior": HeroClass(
        "warrior", 620, 70, 150, 15, 38, 4, 1, ((90, 2), (70, 2), (240, 2)), ("vest", "blade", "blade", "vest")
    ),
    "mage": HeroClass(
        "mage", 440, 50, 260, 25, 26, 3, 3, ((120, 4), (90, 3), (300, 4)), ("orb", "vest", "orb", "blade")
    ),
    "marksman": HeroClass(
        "marksman", 480, 55, 180, 15, 40, 5, 3, ((80, 4), (50, 2), (200, 4)), ("blade", "blade", "vest", "orb")
    ),
}


@dataclass(frozen=True)
class Item:
    name: str
    cost: int
    attack: int = 0
    hp: int = 0
    mana: int = 0
    power: float = 0.0  # added to the ability damage multiplier


ITEMS = {
    "blade": Item("blade", 300, attack=15),
    "vest": Item("vest", 300, hp=150),
    "orb": Item("orb", 350, mana=80, power=0.2),
}


@dataclass(frozen=True)
class UnitStats:
    hp: int
    attack: int
    range: int
    gold: int = 0  # bounty for the hero that lands the killing blow (creeps)
    xp: int = 0  # shared by enemy heroes within XP_RANGE


CREEPS = {
    "melee": UnitStats(hp=120, attack=10, range=1, gold=30, xp=40),
    "ranged": UnitStats(hp=80, attack=14, range=2, gold=40, xp=50),
}
TOWER = UnitStats(hp=700, attack=60, range=3)
BASE = UnitStats(hp=1200, attack=80, range=3)


def action_names(variant: Variant) -> tuple[str, ...]:
    """The discrete action space, the same for every hero of a variant. Enemy heroes are e0..e{n-1} (their
    index in their team), so an action index means the same thing for both teams."""
    enemies = range(variant.heroes)
    names = ["hold", "advance", "retreat", "attack_creep", "attack_tower"]
    names += [f"attack_e{j}" for j in enemies]
    names += [f"strike_e{j}" for j in enemies]
    names += ["nova"]
    names += [f"ult_e{j}" for j in enemies]
    names += [f"buy_{item}" for item in ITEMS]
    if len(variant.lanes) > 1:
        names += [f"lane_{lane}" for lane in variant.lanes]
    return tuple(names)
