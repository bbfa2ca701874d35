"""The `agentguard` command as a user runs it, in a subprocess: the demo end to end, ls, sweep and resolve, their
store options, help, version, exit statuses and errors."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentguard import Guard, __version__

from cli_runs import record, run
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
    asyncio.run(Guard(store_url).ensure_schema())  # an empty store
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


# -- the command line behaves like the tools people know ---------------------------------------------------

COMMANDS = ("demo", "ls", "show", "timeline", "forget", "stats", "verify", "resolve", "sweep", "doctor", "console",
            "mcp-proxy")
# Tests that never open the suite's store run once, in the SQLite pass.


@pytest.mark.storeless
def test_no_command_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    # 2, argparse's status for every other usage error: nothing was done, so a script that forgot the
    # command must not read success.
    out = run(cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("usage: agentguard") and "commands:" in out.stderr
    assert all(c in out.stderr for c in COMMANDS)
    only_options = run("--url", "sqlite+aiosqlite:///x.db", cwd=tmp_path)
    assert only_options.returncode == 2 and "error:" in only_options.stderr
    assert run("--", cwd=tmp_path).returncode == 2


@pytest.mark.storeless
def test_version(tmp_path: Path) -> None:
    out = run("--version", cwd=tmp_path)
    assert out.returncode == 0
    assert out.stdout == f"agentguard {__version__}\n"
    # one version, from __init__, under the distribution's own name (the import package is agentguard)
    assert importlib.metadata.version("agentguard-idempotency") == __version__


def help_entries(text: str) -> dict[str, str]:
    """Each option or positional of an argparse help text -> its help (empty if it has none)."""
    entries: dict[str, str] = {}
    section = False
    name = ""
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = line in ("options:", "positional arguments:", "commands:")
            continue
        if not section or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 2:  # an entry: its invocation, then (after 2+ spaces) its help, or help on the next lines
            invocation, _, help_text = line.strip().partition("  ")
            name = invocation
            entries[name] = help_text.strip()
        elif name:
            entries[name] = (entries[name] + " " + line.strip()).strip()
    return entries


@pytest.mark.storeless
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_option_has_help(tmp_path: Path, command: str) -> None:
    out = run(*([command] if command else []), "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    entries = help_entries(out.stdout)
    assert "-h, --help" in entries and len(entries) >= 2
    assert [n for n, h in entries.items() if not h] == [], out.stdout


def test_a_reader_that_goes_away_ends_the_command_quietly(store_url: str, tmp_path: Path) -> None:
    record(store_url, n=30)
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the first byte: every write fails, deterministically
    try:
        out = run("ls", "--url", store_url, cwd=tmp_path, stdout=write_end)
    finally:
        os.close(write_end)
    assert out.returncode == 141 and out.stderr == ""  # 128 + SIGPIPE, as `ls` or `git log` end
    # and as a user types it: whether head closes the pipe before or after the writes, nothing on stderr
    shell = subprocess.run(["bash", "-c", f"{sys.executable} -m agentguard.cli ls --url '{store_url}' | head -1"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and shell.stderr == "" and shell.stdout.startswith("scope")


@pytest.mark.storeless
@pytest.mark.parametrize("args", [("ls",), ("ls", "--unknown"), ("ls", "--json"), ("sweep",),
                                  ("resolve", "ag_x", "--retry"), ("ls", "--state", "running"), ("show", "ag_x"),
                                  ("timeline", "t-1"), ("forget", "ag_x", "--yes"), ("stats", "--since", "1h"),
                                  ("verify",)])
def test_commands_that_read_or_settle_never_create_a_store(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = run(*args, cwd=tmp_path)  # the default store, agentguard.db here
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith(f"agentguard: no store at {tmp_path / 'agentguard.db'}"), out.stderr
    nested = run(*args, "--url", "sqlite+aiosqlite:///deep/er/claims.db", cwd=tmp_path)
    assert nested.returncode == 1 and f"no store at {tmp_path / 'deep' / 'er' / 'claims.db'}" in nested.stderr
    memory = run(*args, "--url", "sqlite+aiosqlite://", cwd=tmp_path)
    assert memory.returncode == 1 and "in-memory store" in memory.stderr, memory.stderr
    assert list(tmp_path.iterdir()) == []  # no file, no folder
    assert "Traceback" not in out.stderr + nested.stderr + memory.stderr


@pytest.mark.skipif(BACKEND != "sqlite", reason="a relative SQLite path in the config")
def test_config_names_the_store_as_the_proxy_reads_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "agentguard.toml").write_text(
        '[store]\nurl = "sqlite+aiosqlite:///.agentguard/claims.db"\nscope = "acct_42"\n\n'
        '[upstream]\ncommand = ["python", "-m", "agentguard.servers.payments_demo"]\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = run("ls", "--config", "../project/agentguard.toml", cwd=elsewhere)
    assert missing.returncode == 1, missing.stderr
    assert f"no store at {project / '.agentguard' / 'claims.db'} (the store of {project / 'agentguard.toml'})" in (
        missing.stderr)
    url = f"sqlite+aiosqlite:///{project / '.agentguard' / 'claims.db'}"
    record(url, scope="acct_42", task_id="ticket-1", n=2)
    record(url, scope="other", task_id="ticket-2")
    listed = run("ls", "--config", "../project/agentguard.toml", "--json", cwd=elsewhere)  # the config's scope
    assert listed.returncode == 0, listed.stderr
    assert {(r["scope"], r["task_id"]) for r in json.loads(listed.stdout)["records"]} == {("acct_42", "ticket-1")}
    other = run("ls", "--config", str(project / "agentguard.toml"), "--scope", "other", "--json", cwd=elsewhere)
    assert [r["task_id"] for r in json.loads(other.stdout)["records"]] == ["ticket-2"]
    swept = run("sweep", "--config", str(project / "agentguard.toml"), cwd=elsewhere)
    assert swept.returncode == 0 and swept.stdout == "deleted 0 expired records\n"
    resolved = run("resolve", "ag_nope", "--abandon", "--config", str(project / "agentguard.toml"), cwd=elsewhere)
    assert resolved.returncode == 1 and "in scope 'acct_42'" in resolved.stderr, resolved.stderr
    both = run("ls", "--config", "x.toml", "--url", url, cwd=elsewhere)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == []


@pytest.mark.storeless
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "no config file at"),
        ("[store\n", "is not valid TOML"),
        ('store = "x"\n', "[store] must be a table"),
        ("[store]\nurl = 5\n", "[store] url must be a non-empty string"),
        ('[store]\nscope = ""\n', "[store] scope must be a non-empty string"),
    ],
)
def test_a_bad_config_is_named(tmp_path: Path, text: str | None, problem: str) -> None:
    if text is not None:
        (tmp_path / "agentguard.toml").write_text(text)
    out = run("ls", "--config", "agentguard.toml", cwd=tmp_path)
    assert out.returncode == 1 and problem in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.storeless
def test_config_without_a_store_url_uses_the_environment_then_the_default(tmp_path: Path) -> None:
    (tmp_path / "agentguard.toml").write_text('[upstream]\ncommand = ["x"]\n')
    out = run("ls", "--config", "agentguard.toml", cwd=tmp_path)
    assert f"no store at {tmp_path / 'agentguard.db'}" in out.stderr
    env = run("ls", "--config", "agentguard.toml", cwd=tmp_path,
              env={"AGENTGUARD_URL": "sqlite+aiosqlite:///from-env.db"})
    assert f"no store at {tmp_path / 'from-env.db'}" in env.stderr


def test_ls_json_is_one_document_with_stable_fields(store_url: str, tmp_path: Path) -> None:
    empty = run("ls", "--json", "--url", store_url, cwd=tmp_path) if BACKEND == "postgres" else None
    record(store_url, task_id="ticket-9", n=2)
    out = run("ls", "--json", "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert list(doc) == ["records"] and len(doc["records"]) == 2
    for r in doc["records"]:
        assert list(r) == ["scope", "task_id", "operation", "state", "attempts", "age_seconds",
                           "lease_left_seconds", "key", "audit"]
        assert (r["scope"], r["task_id"], r["state"], r["attempts"]) == ("default", "ticket-9", "succeeded", 1)
        assert r["operation"].startswith("step[") and r["key"].startswith("ag_") and r["audit"] is None
    unknown = run("ls", "--json", "--unknown", "--url", store_url, cwd=tmp_path)
    assert json.loads(unknown.stdout) == {"unknown": []}
    if empty is not None:
        assert json.loads(empty.stdout) == {"records": []}


@pytest.mark.storeless
def test_cli_errors_never_say_a_tool_was_not_run(tmp_path: Path) -> None:
    for args in (("ls",), ("sweep",), ("resolve", "ag_x", "--retry")):
        out = run(*args, "--url", "postgresql+asyncpg://u@127.0.0.1:1/db", cwd=tmp_path)
        assert out.returncode == 1 and "the store failed" in out.stderr, out.stderr
        assert "not run" not in out.stderr and "tool" not in out.stderr, out.stderr


BLOCK = (  # the import of these top-level modules fails, as if their extra were not installed
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None\n"
    "del sys.argv[1]\n"
    "from agentguard.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.storeless
def test_a_postgres_url_without_asyncpg_names_the_extra(tmp_path: Path) -> None:
    for args in (("ls",), ("sweep",), ("demo",)):
        out = run("asyncpg", *args, "--url", "postgresql+asyncpg://u@127.0.0.1:1/db", cwd=tmp_path, code=BLOCK)
        assert out.returncode == 1, out.stderr
        assert out.stderr == (
            "agentguard: a postgresql+asyncpg:// store needs the postgres extra (no module named 'asyncpg' is "
            "installed): pip install 'agentguard-idempotency[postgres]'\n"
        )


@pytest.mark.storeless
def test_mcp_proxy_without_the_mcp_extra_names_it(tmp_path: Path) -> None:
    (tmp_path / "agentguard.toml").write_text('[upstream]\ncommand = ["x"]\n')
    for blocked in ("mcp", "mcp_types"):
        out = run(blocked, "mcp-proxy", "--config", "agentguard.toml", cwd=tmp_path, code=BLOCK)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr == (f"agentguard: agentguard mcp-proxy needs the mcp extra (no module named {blocked!r} "
                              "is installed): pip install 'agentguard-idempotency[mcp]'\n")


@pytest.mark.storeless
def test_migrate_on_sqlite_makes_the_store_and_its_sql_makes_the_same(tmp_path: Path) -> None:
    import sqlite3

    def schema(path: Path) -> list[tuple[str, str]]:
        db = sqlite3.connect(path)
        try:
            return sorted(db.execute("SELECT name, sql FROM sqlite_master WHERE name LIKE 'agentguard%'"))
        finally:
            db.close()

    made = agentguard("migrate", "--url", f"sqlite+aiosqlite:///{tmp_path / 'made.db'}", cwd=tmp_path)
    assert made.returncode == 0 and "the store's tables are ready" in made.stdout, made.stderr
    printed = agentguard("migrate", "--sql", "--url", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", cwd=tmp_path)
    assert printed.returncode == 0 and printed.stdout.startswith("BEGIN;\n"), printed.stderr
    assert not (tmp_path / "x.db").exists()  # (printed, not run)
    db = sqlite3.connect(tmp_path / "run.db")
    db.executescript(printed.stdout)
    db.close()
    assert schema(tmp_path / "run.db") == schema(tmp_path / "made.db") != []
    # (in SQLite, normalised: IF NOT EXISTS is not kept in sqlite_master)
    refused = agentguard("migrate", "--sql", "--grant", "worker", "--url", "sqlite+aiosqlite:///x.db", cwd=tmp_path)
    assert refused.returncode == 1 and "--grant is for a Postgres store" in refused.stderr
