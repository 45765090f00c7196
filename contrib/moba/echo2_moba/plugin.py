"""The `moba` env scheme (entry point `echo2sdk.envs: moba = "echo2_moba:MobaPlugin"`).

    SandboxAdapter(env="moba://lane_1v1_v1", env_options={"opponent": "focus_fire"})

env ids: `lane_1v1_v1` (one lane, one hero a side), `3v3_v1` and `5v5_v1` (three lanes).

env_options (all optional):
  opponent:       bot of the enemy heroes: passive | pusher | focus_fire (default pusher), or a list, one per enemy hero
  ally:           bot of the model's teammates it does not control (default pusher)
  team:           0 (blue, default) or 1 (red)
  control:        how many heroes of its team the model controls, the first ones (default 1)
  decision_ticks: ticks one decision lasts (default 4)
  max_ticks:      the step limit (default: the variant's, 300 / 400 / 450), then the tie-break decides
  shaping:        weight of the potential-based shaping term (default 0.2; 0 for win/loss only)

Defaults for SandboxAdapter: serializer `moba_obs->prompt_v2`; action renderer `action->text_v1` is the
plug-in's own (names or list numbers); a malformed or illegal reply holds and costs `penalty` 0.1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from echo2sdk.core import checks
from echo2sdk.errors import ConfigError, NameNotFound

from .bots import BOTS
from .rules import VARIANTS
from .serializer import MobaActionRenderer, MobaPrompt

__all__ = ["MobaPlugin", "ENV_IDS", "OPTIONS"]

ENV_IDS = tuple(VARIANTS)
OPTIONS = ("opponent", "ally", "team", "control", "decision_ticks", "max_ticks", "shaping")


def _bots(where: str, value: object, n: int) -> None:
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    for name in names:
        if not isinstance(name, str) or name not in BOTS:
            raise NameNotFound(f"moba bot ({where})", str(name), BOTS)
    if isinstance(value, (list, tuple)) and len(names) != n:
        raise ConfigError(f"{where} lists {len(names)} bots for {n} enemy heroes")


class MobaPlugin:
    scheme = "moba"
    default_serializer = "moba_obs->prompt_v2"
    default_penalty = 0.1
    eval_opponents = BOTS  # what `echo2 eval` plays against, weakest first
    eval_metric = "result"  # per game: +1 win, 0 draw, -1 loss
    eval_unit = "game"

    def env_ids(self) -> Sequence[str]:
        return ENV_IDS

    def check(self, env_id: str, options: Mapping[str, Any]) -> None:
        if env_id not in VARIANTS:
            raise NameNotFound("moba env", env_id, ENV_IDS)
        where = f"moba://{env_id} env_options"
        for key in options:
            if key not in OPTIONS:
                raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(OPTIONS)})")
        n = VARIANTS[env_id].heroes
        _bots(f"{where}.opponent", options.get("opponent", "pusher"), n)
        _bots(f"{where}.ally", options.get("ally", "pusher"), 1)
        checks.integer(f"{where}.team", options.get("team", 0), lo=0, hi=1, error=ConfigError)
        checks.integer(f"{where}.control", options.get("control", 1), lo=1, hi=n, error=ConfigError)
        checks.integer(f"{where}.decision_ticks", options.get("decision_ticks", 4), lo=1, hi=100, error=ConfigError)
        if options.get("max_ticks") is not None:
            checks.integer(f"{where}.max_ticks", options["max_ticks"], lo=1, hi=100_000, error=ConfigError)
        checks.real(f"{where}.shaping", options.get("shaping", 0.2), lo=0, error=ConfigError)

    def make(self, env_id: str, options: Mapping[str, Any]):
        from .sandbox import MobaSandbox

        self.check(env_id, options)
        return MobaSandbox(env_id, options)

    def components(self) -> Mapping[str, Mapping[str, Any]]:
        renderer = MobaActionRenderer()
        return {
            "serializer": {"moba_obs->prompt_v2": MobaPrompt()},
            "action_renderer": {"action->text_v1": renderer, "moba_action->text_v1": renderer},
        }

    def summarize(self, extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Per-cell statistics of evaluated episodes (win rate, gold and XP lead, kills); see `evaluation`."""
        from .evaluation import summarize

        return summarize(extras)
