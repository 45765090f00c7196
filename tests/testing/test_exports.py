"""echo2sdk.testing's public surface: one sorted `__all__`, each name importable from the package and owned by one
module, the registered `mock` backend and `toy` adapter, and an import that loads no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from importlib.metadata import entry_points

import echo2sdk.testing

MODULES = ("mock", "toy", "adapter_check", "backend_check")


def test_all_is_the_sorted_list_of_public_names():
    public = [
        name for name, value in vars(echo2sdk.testing).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]
    assert echo2sdk.testing.__all__ == sorted(public)
    assert len(set(echo2sdk.testing.__all__)) == len(echo2sdk.testing.__all__)


def test_each_name_comes_from_the_module_that_owns_it():
    owned: dict[str, str] = {}
    for module_name in MODULES:
        module = importlib.import_module(f"echo2sdk.testing.{module_name}")
        for name in module.__all__:
            assert name not in owned, f"{name} is exported by {owned[name]} and {module_name}"
            owned[name] = module_name
            assert getattr(echo2sdk.testing, name) is getattr(module, name), name
            if isinstance(getattr(module, name), (type, types.FunctionType)):
                assert getattr(module, name).__module__ == module.__name__, name
    assert sorted(owned) == echo2sdk.testing.__all__


def test_every_name_imports_as_before():
    for name in echo2sdk.testing.__all__:
        namespace: dict = {}
        exec(f"from echo2sdk.testing import {name}", namespace)
        assert namespace[name] is getattr(echo2sdk.testing, name)


def test_the_registered_mock_backend_and_toy_adapter_are_these():
    backend = entry_points(group="echo2sdk.backends")["mock"]
    adapter = entry_points(group="echo2sdk.adapters")["toy"]
    assert (backend.value, adapter.value) == ("echo2sdk.testing:MockBackend", "echo2sdk.testing:ToyAdapter")
    assert backend.load() is echo2sdk.testing.MockBackend
    assert adapter.load() is echo2sdk.testing.ToyAdapter


def test_import_loads_no_torch_and_the_command_line_names_both_suites():
    code = "import echo2sdk.testing, sys; print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    usage = subprocess.run([sys.executable, "-m", "echo2sdk.testing", "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "python -m echo2sdk.testing" in usage.stdout
    assert "check-backend" in usage.stdout and "check-adapter" in usage.stdout
