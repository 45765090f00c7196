"""echo2-poker: no-limit hold'em sandboxes for echo2sdk, registered as the `poker` env scheme.

    from echo2sdk import SandboxAdapter
    adapter = SandboxAdapter(env="poker://nlhe_headsup_v1", env_options={"opponent": "tight_aggressive"})

Importing this package is cheap: pettingzoo and rlcard load when the first table is built.
"""

from __future__ import annotations

from .cards import hand_category, preflop_strength
from .opponents import OPPONENTS, RULE_BASED
from .plugin import ENV_IDS, PokerPlugin
from .serializer import ChatPromptV2

__all__ = ["PokerPlugin", "ENV_IDS", "OPPONENTS", "RULE_BASED", "ChatPromptV2", "hand_category", "preflop_strength"]
__version__ = "0.1.0"
