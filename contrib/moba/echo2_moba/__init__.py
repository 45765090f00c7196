"""echo2-moba: lane-battle MOBA sandboxes for echo2sdk, registered as the `moba` env scheme.

    from echo2sdk import SandboxAdapter
    adapter = SandboxAdapter(env="moba://lane_1v1_v1", env_options={"opponent": "focus_fire"})

    from echo2_moba import parallel_env          # the game as a PettingZoo ParallelEnv
    from echo2_moba import ladder, format_ladder # the bot ladder

Importing this package is cheap (plain Python); numpy, gymnasium and pettingzoo load with `parallel_env`.
"""

from __future__ import annotations

from typing import Any

from .bots import BOTS, make_bot
from .evaluation import format_ladder, ladder, match, play_game, summarize
from .game import Game
from .plugin import ENV_IDS, MobaPlugin
from .rules import VARIANTS, action_names
from .serializer import MobaActionRenderer, MobaPrompt

__all__ = [
    "MobaPlugin",
    "ENV_IDS",
    "VARIANTS",
    "BOTS",
    "Game",
    "action_names",
    "make_bot",
    "MobaPrompt",
    "MobaActionRenderer",
    "play_game",
    "match",
    "ladder",
    "format_ladder",
    "summarize",
    "parallel_env",
    "MobaParallelEnv",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("parallel_env", "MobaParallelEnv"):
        from . import env

        return getattr(env, name)
    raise AttributeError(f"module 'echo2_moba' has no attribute {name!r}")
