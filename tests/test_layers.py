"""The import contract: no layer imports a layer above it (docs/architecture.md, "Layers").

Every import statement of every module counts, including imports inside functions and under
TYPE_CHECKING, relative imports and ``importlib.import_module("...")`` with a literal name.

    core      pure mechanisms            may import: core, errors
    sim       the simulator              + nothing from runtime, adapters, backends, config, plan, api, cli
    adapters  data plane                 + nothing from runtime, sim, config, plan, api, cli
    backends  inference engines          + nothing from runtime, sim, adapters, config, plan, api, cli
    runtime   processes and sockets      + nothing from api, cli
      runtime.protocol  frames, messages  + nothing from runtime's roles (learner, worker, broadcast, coordinator,
                                            providers, sinks) nor trust
      runtime.trust     handshake, TLS... + nothing from runtime's roles
    config    the run's settings         + nothing from runtime, plan, api, cli
    plugins, weights (beside adapters/backends)  + nothing from the layers above them
core also imports none of socket, ssl, asyncio, selectors, subprocess, multiprocessing. A module follows the
rule of the longest layer name it falls under.

And no import cycle anywhere in the package: every import counts as an edge (lazy ones too), so a cycle is
reported even where a function-level import keeps it from failing at run time today.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import echo2sdk
from _ast_parse import parse

PACKAGE = Path(echo2sdk.__file__).parent

_TOP = ("runtime", "sim", "adapters", "backends", "config", "plan", "api", "cli")
#: runtime's roles (runtime/__init__.py): protocol/ and trust/ sit below them
_ROLES = tuple(f"echo2sdk.runtime.{r}" for r in ("learner", "worker", "broadcast", "coordinator", "providers", "sinks"))
#: layer -> (allowed prefixes, or None for "anything not forbidden"; forbidden prefixes)
RULES: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "echo2sdk.core": (("echo2sdk.core", "echo2sdk.errors"), ()),
    "echo2sdk.sim": (None, tuple(f"echo2sdk.{m}" for m in _TOP if m != "sim")),
    "echo2sdk.adapters": (None, tuple(f"echo2sdk.{m}" for m in _TOP if m != "adapters" and m != "backends")),
    "echo2sdk.backends": (None, tuple(f"echo2sdk.{m}" for m in _TOP if m != "backends")),
    "echo2sdk.runtime": (None, ("echo2sdk.api", "echo2sdk.cli")),
    "echo2sdk.runtime.protocol": (None, ("echo2sdk.api", "echo2sdk.cli", *_ROLES, "echo2sdk.runtime.trust")),
    "echo2sdk.runtime.trust": (None, ("echo2sdk.api", "echo2sdk.cli", *_ROLES)),
    "echo2sdk.config": (None, ("echo2sdk.runtime", "echo2sdk.plan", "echo2sdk.api", "echo2sdk.cli")),
    "echo2sdk.plugins": (None, tuple(f"echo2sdk.{m}" for m in _TOP)),
    "echo2sdk.weights": (None, tuple(f"echo2sdk.{m}" for m in _TOP)),
}
#: What makes code impure (sockets, processes, event loops): core imports none of these.
CORE_FORBIDDEN_STDLIB = ("socket", "ssl", "asyncio", "selectors", "subprocess", "multiprocessing")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in `source` of module `module`."""
    out: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from echo2sdk import runtime` imports echo2sdk.runtime; `from x import name` imports x
            out += [(node.lineno, f"{base}.{a.name}" if base in ("echo2sdk", "echo2sdk.core") else base)
                    for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                 or isinstance(node.func, ast.Name) and node.func.id == "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path = PACKAGE) -> list[str]:
    """Every import that breaks RULES, as 'path:line: module imports name (layer rule)'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        layer = max((lay for lay in RULES if _matches(module, lay)), key=len, default=None)
        if layer is None:
            continue
        allowed, forbidden = RULES[layer]
        for line, name in imported_names(path.read_text(), module, path.name == "__init__.py"):
            if layer == "echo2sdk.core" and any(_matches(name, m) for m in CORE_FORBIDDEN_STDLIB):
                found.append(f"{path.relative_to(root.parent)}:{line}: {module} imports {name} (core opens no sockets, "
                             "processes or event loops)")
                continue
            if not _matches(name, "echo2sdk"):
                continue  # third-party and standard library: not a layer question
            if allowed is not None and not any(_matches(name, a) for a in allowed):
                found.append(f"{path.relative_to(root.parent)}:{line}: {module} imports {name} ({layer} may import only {', '.join(allowed)})")
            elif any(_matches(name, f) for f in forbidden):
                found.append(f"{path.relative_to(root.parent)}:{line}: {module} imports {name} ({layer} must not import it)")
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports (a name resolved to the longest module it names)."""
    paths = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        graph[module] = set()
        for _, name in imported_names(path.read_text(), module, path.name == "__init__.py"):
            parts = name.split(".")
            while parts and ".".join(parts) not in paths:
                parts.pop()
            if parts and ".".join(parts) != module:
                graph[module].add(".".join(parts))
    return graph


def cycles(root: Path = PACKAGE) -> list[list[str]]:
    """Every import cycle, as one cycle through each strongly connected set of modules (Tarjan), sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(_one_cycle(graph, members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _one_cycle(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A shortest cycle through the first member, staying inside `members` (breadth first): [a, b, ..., a]."""
    start = min(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(members)


def test_no_layer_imports_upward():
    assert violations() == []


def test_no_import_cycle():
    found = cycles()
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "echo2sdk"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_contract_catches_upward_imports(tmp_path):
    """The checker itself: each kind of upward import in a throw-away tree is reported."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/ok.py": "import math\nfrom echo2sdk.errors import ConfigError\nfrom . import records\n",
        "core/top.py": "from echo2sdk.runtime.learner.recipe import Trainer\n",
        "core/lazy.py": "def f():\n    from echo2sdk.config import Config\n",
        "core/relative.py": "from ..backends import hf\n",
        "core/dynamic.py": "import importlib\nimportlib.import_module('echo2sdk.cli')\n",
        "core/dynamic2.py": "from importlib import import_module\nimport_module('echo2sdk.runtime')\n",
        "core/sockets.py": "import socket\n",
        "core/package.py": "from echo2sdk import plan\n",
        "backends/hf.py": "from echo2sdk.runtime.worker import process as worker\n",
        "runtime/worker/process.py": "from echo2sdk.core import records\nfrom echo2sdk.backends import hf\n",
    })
    found = violations(root)
    flagged = sorted(line.split(":")[0] for line in found)
    assert flagged == sorted([
        "echo2sdk/core/top.py", "echo2sdk/core/lazy.py", "echo2sdk/core/relative.py",
        "echo2sdk/core/dynamic.py", "echo2sdk/core/dynamic2.py", "echo2sdk/core/sockets.py",
        "echo2sdk/core/package.py", "echo2sdk/backends/hf.py",
    ]), found
    assert any("echo2sdk.core.top imports echo2sdk.runtime.learner.recipe" in f for f in found)


def test_contract_catches_runtime_and_config_violations(tmp_path):
    """protocol/ and trust/ importing a role above them, protocol importing trust, config importing runtime."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "config.py": "from echo2sdk.runtime.trust.credentials import check_token\n",
        "runtime/__init__.py": "",
        "runtime/coordinator.py": "from echo2sdk.runtime.protocol import wire\n",  # allowed: a role uses protocol
        "runtime/protocol/__init__.py": "",
        "runtime/protocol/wire.py": "def f():\n    from echo2sdk.runtime.learner.recipe import Trainer\n",
        "runtime/protocol/messages.py": "from echo2sdk.runtime.trust import session\n",
        "runtime/trust/__init__.py": "",
        "runtime/trust/session.py": "from echo2sdk.runtime.protocol import wire\n",  # allowed: trust uses protocol
        "runtime/trust/gate.py": "from ..broadcast import relay\n",
        "runtime/trust/tls.py": "import echo2sdk.runtime.worker.process\n",
    })
    found = violations(root)
    assert sorted(line.split(":")[0] for line in found) == sorted([
        "echo2sdk/config.py", "echo2sdk/runtime/protocol/wire.py", "echo2sdk/runtime/protocol/messages.py",
        "echo2sdk/runtime/trust/gate.py", "echo2sdk/runtime/trust/tls.py",
    ]), found
    assert any("echo2sdk.runtime.protocol.wire imports echo2sdk.runtime.learner.recipe (echo2sdk.runtime.protocol "
               "must not import it)" in f for f in found), found


def test_cycle_check_catches_a_deliberate_cycle(tmp_path):
    """A cycle made only of lazy (function-level) and TYPE_CHECKING imports is still a cycle; a chain is not."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "a.py": "from echo2sdk import b\n",
        "b.py": "def f():\n    from echo2sdk.c import x\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from echo2sdk.a import y\n",
        "d.py": "from echo2sdk import a\n",
        "pkg/__init__.py": "from echo2sdk.pkg.inner import z\n",
        "pkg/inner.py": "from echo2sdk import pkg\n",
    })
    assert cycles(root) == [["echo2sdk.a", "echo2sdk.b", "echo2sdk.c", "echo2sdk.a"],
                            ["echo2sdk.pkg", "echo2sdk.pkg.inner", "echo2sdk.pkg"]]


# -- tests mirror the package --------------------------------------------------------------------------------
TESTS = Path(__file__).parent  # tests/security holds the attack suites besides: they test modules of many folders


def _package_folders(root: Path) -> list[str]:
    """Every package folder under `root` (one holding an __init__.py), relative to it."""
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def _missing_test_folders(package: Path, tests: Path) -> list[str]:
    """The package folders of `package` without a test folder of the same path under `tests` that holds a test file."""
    return [f for f in _package_folders(package) if f != "." and not any((tests / f).rglob("test_*.py"))]


def test_each_package_folder_has_its_test_folder():
    assert _missing_test_folders(PACKAGE, TESTS) == []


def test_the_mirror_check_names_a_folder_without_tests(tmp_path):
    for folder in ("pkg/a", "pkg/a/b", "pkg/c"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "tests" / "a" / "b").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "b" / "test_x.py").write_text("")
    assert _missing_test_folders(tmp_path / "pkg", tmp_path / "tests") == ["c"]
