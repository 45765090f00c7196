"""echo2sdk: cost-efficient RL post-training of LLMs with a centralized learner and distributed rollouts.

`import echo2sdk` is cheap: torch, transformers and engines load only when a learner or worker starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from echo2sdk.errors import (
    AdapterError,
    AuthError,
    BackendError,
    CapacityError,
    ConfigError,
    DependencyNotInstalled,
    Echo2Error,
    NameNotFound,
    ProtocolError,
    TrajectoryRejected,
)

if TYPE_CHECKING:
    from echo2sdk.adapters.sandbox import SandboxAdapter
    from echo2sdk.api import Echo2
    from echo2sdk.config import Config
    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.core.contracts import InferenceBackend, SamplingParams, Sample, Score, Task, TaskAdapter
    from echo2sdk.core.records import Message, Meta, Trajectory

__version__ = "0.1.0"

from echo2sdk import errors as _errors

__all__ = [
    "Echo2",
    "SandboxAdapter",
    "Config",
    "load_config",
    "Trajectory",
    "Meta",
    "Message",
    "StalenessBuffer",
    "InferenceBackend",
    "TaskAdapter",
    "SamplingParams",
    "Sample",
    "Task",
    "Score",
    *_errors.__all__,
]

_LAZY = {
    "Echo2": "echo2sdk.api",
    "SandboxAdapter": "echo2sdk.adapters.sandbox",
    "Config": "echo2sdk.config",
    "load_config": "echo2sdk.config",
    "Trajectory": "echo2sdk.core.records",
    "Meta": "echo2sdk.core.records",
    "Message": "echo2sdk.core.records",
    "StalenessBuffer": "echo2sdk.core.buffer",
    "InferenceBackend": "echo2sdk.core.contracts",
    "TaskAdapter": "echo2sdk.core.contracts",
    "SamplingParams": "echo2sdk.core.contracts",
    "Sample": "echo2sdk.core.contracts",
    "Task": "echo2sdk.core.contracts",
    "Score": "echo2sdk.core.contracts",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'echo2sdk' has no attribute {name!r}")
