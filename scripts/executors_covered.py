"""Fails if an executor of the store's statements is covered less than the general path it stands beside.

A fast path is an executor of the same statements as the general one (docs/architecture.md): the suite must
drive it at least as thoroughly. Reads the coverage data of both pytest passes (``scripts/test.sh``) and
compares each executor's line coverage with its general path's.

    python scripts/executors_covered.py COVERAGE_DATA_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import coverage

GENERAL = "agentguard/stores/_executor.py"
# Each executor of the store's statements (a module of agentguard/stores/), beside the general path above.
EXECUTORS = ("agentguard/stores/_direct.py", "agentguard/stores/_direct_pg.py", "agentguard/stores/_lane.py")


def covered(data: coverage.Coverage, path: str) -> float:
    """The share of ``path``'s statements the suite ran (0..100)."""
    _, statements, _, missing, _ = data.analysis2(str(Path(path).resolve()))
    return 100.0 * (len(statements) - len(missing)) / len(statements) if statements else 100.0


def main() -> int:
    data = coverage.Coverage(data_file=sys.argv[1])
    data.load()
    general = covered(data, GENERAL)
    print(f"   {GENERAL}: {general:.1f}% of its lines (the general path)")
    behind = []
    for path in EXECUTORS:
        share = covered(data, path)
        print(f"   {path}: {share:.1f}%")
        if share < general:
            behind.append(f"{path} ({share:.1f}%)")
    if behind:
        print(f"== executors covered less than the general path ({general:.1f}%): {', '.join(behind)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
