"""What the test upstreams did, as the tests count it: a JSON-lines log each upstream appends to (one line per
side effect, subscription or request seen), and the payments demo's SQLite ledger."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


def record(log: Path, event: dict[str, Any]) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def events(log: Path, kind: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    return [e for e in lines if e["event"] == kind]


def charges(ledger: Path) -> list[tuple[str]]:
    """The charge ids in the payments demo's ledger (none while it is still being created)."""
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as conn:
        try:
            return conn.execute("SELECT id FROM charges ORDER BY created").fetchall()
        except sqlite3.OperationalError:  # the demo is still creating its tables
            return []
