"""The README's python examples type-check as written, under the project's ``mypy --strict``: each block is
checked on its own, after a prelude that gives it what the README leaves to the reader (your provider, your
models and tables, and what the README's earlier blocks defined: ``guard``, ``task``, ``Operation``).

Above all, calls of a tool with an injected parameter omit it — ``charge("o-1", 4900)``, ``book_ride("r-1",
2500)`` — and a type checker reads the function's own signature: the README's defaults (``idempotency_key: str
= ""``, ``op: Operation = INJECTED``) are what make those calls type-check. The PyPI page (docs/pypi.md) shares
the README's example (tests/project/test_package.py keeps them equal).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.storeless  # nothing runs: mypy reads the code

BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# What the README's reader brings: their provider, models and tables, and the earlier blocks' names.
PRELUDE = '''\
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Column, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncConnection

from agentguard import INJECTED, Guard, InProgressError, Operation, task


class Charge(BaseModel):
    id: str


class Receipt(BaseModel):
    ride_id: str
    charge_id: str


class Provider:
    async def charge(self, order_id: str, amount_cents: int, idempotency_key: str) -> Charge:
        return Charge(id="ch_1")


provider = Provider()
url = "sqlite+aiosqlite:///app.db"
guard = Guard(url)
metadata = MetaData()
rides = Table("rides", metadata, Column("id", String, primary_key=True), Column("amount_cents", String))
payments = Table("payments", metadata, Column("event_id", String), Column("charge_id", String, unique=True))


async def stripe_charge(amount_cents: int, *, idempotency_key: str) -> dict[str, str]:
    return {"id": "ch_1"}


async def send_email(ride_id: str, charge_id: str) -> None: ...


'''
# The framework block (pydantic-ai's agent) needs that framework's names too.
PYDANTIC_AI = '''\
from dataclasses import dataclass

from pydantic_ai import Agent, RunContext

from agentguard.integrations.pydantic_ai import once


@dataclass
class Deps:
    task_id: str


agent = Agent("test", deps_type=Deps)


'''


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def test_the_readmes_python_blocks_pass_mypy_strict_as_written(tmp_path: Path) -> None:
    found = blocks(ROOT / "README.md")
    assert len(found) >= 4, "the README's python blocks were not found"
    assert any("op: Operation = INJECTED" in b and 'book_ride("r-1", 2500)' in b for b in found)
    files = []
    for i, block in enumerate(found):
        prelude = PRELUDE + (PYDANTIC_AI if "RunContext" in block else "")
        files.append(tmp_path / f"readme_block_{i}.py")
        files[-1].write_text(prelude + block, encoding="utf-8")
    # the project's configuration (strict), its cache, and this checkout's agentguard (the working directory)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--no-error-summary", *map(str, files)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_pypi_pages_example_is_the_readmes() -> None:
    readme = blocks(ROOT / "README.md")
    assert blocks(ROOT / "docs" / "pypi.md") == readme[:1]


def test_an_operation_parameter_without_injected_is_what_mypy_refuses(tmp_path: Path) -> None:
    """The check has teeth: the same tool without the default fails at its call site, as the README's did."""
    block = next(b for b in blocks(ROOT / "README.md") if "book_ride" in b)
    (tmp_path / "without_default.py").write_text(PRELUDE + block.replace("op: Operation = INJECTED", "op: Operation"),
                                                 encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          str(tmp_path / "without_default.py")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and 'Missing positional argument "op" in call to "book_ride"' in out.stdout, out.stdout
