"""``agentguard doctor`` against real stores, as a user runs it (a subprocess): a healthy SQLite file or Postgres
database passes every line and its live race ends with one execution, whatever the fault made of the winner's
completion; a store that fails a line (a role without the rights, a read-only database, a wrong URL, a file that
is no database, transaction pooling) exits 1 with the line saying what to change — and where the fix is SQL, running
it as printed makes the next run pass. The race deletes what it wrote and nothing else. The race's counter is
real: two workers on two different stores run the body twice, and the doctor says so."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard

from conftest import BACKEND, PG_URL, ROOT, pg_dsn, pg_execute

pytestmark = pytest.mark.slow

TABLES = ("agentguard_calls", "agentguard_steps", "agentguard_attempts")


def doctor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTGUARD_URL"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentguard", "doctor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def report(*args: str, cwd: Path) -> tuple[int, dict[str, Any]]:
    """The doctor's JSON report, and its exit status (a usage error or a traceback fails the test here)."""
    out = doctor(*args, "--json", cwd=cwd)
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def lines(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {line["check"]: line for line in doc["lines"]}


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the store's database, read with the plain driver."""
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(make_url(url).database or "")
        try:
            return [tuple(r) for r in conn.execute(sql)]
        finally:
            conn.close()
    return [tuple(r) for r in pg_execute(url, sql)]


def assert_race_ran_once(doc: dict[str, Any]) -> None:
    race = doc["race"]
    assert race["executions"] == 1, race
    assert (race["callers"], race["results"], race["errors"], race["failures"]) == (8, 8, [], []), race
    assert race["threads"] == race["coroutines"] == 4 and race["guards"] == 2
    assert race["replayed"] == 7 and race["replay_after"] is True
    # The winner's completion met the fault while the record was still running (its body had run), and landed.
    assert race["fault"]["caught"] is True and race["fault"]["state"] == "running", race
    if BACKEND == "postgres":
        assert len(race["fault"]["backends"]) == 1  # (one backend terminated mid-statement: the completion's)


def test_a_healthy_store_passes_every_line_and_its_race_runs_the_body_once(store_url: str, tmp_path: Path) -> None:
    # A new store (no file, no tables): the doctor makes what the first guard would, and passes.
    code, doc = report("--url", store_url, "--pool-size", "2", cwd=tmp_path)
    found = lines(doc)
    assert code == 0 and doc["ok"] is True, doc
    assert list(found) == ["store", "server", "pooler", "isolation", "clock offset", "privileges", "listen/notify",
                           "round trip", "connections", "live race", "scratch scope"]
    assert all(line["status"] != "FAIL" and not line["fix"] for line in doc["lines"]), doc
    for check in ("store", "server", "isolation", "privileges", "live race", "scratch scope"):
        assert found[check]["status"] == "ok", found[check]
    assert "1 execution; 8 of 8 got its result" in found["live race"]["found"]
    assert_race_ran_once(doc)
    if BACKEND == "postgres":
        assert found["pooler"]["status"] == "ok" and "none detected" in found["pooler"]["found"]
        assert found["server"]["found"].startswith("PostgreSQL ") and "read-write" in found["server"]["found"]
        assert "one worker may open up to 8 (pool_size 2: max_connections, by default 3 × pool_size + 2" in (
            found["connections"]["found"])
    else:
        assert "created it now" in found["store"]["found"] and "journal mode WAL" in found["server"]["found"]

    # A store in use: a record of a real scope, and its ledger entry, are left exactly as they were.
    async def real_call() -> None:
        async with Guard(store_url) as guard:
            await guard.run("charge", lambda key: asyncio.sleep(0, {"id": "ch_1"}), task_id="order-1",
                            scope="acct-1", arguments={"amount": 5})

    asyncio.run(real_call())
    before = [rows(store_url, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES]
    code, doc = report("--url", store_url, "--pool-size", "2", cwd=tmp_path)
    assert code == 0 and doc["ok"] is True, doc
    assert_race_ran_once(doc)
    assert [rows(store_url, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES] == before
    assert len(before[0]) == 1 and len(before[2]) == 1  # (the real record and its ledger entry, nothing else)
    scope = lines(doc)["scratch scope"]["found"].split(" in ")[1].split(" ")[0]
    assert scope.startswith("agentguard-doctor-") and "(1 record, " in lines(doc)["scratch scope"]["found"]


def test_the_race_leaves_one_execution_in_the_store_itself(store_url: str, tmp_path: Path) -> None:
    """Read back from the store, not from the doctor's own count: with --keep the race's scope stays, and holds
    one record, completed once (fence and attempts of one claim), and a ledger with one entry that ran the body."""
    code, doc = report("--url", store_url, "--pool-size", "2", "--keep", cwd=tmp_path)
    assert code == 0, doc
    assert_race_ran_once(doc)
    scope = doc["race"]["scope"]
    assert scope.startswith("agentguard-doctor-") and f"kept what the race wrote in {scope}" in (
        lines(doc)["scratch scope"]["found"])
    [(state, attempts, result)] = rows(store_url, "SELECT state, attempts, result FROM agentguard_calls "
                                                  f"WHERE scope = '{scope}'")
    assert (state, attempts) == ("succeeded", 1) and json.loads(result) == {"charged": 1, "key": doc["race"]["key"]}
    assert doc["race"]["key"]
    ledger = dict(rows(store_url, "SELECT kind, count(*) FROM agentguard_attempts "
                                  f"WHERE scope = '{scope}' GROUP BY kind"))
    assert ledger == {"ran": 1, "replayed": 8}, ledger  # (7 callers of the race, and the call after it)


def test_the_table_a_person_reads(store_url: str, tmp_path: Path) -> None:
    out = doctor("--url", store_url, "--pool-size", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout.splitlines()
    assert text[0].startswith("agentguard doctor: ") and text[2].split() == ["check", "status", "found"]
    assert any(line.startswith("live race ") and " ok " in line for line in text)
    assert text[-1] == "every line is fine"


@pytest.mark.storeless
def test_a_wrong_url_exits_1_saying_what_to_change(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "junk.db").write_bytes(b"this is not a SQLite database, whatever its name says" * 100)
    cases = [  # (URL, the failed check, what its line says, what its fix says)
        ("postgresql+asyncpg://u:hunter2-secret@127.0.0.1:1/db", "store", "cannot connect to 127.0.0.1:1",
         "check the URL's host and port"),
        ("postgresql+asyncpg://u:hunter2-secret@127.0.0.1:1/db?sslmode=require", "store",
         "the URL's query option 'sslmode' is not one asyncpg takes", "sslmode=require is ssl=require"),
        ("postgresql+asyncpg://u:hunter2-secret@127.0.0.1:notaport/db", "store", "malformed store URL",
         "postgresql+asyncpg://user:password@host:5432/db"),
        ("mysql://u:hunter2-secret@h/db", "store", "unsupported store URL 'mysql://u:***@h/db'",
         "postgresql+asyncpg://"),
        (f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'agentguard.db'}", "store", "a-file is not a folder",
         "a folder this user may write"),
        (f"sqlite+aiosqlite:///{tmp_path / 'junk.db'}", "server", "file is not a database",
         "name a SQLite database file"),
    ]
    for url, check, said, fix in cases:
        out = doctor("--url", url, cwd=tmp_path)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stdout + out.stderr
        assert "hunter2" not in out.stdout + out.stderr
        failed = [line for line in out.stdout.splitlines() if "  FAIL  " in line]
        assert len(failed) == 1 and failed[0].startswith(check) and said in failed[0], out.stdout
        follows = out.stdout.splitlines()[out.stdout.splitlines().index(failed[0]) + 1]
        assert follows.strip().startswith("fix: ") and fix in follows, out.stdout
        assert out.stdout.splitlines()[-1].startswith(f"1 line failed ({check})")
    assert (tmp_path / "junk.db").read_bytes().startswith(b"this is not")  # (never written)


@pytest.mark.postgres
def test_a_database_that_does_not_exist(tmp_path: Path) -> None:
    name = "nope_" + uuid.uuid4().hex[:8]
    code, doc = report("--url", make_url(PG_URL).set(database=name).render_as_string(False), cwd=tmp_path)
    assert code == 1 and doc["lines"] == [{
        "check": "store", "status": "FAIL", "found": f"{make_url(PG_URL).host}:{make_url(PG_URL).port}: database "
                                                      f"'{name}' does not exist",
        "fix": f"create it (CREATE DATABASE {name}) or fix the database named in the URL"}]


def run_sql(url: str, sql: str) -> None:
    """``sql`` on the store's database as the test server's superuser, one statement (separated by "; ") at a time,
    as psql runs what is pasted into it."""
    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(pg_dsn(url))
        try:
            for statement in sql.split("; "):
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(go())


@pytest.fixture
def role(store_url: str) -> Iterator[str]:
    """A login role of this test's own, with no right granted (dropped afterwards with what it was granted)."""
    name = "doctor_" + uuid.uuid4().hex[:10]
    run_sql(store_url, f"CREATE ROLE {name} LOGIN")
    try:
        yield name
    finally:
        run_sql(store_url, f"DROP OWNED BY {name}")
        run_sql(PG_URL, f"DROP ROLE {name}")


def role_url(store_url: str, role: str) -> str:
    run_sql(store_url, "REVOKE ALL ON SCHEMA public FROM PUBLIC")  # (as an emptied database has it; a new one not)
    return make_url(store_url).set(username=role).render_as_string(False)


def privileges(url: str, cwd: Path) -> tuple[int, dict[str, Any], dict[str, str]]:
    code, doc = report("--url", url, "--pool-size", "2", cwd=cwd)
    return code, doc, lines(doc)["privileges"]


@pytest.mark.postgres
def test_a_role_without_the_schemas_rights_fails_with_the_grants_that_make_it_pass(store_url: str, role: str,
                                                                                    tmp_path: Path) -> None:
    url = role_url(store_url, role)

    # No use of the schema at all: the tables cannot be found, nor made.
    code, doc, line = privileges(url, tmp_path)
    assert code == 1 and line["status"] == "FAIL" and "no use of schema public" in line["found"], line
    assert line["fix"] == f"GRANT USAGE, CREATE ON SCHEMA public TO {role}"
    assert lines(doc)["live race"]["status"] == "-" and doc["race"] is None  # (nothing written)
    assert rows(store_url, "SELECT to_regclass('agentguard_calls')") == [(None,)]
    run_sql(store_url, line["fix"])

    # The use of the schema but not the right to create in it, and no tables yet: a guard of this role could
    # not make them.
    run_sql(store_url, f"REVOKE CREATE ON SCHEMA public FROM {role}")
    code, doc, line = privileges(url, tmp_path)
    assert code == 1 and line["status"] == "FAIL", line
    assert line["found"] == (f"as {role}: agentguard_calls, agentguard_steps, agentguard_attempts, "
                             "agentguard_ledger_chains, agentguard_ledger_keys absent, and this role may not create "
                             "tables in schema public (nor may a guard of it; a role that may can create them by "
                             "running a guard once)")
    assert line["fix"] == f"GRANT CREATE ON SCHEMA public TO {role}" and doc["race"] is None
    run_sql(store_url, line["fix"])

    # As printed, the grant was enough: every line passes, and the race (making the tables) runs the body once.
    code, doc, line = privileges(url, tmp_path)
    assert code == 0 and line["status"] == "ok", doc
    assert_race_ran_once(doc)


@pytest.mark.postgres
def test_a_role_without_rights_on_tables_another_made_fails_with_the_grants_that_make_it_pass(
        store_url: str, role: str, tmp_path: Path) -> None:
    url = role_url(store_url, role)
    run_sql(store_url, f"GRANT USAGE ON SCHEMA public TO {role}")

    async def make_tables() -> None:  # (by another role, as a migration would)
        async with Guard(store_url) as guard:
            await guard.ensure_schema()

    asyncio.run(make_tables())
    code, doc, line = privileges(url, tmp_path)
    assert code == 1 and line["status"] == "FAIL", line
    assert ("no SELECT on agentguard_calls, agentguard_steps, agentguard_attempts, agentguard_ledger_chains,"
            " agentguard_ledger_keys" in line["found"]), line
    assert line["fix"] == (f"GRANT USAGE ON SEQUENCE public.agentguard_attempts_id_seq TO {role}; GRANT SELECT, "
                           "INSERT, UPDATE, DELETE ON agentguard_attempts, agentguard_calls, agentguard_ledger_chains,"
                           f" agentguard_ledger_keys, agentguard_steps TO {role}")
    assert doc["race"] is None
    run_sql(store_url, line["fix"])

    # As printed, the grants were enough: every line passes, and the race runs the body once as this role.
    code, doc, line = privileges(url, tmp_path)
    assert code == 0 and line["status"] == "ok", doc
    assert_race_ran_once(doc)


@pytest.mark.postgres
def test_a_read_only_database_fails_before_anything_is_written(store_url: str, tmp_path: Path) -> None:
    database = make_url(store_url).database
    run_sql(store_url, f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    code, doc = report("--url", store_url, "--pool-size", "2", cwd=tmp_path)
    server = lines(doc)["server"]
    assert code == 1 and server["status"] == "FAIL" and "sessions read-only" in server["found"], doc
    assert server["fix"] == ("SET default_transaction_read_only = off; "
                             f"ALTER DATABASE {database} SET default_transaction_read_only = off")
    assert lines(doc)["live race"] == {"check": "live race", "status": "-",
                                       "found": "skipped: fix the failed lines above first", "fix": ""}
    assert rows(store_url, "SELECT to_regclass('agentguard_calls')") == [(None,)]
    run_sql(store_url, server["fix"])
    code, doc = report("--url", store_url, "--pool-size", "2", cwd=tmp_path)
    assert code == 0 and lines(doc)["server"]["status"] == "ok", doc
    assert_race_ran_once(doc)


@pytest.fixture
def standby() -> Iterator[str]:
    """A hot standby of a primary of its own (two throwaway clusters, streaming replication): its URL."""
    from benchmarks._pgserver import PgServer, _free_port

    if BACKEND != "postgres":
        pytest.skip("Postgres-only test (AGENTGUARD_TEST_BACKEND=postgres)")
    primary = PgServer(fsync=False)
    try:
        port = make_url(primary.start()).port
    except RuntimeError as exc:
        primary.stop()
        pytest.fail(f"cannot start a throwaway PostgreSQL cluster: {exc}")
    assert primary.tmp is not None
    data, standby_port = primary.tmp / "standby", _free_port()
    try:
        primary._run("pg_basebackup", "-D", str(data), "-R", "-X", "stream", "--no-sync", "-h", "127.0.0.1",
                     "-p", str(port), "-U", "agentguard")
        # (a standby's max_connections may not be below its primary's)
        primary._run("pg_ctl", "-D", str(data), "-l", str(primary.tmp / "standby.log"), "-w", "-t", "60", "start",
                     "-o", f"-p {standby_port} -k {primary.tmp} -c listen_addresses=127.0.0.1 -c max_connections=300")
        yield f"postgresql+asyncpg://agentguard@127.0.0.1:{standby_port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            primary._run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        primary.stop()


@pytest.mark.postgres
def test_a_hot_standby_fails_before_anything_is_written(standby: str, tmp_path: Path) -> None:
    code, doc = report("--url", standby, cwd=tmp_path)
    server = lines(doc)["server"]
    assert code == 1 and server["status"] == "FAIL" and server["found"].endswith(
        "a hot standby (read-only: every claim would be refused)"), doc
    assert "point the URL at the primary" in server["fix"]
    assert [line["check"] for line in doc["lines"] if line["status"] == "FAIL"] == ["server"], doc
    assert lines(doc)["live race"]["found"] == "skipped: fix the failed lines above first" and doc["race"] is None


@pytest.mark.postgres
def test_the_connection_budget_against_max_connections(store_url: str, tmp_path: Path) -> None:
    max_connections = int(pg_execute(store_url, "SHOW max_connections")[0][0])
    workers = max_connections // 8 + 1  # (8 each at pool_size 2: more than the server takes)
    code, doc = report("--url", store_url, "--pool-size", "2", "--workers", str(workers), "--no-race", cwd=tmp_path)
    line = lines(doc)["connections"]
    assert code == 1 and line["status"] == "FAIL", line
    assert line["found"].startswith(f"{workers} workers may open up to {8 * workers} (pool_size 2: ")
    assert line["fix"].startswith("run fewer workers, raise max_connections") or "lower max_connections to" in (
        line["fix"])
    assert lines(doc)["live race"]["found"] == "skipped (--no-race): nothing was written"
    assert rows(store_url, "SELECT to_regclass('agentguard_calls')") == [(None,)]


@pytest.mark.storeless
def test_doctor_help_loads_no_store(tmp_path: Path) -> None:
    from test_cli_start import HEAVY, loaded

    out, modules = loaded("-m", "agentguard", "doctor", "--help", cwd=tmp_path)
    assert out.returncode == 0 and "--workers" in out.stdout, out.stderr
    assert sorted(modules & set(HEAVY)) == []


# -- behind PgBouncer (Debian's, started here on loopback) ----------------------------------------------------------

PGBOUNCER = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pgbouncer(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[int]:
    """A PgBouncer in the mode the test names (``request.param``) in front of the test server: its port."""
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    server = make_url(PG_URL)
    folder = tmp_path_factory.mktemp("pgbouncer")
    folder.chmod(0o777)  # (run as root, PgBouncer drops to nobody, who writes its log here)
    (folder / "users.txt").write_text(f'"{server.username}" ""\n')
    for attempt in range(5):
        port = _free_port()
        config = folder / "pgbouncer.ini"
        config.write_text(
            f"[databases]\n* = host={server.host} port={server.port}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
            f"listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {folder / 'users.txt'}\n"
            f"pool_mode = {request.param}\ndefault_pool_size = 60\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits\n")
        for f in folder.iterdir():
            f.chmod(0o666)
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with open(folder / "stderr.txt", "w") as err:
            proc = subprocess.Popen([PGBOUNCER, *user, str(config)], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            break
        assert attempt < 4, (folder / "stderr.txt").read_text()  # (the port was taken meanwhile: again)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.postgres
@pytest.mark.parametrize("pgbouncer", ["transaction"], indirect=True)
def test_behind_pgbouncer_in_transaction_mode_every_line_passes(store_url: str, pgbouncer: int,
                                                                 tmp_path: Path) -> None:
    url = make_url(store_url).set(host="127.0.0.1", port=pgbouncer).render_as_string(False)
    code, doc = report("--url", url, "--pool-size", "2", cwd=tmp_path)
    pooler = lines(doc)["pooler"]
    assert code == 0 and pooler["status"] == "ok" and pooler["found"].startswith("transaction pooling: "), doc
    assert "keeps no prepared statement" in pooler["found"] and not pooler["fix"]
    listen = lines(doc)["listen/notify"]  # (said from the pooler's verdict, not by waiting for a notification)
    assert listen["status"] == "warn" and listen["found"].startswith("not tried: a LISTEN is not heard"), listen
    # The guard works through it (tests/whitebox/test_pgbouncer.py): the race ends with one execution, every caller
    # served.
    assert_race_ran_once(doc)
    assert lines(doc)["scratch scope"]["status"] == "ok"


@pytest.mark.postgres
@pytest.mark.parametrize("pgbouncer", ["session"], indirect=True)
def test_behind_pgbouncer_in_session_mode_every_line_passes(store_url: str, pgbouncer: int, tmp_path: Path) -> None:
    url = make_url(store_url).set(host="127.0.0.1", port=pgbouncer).render_as_string(False)
    code, doc = report("--url", url, "--pool-size", "2", cwd=tmp_path)
    pooler = lines(doc)["pooler"]
    assert code == 0, doc
    assert pooler["status"] == "warn" and pooler["found"].startswith("session pooling or a proxy: "), pooler
    assert f"the URL names {pgbouncer}" in pooler["found"]
    assert lines(doc)["listen/notify"]["status"] == "ok"
    assert_race_ran_once(doc)
