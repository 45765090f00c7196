"""Sum a test run's ECHO2_TEST_TIMES file (tests/conftest.py): seconds per test process and per test file, the
slowest first.

    ECHO2_TEST_TIMES=/tmp/times.tsv .venv/bin/python -m pytest -q && .venv/bin/python scripts/test_times.py /tmp/times.tsv
"""

from __future__ import annotations

import collections
import sys


def main(path: str, top: int = 25) -> None:
    per_worker: collections.Counter[str] = collections.Counter()
    per_file: collections.Counter[str] = collections.Counter()
    owner: dict[str, str] = {}
    with open(path) as fh:
        rows = [line.rstrip("\n").split("\t", 3) for line in fh]
    if any(w != "main" for w, *_ in rows):  # under xdist the controller logs every report again as "main"
        rows = [r for r in rows if r[0] != "main"]
    for worker, _, seconds, nodeid in rows:
        per_worker[worker] += float(seconds)
        name = nodeid.split("::")[0]
        per_file[name] += float(seconds)
        owner[name] = worker
    for worker, total in sorted(per_worker.items()):
        print(f"{worker}: {total:8.1f} s")
    for name, total in per_file.most_common(top):
        print(f"{total:8.1f} s  {owner[name]}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
