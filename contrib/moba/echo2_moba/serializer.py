"""Text for LLM policies: the serializer `moba_obs->prompt_v2` (a hero's view as a compact prompt with a
numbered list of the legal actions) and the action renderer `MobaActionRenderer` (the answer format of
echo2sdk's `action->text_v1`, `<answer>ACTION</answer>`, where ACTION is a legal action's name or its
number in that list).

The plug-in ships the renderer under the name `action->text_v1` (an env plug-in's components are
resolved before the built-ins), so `SandboxAdapter(env="moba://lane_1v1_v1")` accepts numbers as well
as names; for names alone it parses exactly like the built-in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from echo2sdk.adapters.contracts import Observation, ParsedAction

from .rules import ITEMS, LANE_LEN, TOWER_POS, VARIANTS, WAVE_PERIOD

__all__ = ["MobaPrompt", "MobaActionRenderer"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_ANSWER = re.compile(r"<answer>\s*([^<\n]*)", re.IGNORECASE)
_NUMBERED = re.compile(r"(\d{1,3})\s*[.):]?\s*(.*)", re.DOTALL)


def _norm(text: str) -> str:
    return re.sub(r"[\s\-]+", "_", text.strip().strip(".!\"'`*").strip().lower())


class MobaActionRenderer:
    """`<answer>ACTION</answer>` with ACTION a legal action's name (case, spaces and hyphens as in
    `action->text_v1`) or its number in the prompt's list ("3", "3.", "3. attack_creep"). Never raises:
    "ok"; "illegal" (an answer naming no legal action, or a number outside the list, or a number whose
    name disagrees); "unparsable" (no answer)."""

    def instructions(self, legal: Sequence[str]) -> str:
        return "Answer with one legal action, by name or number, as <answer>ACTION</answer>."

    def _match(self, answer: str, legal: Sequence[str]) -> str | None:
        by_norm = {_norm(a): a for a in legal}
        key = _norm(answer)
        if key in by_norm:
            return by_norm[key]
        m = _NUMBERED.fullmatch(answer.strip())
        if m is None:
            return None
        k, rest = int(m.group(1)), _norm(m.group(2))
        if not 1 <= k <= len(legal):
            return None
        if rest and by_norm.get(rest) != legal[k - 1]:
            return None
        return legal[k - 1]

    def parse(self, text: str, legal: Sequence[str]) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction(None, "unparsable")
        tags = _ANSWER.findall(text)
        if tags:
            answer = tags[-1]
        elif self._match(text, legal) is not None:
            answer = text
        elif m := _OPEN_ANSWER.search(text):
            answer = m.group(1)
        else:
            return ParsedAction(None, "unparsable", text.strip()[:40])
        if not _norm(answer):
            return ParsedAction(None, "unparsable", "")
        action = self._match(answer, legal)
        return ParsedAction(action, "ok" if action else "illegal", answer.strip()[:40])


def _hero(e: Mapping[str, Any]) -> str:
    if not e["alive"]:
        return f"{e['name']} {e['class']} L{e['level']} dead (back in {e['respawn']})"
    return f"{e['name']} {e['class']} L{e['level']} {e['lane']} at {e['pos']} HP {e['hp']}/{e['max_hp']}"


def _creeps(units: Sequence[Sequence[int]], front: Any) -> str:
    if not units:
        return "none"
    return f"{len(units)}, front {front(p for p, _ in units)}, weakest {min(hp for _, hp in units)} HP"


def _towers(towers: Sequence[Sequence[Any]], base: int, guarded: bool) -> str:
    """[[pos, hp(, vulnerable)], ...] (outer, inner) -> 'outer 700, inner 700 guarded, base 1200 guarded'."""
    parts = []
    for name, t in zip(("outer", "inner"), towers):
        parts.append(f"{name} " + ("down" if t[1] <= 0 else str(t[1]) + (" guarded" if len(t) > 2 and not t[2] else "")))
    return ", ".join(parts) + f", base {base}" + (" guarded" if guarded else "")


def _you(s: Mapping[str, Any], turn: int) -> list[str]:
    y = s["you"]
    xp = f"{y['xp']}/{y['next_xp']} XP" if y["next_xp"] else f"{y['xp']} XP, max level"
    cds = ", ".join(
        f"{name} " + ("locked" if cd is None else "ready" if cd == 0 else f"in {cd}") for name, cd in y["cooldowns"].items()
    )
    where = "at your fountain" if y["at_fountain"] else f"at {y['pos']}"
    lasts = f" Each action lasts {s.get('decision_ticks', 1)} ticks." if turn == 1 else ""
    return [
        f"Tick {s['tick']}/{s['max_ticks']}.{lasts} You: {y['name']} {y['class']} L{y['level']} ({xp}), {y['lane']} lane {where}.",
        f"HP {y['hp']}/{y['max_hp']}, mana {y['mana']}/{y['max_mana']}, gold {y['gold']}, attack {y['attack']}, "
        f"items {' '.join(y['items']) or 'none'}; {cds}.",
    ]


def _board(s: Mapping[str, Any]) -> list[str]:
    lane, bases = s["lane"], s["bases"]
    lines = [f"Enemies: {'; '.join(_hero(e) for e in s['enemies'])}."]
    if s["allies"]:
        lines.append(f"Allies: {'; '.join(_hero(a) for a in s['allies'])}.")
    lines.append(f"Creeps: yours {_creeps(lane['ally_creeps'], max)}; enemy {_creeps(lane['enemy_creeps'], min)}.")
    lines.append(
        f"Towers: yours {_towers(lane['ally_towers'], bases['ally'], False)}; "
        f"enemy {_towers(lane['enemy_towers'], bases['enemy'], not bases['enemy_vulnerable'])}."
    )
    for name, o in s["other_lanes"].items():
        towers = f"{'/'.join(map(str, o['ally_towers']))} v {'/'.join(map(str, o['enemy_towers']))}"
        lines.append(f"{name.capitalize()} lane: towers {towers}, creeps {o['ally_creeps']} v {o['enemy_creeps']}.")
    sc = s["score"]
    lines.append(f"Score: kills {sc['kills']}, deaths {sc['deaths']}, gold {sc['gold_diff']:+d}, XP {sc['xp_diff']:+d}.")
    return lines


def _effect(item: Any) -> str:
    parts = [f"+{v} {k}" for k, v in (("attack", item.attack), ("HP", item.hp), ("mana", item.mana)) if v]
    if item.power:
        parts.append(f"+{item.power:.0%} ability damage")
    return ", ".join(parts)


class MobaPrompt:
    """`moba_obs->prompt_v2`: rules in the system prompt; per decision the hero's state, the board and the
    numbered legal actions; one worked turn (from a seeded bot game) before the first state."""

    def system(self, env: str) -> str:
        variant = VARIANTS.get(env.split("://")[-1], VARIANTS["lane_1v1_v1"])
        items = "; ".join(f"{i.name} ({_effect(i)}) {i.cost} gold" for i in ITEMS.values())
        far, (outer, inner) = LANE_LEN, TOWER_POS
        return (
            f"Lane-battle MOBA ({env}), {variant.heroes} heroes a side, lanes: {', '.join(variant.lanes)}. Positions "
            f"run from your fountain (0) to the enemy's ({far}). Towers: yours at {outer} (outer) and {inner} "
            f"(inner), the enemy's at {far - outer} and {far - inner}; bases at 1 and {far - 1}. Destroy the enemy "
            "base to win; a guarded structure cannot be hit before the one in front of it falls; at the time limit "
            f"more base HP, then tower HP, wins. Creep waves come every {WAVE_PERIOD} ticks. A killing blow on a "
            "creep gives gold (attack_creep hits the weakest in range); kills nearby give XP. Towers shoot creeps "
            "first, but shoot heroes who attack their heroes. At your fountain you heal and can buy: "
            f"{items}. strike and ult (from level 3) hit one enemy hero, nova all enemies near you."
        )

    def user(self, observation: Observation, turn: int) -> str:
        s = observation.state
        lines = [*_you(s, turn), *_board(s), "Legal actions:"]
        lines += [f"{i}. {a}" for i, a in enumerate(observation.legal, 1)]
        return "\n".join(lines)

    def examples(self, renderer: Any) -> list[dict[str, str]]:
        out = []
        for obs, action in _example_turns():
            out.append({"role": "user", "content": self.user(obs, 1) + "\n" + renderer.instructions(obs.legal)})
            out.append({"role": "assistant", "content": f"<answer>{action}</answer>"})
        return out


@cache
def _example_turns() -> tuple[tuple[Observation, str], ...]:
    """One decision of the focus-fire bot in a seeded lane_1v1_v1 game against the pusher: its first last
    hit. (One worked turn shows the answer format; every state costs ~280 tokens of context.)"""
    import random

    from .bots import make_bot
    from .evaluation import bot_actions
    from .game import Game
    from .view import hero_view

    game, rng = Game("lane_1v1_v1", seed=3), random.Random(3)
    bots = {0: make_bot("focus_fire"), 1: make_bot("pusher")}
    while not game.over:
        chosen = bot_actions(game, bots, rng)
        name = game.actions[chosen[0]]
        if name == "attack_creep":
            legal = tuple(a for a, ok in zip(game.actions, game.legal(0)) if ok)
            return ((Observation(state={**hero_view(game, 0), "decision_ticks": 4}, legal=legal), name),)
        game.step([chosen[0], chosen[1]])
    raise AssertionError("the example game has no last hit")
