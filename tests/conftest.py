"""Imported first by pytest for every test run.

hypothesis is imported here, at start-up, because its pytest plug-in otherwise imports it lazily at the end
of a run that used no hypothesis test, through pytest's assertion rewriter; on CPython 3.11.7 that late
`ast.parse` can fail with "SystemError: AST constructor recursion depth mismatch" (the AST converter's depth
count is interpreter-wide, so an ast.parse in another thread at the same moment corrupts it: CPython gh-106905;
tests/_ast_parse.py retries for the same reason), turning a green run into exit 1."""

import os
from pathlib import Path

import hypothesis  # noqa: F401
import pytest

# No test sends traffic off loopback. A storage client asks the cloud's instance-metadata service (169.254.169.254,
# metadata.google.internal) for credentials only when its operator allows it (runtime/broadcast/store.py, tested in
# tests/security/test_store_settings.py); should one ever ask anyway, it asks a closed port on loopback instead.
for _var, _where in {"AWS_METADATA_ENDPOINT": "http://127.0.0.1:9", "GCE_METADATA_HOST": "127.0.0.1:9",
                     "GCE_METADATA_ROOT": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}.items():
    os.environ.setdefault(_var, _where)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The default run is two test processes (pyproject: -n 2) on a 2-core machine: one OpenMP/torch thread each, set
    # before torch is imported and inherited by the processes a test starts, so that neither spins at a barrier
    # while the other holds the core. A test that needs more threads asks for them (learner.threads, --threads).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a `slow` test first, each file's tests kept together and in order. xdist's loadscope hands
    whole files to the two test processes in this order: they start on the long files and end on short ones,
    rather than one process finishing alone on a minute-long run."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ECHO2_TEST_TIMES=FILE, one line per test phase: test process, phase, seconds, test id (the data behind
    the suite's balance between its two processes; scripts/test_times.py sums it)."""
    path = os.environ.get("ECHO2_TEST_TIMES")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t{report.when}\t{report.duration:.3f}\t"
                     f"{report.nodeid}\n")


@pytest.fixture
def example_diff():
    """diff(name): the keys of the lines where examples/<name>.toml differs from examples/math_smollm2.toml,
    comment lines left out (the examples switch the task in their [task] lines; math also tunes its recipe)."""

    def settings(stem: str) -> list[str]:
        lines = (Path(__file__).resolve().parents[1] / "examples" / f"{stem}.toml").read_text().splitlines()
        return [line for line in lines if not line.lstrip().startswith("#")]

    def diff(name: str) -> list[str]:
        pairs = zip(settings("math_smollm2"), settings(name), strict=True)
        return [b.split("=")[0].strip() for a, b in pairs if a != b]

    return diff
