"""The MOBA sandbox (contrib/moba, `echo2-moba`): env-only throughput and the bot ladder.

* throughput, per variant, on one core: `MobaParallelEnv.step` calls (ticks) per second with bots on
  both sides (focus_fire blue, pusher red, each bot reading its hero's view), over --seconds of whole
  seeded games. Baselines in the same run: the same env with every hero holding (the env's own cost:
  rules, observation vectors, masks), and the bare `Game` with the same bots (no PettingZoo layer);
* the ladder, per variant: every pair of bots (passive, pusher, focus_fire) over --games seeded games,
  sides alternating: win rate, draws, mean gold and XP lead, kills, deaths, towers destroyed, game length.

    .venv/bin/python bench/moba.py                      # all variants, 200 games per pair
    .venv/bin/python bench/moba.py --variants lane_1v1_v1 --games 50 --table

Prints one JSON line per measurement, with its parameters (`--table` adds the ladder as markdown on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy's small ops never thread anyway


def _throughput(variant: str, mode: str, seconds: float, seed: int) -> dict:
    from echo2_moba import Game, make_bot, parallel_env
    from echo2_moba.evaluation import bot_actions

    env = parallel_env(variant)
    steps = games = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if mode == "game+bots":
            game = Game(variant, seed + games)
        else:
            env.reset(seed=seed + games)
            game = env.game
        n = len(game.heroes)
        bots = {k: make_bot("focus_fire" if k < n // 2 else "pusher") for k in range(n)}
        rng = random.Random(seed + games)
        while not game.over:
            chosen = bot_actions(game, bots, rng) if mode != "env_hold" else {}
            if mode == "game+bots":
                game.step([chosen[k] for k in range(n)])
            else:
                env.step({a: chosen.get(k, 0) for k, a in enumerate(env.possible_agents)})
            steps += 1
        games += 1
    wall = time.perf_counter() - t0
    return {"steps_per_s": steps / wall, "games": games, "steps": steps, "wall_s": wall}


def main() -> None:
    from echo2_moba import BOTS, VARIANTS, format_ladder, ladder

    p = argparse.ArgumentParser()
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--games", type=int, default=200, help="seeded games per ladder pair")
    p.add_argument("--seconds", type=float, default=5.0, help="wall time per throughput measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", action="store_true", help="also print the ladder as markdown (stderr)")
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        base = None
        for mode in ("env+bots", "env_hold", "game+bots"):
            r = _throughput(variant, mode, args.seconds, args.seed)
            base = base or r["steps_per_s"]
            line = {"bench": "moba_throughput", "variant": variant, "mode": mode, "seconds": args.seconds, **r}
            line["vs_env+bots"] = r["steps_per_s"] / base
            print(json.dumps(line), flush=True)
    rows = []
    for variant in variants:
        t0 = time.perf_counter()
        for row in ladder(variant, BOTS, games=args.games, seed=args.seed):
            print(json.dumps({"bench": "moba_ladder", **row}), flush=True)
            rows.append(row)
        print(json.dumps({"bench": "moba_ladder_time", "variant": variant, "games_per_pair": args.games,
                          "wall_s": time.perf_counter() - t0}), flush=True)
    if args.table:
        print(format_ladder(rows), file=sys.stderr)


if __name__ == "__main__":
    main()
