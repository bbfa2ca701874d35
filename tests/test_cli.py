"""The `agentguard` command: the demo end to end, ls and sweep, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND

pytestmark = pytest.mark.slow


def agentguard(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("AGENTGUARD_URL", None)
    if url:
        env["AGENTGUARD_URL"] = url
    return subprocess.run([sys.executable, "-m", "agentguard.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(BACKEND != "sqlite", reason="the demo runs on the embedded SQLite default")
def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    for _ in range(2):  # re-runnable: each run is its own task
        out = agentguard("demo", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "OK: 3 charges for 3 orders" in out.stdout
        assert "worker exited with signal 9" in out.stdout and "refused, nothing executed" in out.stdout
    assert (tmp_path / "agentguard.db").exists()
    listed = agentguard("ls", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.count("succeeded") == 6


def test_ls_and_sweep(store_url: str, tmp_path: Path) -> None:
    assert "no records" in agentguard("ls", cwd=tmp_path, url=store_url).stdout
    swept = agentguard("sweep", "--batch", "10", cwd=tmp_path, url=store_url)
    assert swept.returncode == 0 and "deleted 0 expired records" in swept.stdout


def test_bad_url_is_a_clear_error(tmp_path: Path) -> None:
    out = agentguard("ls", cwd=tmp_path, url="mysql://nope/db")
    assert out.returncode == 1 and "unsupported store URL" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "url",
    [
        "mysql://u:hunter2-secret@h/db",  # unsupported
        "postgresql+psycopg://u:hunter2-secret@h/db",  # the wrong driver
        "postgresql+asyncpg://u:hunter2-secret@127.0.0.1:1/db",  # nothing listens there
        "postgresql+asyncpg://u@127.0.0.1:1/db?password=hunter2-secret",
        "::u:hunter2-secret@@::",  # not a URL at all
    ],
)
def test_a_store_urls_password_is_never_printed(tmp_path: Path, url: str) -> None:
    for args in (("ls", "--url", url), ("sweep", "--url", url)):
        out = agentguard(*args, cwd=tmp_path)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert "hunter2" not in out.stdout + out.stderr, out.stderr
        if "mysql" in url or "psycopg" in url:
            assert "u:***@h/db" in out.stderr, out.stderr  # the URL is echoed, redacted


def test_redaction() -> None:
    from agentguard._redact import redact_text, redact_url

    assert redact_url("postgresql+asyncpg://u:p%40ss@h:5432/db") == "postgresql+asyncpg://u:***@h:5432/db"
    assert redact_url("postgresql+asyncpg://u@h/db?sslmode=require&password=x") == (
        "postgresql+asyncpg://u@h/db?password=***&sslmode=require"  # (SQLAlchemy sorts the query)
    )
    assert redact_url("sqlite+aiosqlite:///a/b.db") == "sqlite+aiosqlite:///a/b.db"
    assert redact_url("postgresql+asyncpg://u:p@ss@host/db") == "postgresql+asyncpg://u:***@host/db"  # a raw "@"
    assert redact_text("failed for mysql://root:pw@db:3306/x; retry") == "failed for mysql://root:***@db:3306/x; retry"
