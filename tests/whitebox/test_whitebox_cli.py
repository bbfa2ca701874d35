"""The `agentguard` command's helpers, from inside: the redaction of store URLs and the resolve command a hint
names (the command as a user runs it: ``tests/core/test_cli.py``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cli_runs import record, run

pytestmark = pytest.mark.slow


def test_whitebox_redaction() -> None:
    from agentguard._redact import redact_text, redact_url

    assert redact_url("postgresql+asyncpg://u:p%40ss@h:5432/db") == "postgresql+asyncpg://u:***@h:5432/db"
    assert redact_url("postgresql+asyncpg://u@h/db?sslmode=require&password=x") == (
        "postgresql+asyncpg://u@h/db?password=***&sslmode=require"  # (SQLAlchemy sorts the query)
    )
    assert redact_url("sqlite+aiosqlite:///a/b.db") == "sqlite+aiosqlite:///a/b.db"
    assert redact_url("postgresql+asyncpg://u:p@ss@host/db") == "postgresql+asyncpg://u:***@host/db"  # a raw "@"
    assert redact_text("failed for mysql://root:pw@db:3306/x; retry") == "failed for mysql://root:***@db:3306/x; retry"


def test_whitebox_the_resolve_command_a_hint_names_points_at_the_same_store(store_url: str, tmp_path: Path) -> None:
    from agentguard._storeconfig import resolve_command

    record(store_url, scope="acct 42")
    cmd = resolve_command(store_url, "ag_abc", "acct 42")
    assert cmd.endswith(" --result JSON | --retry | --abandon") and "hunter2" not in cmd
    argv = shlex.split(cmd.removesuffix(" --result JSON | --retry | --abandon"))
    assert argv[:2] == ["agentguard", "resolve"]
    out = run(*argv[1:], "--retry", cwd=tmp_path)  # another folder: the URL is absolute
    assert out.returncode == 1 and out.stderr == (
        "agentguard: no operation 'ag_abc' in scope 'acct 42' is held on an unknown outcome\n"), out.stderr


@pytest.mark.storeless
def test_whitebox_resolve_command_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentguard._storeconfig import resolve_command

    monkeypatch.chdir(tmp_path)
    assert resolve_command("sqlite+aiosqlite:///agentguard.db", "ag_1", "default") == (
        f"agentguard resolve ag_1 --scope default --url sqlite+aiosqlite:///{tmp_path / 'agentguard.db'} "
        "--result JSON | --retry | --abandon")
    assert " --url 'postgresql+asyncpg://u:***@h/db' " in resolve_command(
        "postgresql+asyncpg://u:hunter2@h/db", "ag_1", "default")
    assert resolve_command("x", "ag_1", "s", config="agentguard.toml") == (
        f"agentguard resolve ag_1 --scope s --config {tmp_path / 'agentguard.toml'} "
        "--result JSON | --retry | --abandon")
