"""Print pip constraints that pin every dependency of agentguard (and of the extras named on the command
line) to the lowest version pyproject.toml allows, so a test run can prove the floors are true.

    python scripts/floors.py > floors.txt               # the core dependencies
    python scripts/floors.py postgres stripe >> ...     # and those of some extras
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def floors(extras: list[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    out = []
    for line in reqs:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(project["name"]):
            continue  # a self-reference (an extra made of extras): its parts are listed on their own
        lows = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
        if not lows:
            raise SystemExit(f"pyproject.toml: {line!r} has no floor (>=): every dependency needs one")
        out.append(f"{req.name}=={lows[0]}")
    return out


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:])))
