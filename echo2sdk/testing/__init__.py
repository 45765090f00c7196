"""Test helpers that third parties may use too.

``mock``           `MockBackend`, a torch-free InferenceBackend (the `mock` backend), and `safetensors_blob`
``toy``            `ToyAdapter`, a torch-free task (the `toy` adapter)
``adapter_check``  `check_adapter`, the task adapters' conformance suite
``backend_check``  `check_backend`, the inference backends' conformance suite (`CHECKS`, `CheckResult`, ...)
``__main__``       ``python -m echo2sdk.testing check-backend NAME`` / ``check-adapter NAME``

Every public name is importable from ``echo2sdk.testing``; importing it loads no torch.
"""

from echo2sdk.testing.adapter_check import ADAPTER_TASKS, check_adapter
from echo2sdk.testing.backend_check import CHECKS, DEFAULT_MODEL, BackendCheckError, CheckResult, check_backend
from echo2sdk.testing.mock import MockBackend, safetensors_blob
from echo2sdk.testing.toy import ToyAdapter

__all__ = [
    "ADAPTER_TASKS",
    "BackendCheckError",
    "CHECKS",
    "CheckResult",
    "DEFAULT_MODEL",
    "MockBackend",
    "ToyAdapter",
    "check_adapter",
    "check_backend",
    "safetensors_blob",
]
