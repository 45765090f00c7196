"""Rule-based heroes at three strengths. A bot sees what the model sees (`view.hero_view`: its own
perspective, 0 = its fountain) and the legal action names, and returns one of them. One bot object per
hero (the focus-fire bot remembers that it is walking home).

- `passive`: walks to its inner tower and stays there; never attacks, so it last-hits nothing.
- `pusher`: a scripted lane pusher: walks down its lane and hits what is in range (a structure first,
  then the lowest-HP creep, then a hero). No abilities, no shopping, no retreat.
- `focus_fire`: targets the lowest-HP enemy hero in range with its ultimate, strike and nova and its
  attacks, else last-hits creeps; hits a tower only while its own creeps are under it; retreats under
  its nearest tower at low HP and to the fountain at very low HP, where it heals and buys its class's
  items.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .rules import CLASSES, HERO_SPEED, LANE_LEN, TOWER, TOWER_POS

__all__ = ["Bot", "Passive", "Pusher", "FocusFire", "BOTS", "make_bot"]


class Bot(Protocol):
    name: str

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str: ...


class Passive:
    name = "passive"

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        pos = state["you"]["pos"]
        if pos > TOWER_POS[1] and "retreat" in legal:
            return "retreat"
        if pos + HERO_SPEED <= TOWER_POS[1] and "advance" in legal:
            return "advance"
        return "hold"


class Pusher:
    name = "pusher"

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        for action in ("attack_tower", "attack_creep"):
            if action in legal:
                return action
        heroes = [a for a in legal if a.startswith("attack_e")]
        if heroes:
            return heroes[0]
        return "advance" if "advance" in legal else "hold"


class FocusFire:
    name = "focus_fire"
    LOW, VERY_LOW, HEALED = 0.45, 0.25, 0.9  # HP shares: retreat under a tower, walk home, leave the fountain

    def __init__(self) -> None:
        self.going_home = False

    def act(self, state: Mapping[str, Any], legal: Sequence[str], rng: random.Random) -> str:
        you = state["you"]
        if not you["alive"]:
            self.going_home = False
            return "hold"
        hp = you["hp"] / you["max_hp"]
        if you["at_fountain"]:
            build = CLASSES[you["class"]].build
            item = build[len(you["items"])] if len(you["items"]) < len(build) else None
            if item and f"buy_{item}" in legal:
                return f"buy_{item}"
            if hp < self.HEALED:
                return "hold"
            self.going_home = False
        if hp < self.LOW:
            if you["pos"] > _own_tower(state) and "retreat" in legal:
                return "retreat"  # back under the nearest standing tower
            fight = any(a.startswith(("attack_e", "strike_e", "ult_e")) for a in legal)
            self.going_home = self.going_home or hp < self.VERY_LOW or not fight  # nothing to defend: heal
        if self.going_home:
            return "retreat" if "retreat" in legal else "hold"
        return self._fight(state, legal) or self._position(state, legal)

    def _fight(self, state: Mapping[str, Any], legal: Sequence[str]) -> str | None:
        enemy_hp = {e["name"].lower(): e["hp"] for e in state["enemies"]}  # "e0" -> HP
        for spell in ("ult", "strike"):
            reach = sorted((enemy_hp[a.split("_")[1]], a) for a in legal if a.startswith(spell + "_e"))
            if reach:
                return reach[0][1]  # on the lowest-HP enemy hero in reach
        targets = sorted((enemy_hp[a.split("_")[1]], a) for a in legal if a.startswith("attack_e"))
        you = state["you"]
        creeps = [c_hp for p, c_hp in state["lane"]["enemy_creeps"] if abs(p - you["pos"]) <= you["range"]]
        if "nova" in legal and (targets or len(creeps) >= 2):
            return "nova"
        if targets:
            return targets[0][1]
        push = "attack_tower" in legal and (_covered(state) or _lane_clear(state))
        if "attack_creep" in legal and (not push or min(creeps, default=0) <= you["attack"]):
            return "attack_creep"  # a last hit, or nothing better to hit
        return "attack_tower" if push else None

    def _position(self, state: Mapping[str, Any], legal: Sequence[str]) -> str:
        """Walk up to the edge of the enemy structure's range, or into it when our creeps are there."""
        pos, front = state["you"]["pos"], _enemy_front(state)
        edge = front - TOWER.range - 1
        if _covered(state) or _lane_clear(state):
            edge = front - max(1, state["you"]["range"])
        if pos + HERO_SPEED <= edge and "advance" in legal:
            return "advance"
        if pos > edge and "retreat" in legal:
            return "retreat"
        return "hold"


def _own_tower(state: Mapping[str, Any]) -> int:
    """The position of the own tower nearest to the front that still stands (else the base)."""
    standing = [p for p, hp in state["lane"]["ally_towers"] if hp > 0]
    return max(standing, default=1)


def _enemy_front(state: Mapping[str, Any]) -> int:
    """The first enemy structure on the lane that still stands (a tower, else the base)."""
    standing = [p for p, hp, _ in state["lane"]["enemy_towers"] if hp > 0]
    return min(standing, default=LANE_LEN - 1)


def _lane_clear(state: Mapping[str, Any]) -> bool:
    """No enemy hero is alive on our lane and we are healthy: a tower can be hit without creep cover."""
    lane = state["you"]["lane"]
    alone = not any(e["alive"] and e["lane"] == lane for e in state["enemies"])
    return alone and state["you"]["hp"] > 0.7 * state["you"]["max_hp"]


def _covered(state: Mapping[str, Any]) -> bool:
    """Our creeps stand within range of the enemy's front structure (it shoots them, not us)."""
    front = _enemy_front(state)
    return any(abs(p - front) <= TOWER.range for p, _ in state["lane"]["ally_creeps"])


BOTS = ("passive", "pusher", "focus_fire")
_CLASSES = {"passive": Passive, "pusher": Pusher, "focus_fire": FocusFire}


def make_bot(name: str) -> Bot:
    """A fresh bot by name (one per hero: bots may keep state)."""
    return _CLASSES[name]()
