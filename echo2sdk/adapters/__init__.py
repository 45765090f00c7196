"""The data plane: task-adapter contracts, SandboxAdapter and its named components, env plug-ins.

    from echo2sdk.adapters import SandboxAdapter
    adapter = SandboxAdapter(env="poker://nlhe_headsup_v1")

Importing this package is cheap: env plug-ins (and gymnasium, pettingzoo, rlcard) load when an adapter
is built for their scheme.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echo2sdk.adapters.components import AnswerTagRenderer, GRPOMetadata, TextSerializer, episodic_return, per_step_mean
    from echo2sdk.adapters.contracts import (
        ActionRenderer,
        Episode,
        EpisodicTaskAdapter,
        MetadataSpec,
        Observation,
        ParsedAction,
        RewardSpec,
        Sandbox,
        SandboxPlugin,
        Serializer,
        StepResult,
        TaskAdapter,
        Transition,
    )
    from echo2sdk.adapters.registry import load_env_plugin, parse_env, resolve_component
    from echo2sdk.adapters.sandbox import AdapterStream, SandboxAdapter, read_episode_log, write_episode_log

_LAZY = {
    **dict.fromkeys(
        ["AnswerTagRenderer", "GRPOMetadata", "TextSerializer", "episodic_return", "per_step_mean"],
        "echo2sdk.adapters.components",
    ),
    **dict.fromkeys(
        [
            "ActionRenderer",
            "Episode",
            "EpisodicTaskAdapter",
            "MetadataSpec",
            "Observation",
            "ParsedAction",
            "RewardSpec",
            "Sandbox",
            "SandboxPlugin",
            "Serializer",
            "StepResult",
            "TaskAdapter",
            "Transition",
        ],
        "echo2sdk.adapters.contracts",
    ),
    **dict.fromkeys(["load_env_plugin", "parse_env", "resolve_component"], "echo2sdk.adapters.registry"),
    **dict.fromkeys(
        ["AdapterStream", "SandboxAdapter", "read_episode_log", "write_episode_log"], "echo2sdk.adapters.sandbox"
    ),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'echo2sdk.adapters' has no attribute {name!r}")
