"""Bot games, matches and the ladder table; and `summarize`, which turns the summaries of evaluated LLM
episodes (the records' `meta.extra`) into the same statistics.

    match("lane_1v1_v1", "focus_fire", "passive", games=200)     # one cell: a's win rate, gold/XP lead, kills
    rows = ladder("lane_1v1_v1", games=200); print(format_ladder(rows))

A match alternates sides (even games: `a` plays blue), so the first-listed team has no edge. Game i of a
match with seed s plays the game seeded `s + i`, the same games for every pair.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .bots import BOTS, Bot, make_bot
from .game import Game
from .view import hero_view

__all__ = ["bot_actions", "play_game", "match", "ladder", "format_ladder", "summarize"]


def bot_actions(game: Game, bots: Mapping[int, Bot], rng: random.Random) -> dict[int, int]:
    """The action index of every hero in `bots` (hero index -> bot) for this tick; dead heroes hold."""
    out = {}
    for k, bot in bots.items():
        if not game.heroes[k].alive:
            out[k] = 0
            continue
        legal = [a for a, ok in zip(game.actions, game.legal(k)) if ok]
        out[k] = game.actions.index(bot.act(hero_view(game, k), legal, rng))
    return out


def _lineup(spec: str | Sequence[str], n: int) -> list[str]:
    names = [spec] * n if isinstance(spec, str) else list(spec)
    for name in names:
        if name not in BOTS:
            from echo2sdk.errors import NameNotFound

            raise NameNotFound("moba bot", str(name), BOTS)
    if len(names) != n:
        raise ValueError(f"{len(names)} bots for a team of {n}")
    return names


def play_game(
    variant: str, blue: str | Sequence[str], red: str | Sequence[str], seed: int = 0, max_ticks: int | None = None
) -> dict[str, Any]:
    """One bot-vs-bot game: {"winner": 0 | 1 | None, "ticks", "truncated", "blue": stats, "red": stats}."""
    game = Game(variant, seed, max_ticks)
    n = game.variant.heroes
    names = _lineup(blue, n) + _lineup(red, n)
    bots = {k: make_bot(name) for k, name in enumerate(names)}
    rng = random.Random(f"{seed}|bots")
    while not game.over:
        chosen = bot_actions(game, bots, rng)
        game.step([chosen[k] for k in range(len(game.heroes))])
    return {
        "winner": game.winner,
        "ticks": game.tick,
        "truncated": game.truncated,
        "blue": game.team_stats(0),
        "red": game.team_stats(1),
    }


def _stats(results: Iterable[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """(result for the side, that side's team stats) per game -> the match statistics."""
    rows = list(results)
    n = len(rows)
    mean = lambda key: statistics.fmean(s[key] for _, s in rows) if n else float("nan")  # noqa: E731
    return {
        "games": n,
        "wins": sum(r == 1 for r, _ in rows),
        "draws": sum(r == 0 for r, _ in rows),
        "losses": sum(r == -1 for r, _ in rows),
        "win_rate": sum(r == 1 for r, _ in rows) / max(1, n),
        "score": (sum(r == 1 for r, _ in rows) + 0.5 * sum(r == 0 for r, _ in rows)) / max(1, n),
        "gold_diff": mean("gold_diff"),
        "xp_diff": mean("xp_diff"),
        "kills": mean("kills"),
        "deaths": mean("deaths"),
        "towers_destroyed": mean("towers_destroyed"),
    }


def match(variant: str, a: str, b: str, games: int = 200, seed: int = 0, max_ticks: int | None = None) -> dict[str, Any]:
    """`a` against `b` over `games` seeded games, sides alternating; the statistics are a's (gold and XP
    differences are a's team minus b's, means per game)."""
    rows, ticks = [], []
    for i in range(games):
        a_blue = i % 2 == 0
        g = play_game(variant, a if a_blue else b, b if a_blue else a, seed + i, max_ticks)
        side = 0 if a_blue else 1
        result = 0 if g["winner"] is None else (1 if g["winner"] == side else -1)
        rows.append((result, g["blue" if a_blue else "red"]))
        ticks.append(g["ticks"])
    return {"variant": variant, "bot": a, "opponent": b, "seed": seed, **_stats(rows), "ticks": statistics.fmean(ticks)}


def ladder(variant: str, bots: Sequence[str] = BOTS, games: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Every pair of `bots` (each unordered pair once, the stronger-listed first: later in BOTS order)."""
    order = list(bots)
    pairs = [(order[j], order[i]) for i in range(len(order)) for j in range(i + 1, len(order))]
    return [match(variant, a, b, games, seed) for a, b in pairs]


def format_ladder(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table: one row per match."""
    head = "| variant | bot | opponent | games | win rate | draws | gold diff | XP diff | kills | deaths | towers | ticks |"
    out = [head, "|" + "---|" * 12]
    for r in rows:
        out.append(
            f"| {r['variant']} | {r['bot']} | {r['opponent']} | {r['games']} | {r['win_rate']:.1%} | {r['draws']} | "
            f"{r['gold_diff']:+.0f} | {r['xp_diff']:+.0f} | {r['kills']:.2f} | {r['deaths']:.2f} | "
            f"{r['towers_destroyed']:.2f} | {r['ticks']:.0f} |"
        )
    return "\n".join(out)


def summarize(extras: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Statistics of evaluated episodes from their sandbox summaries (a record's `meta.extra`: `result`,
    `gold_diff`, `xp_diff`, `kills`, `deaths`, `towers_destroyed`): what `echo2 eval` prints per cell."""
    return _stats((int(e["result"]), e) for e in extras)
