"""``agentguard mcp-proxy`` refuses to start a guard that is not in place: run as the real command, with the
payments demo as its stdio upstream, it checks the store and every ``[tools.NAME]`` against the upstream's
tools before it answers anything. Each problem is named on stderr (field, line, what the upstream offers, the
closest name; store URLs without their password), stdout stays empty, and the exit status is 2."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from sqlalchemy.engine import make_url

import agentguard
from agentguard.mcp import META_REPLAYED

from conftest import PG_URL

pytestmark = [pytest.mark.slow, pytest.mark.storeless]  # (its Postgres-marked tests run in the Postgres pass)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent
DEMO = ROOT / "servers" / "payments_demo.py"
COMMAND = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config"]  # the `agentguard` command's entry
GOOD_TOOLS = '[tools.create_charge]\nkey = ["order_id"]\nignore = ["memo"]\nforward_key_to = "idempotency_key"\n'
DEMO_ARGUMENTS = "amount_cents, currency, idempotency_key, memo, order_id"
CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-1"}


def write_config(tmp_path: Path, *, store: str | None, tools: str = GOOD_TOOLS, startup_wait: float = 0.3,
                 upstream: str | None = None) -> Path:
    store_url = f'url = "{store}"\n' if store is not None else ""
    upstream = upstream or (f"command = [\"python\", {json.dumps(str(DEMO))}]\n"
                            'env = { PAYMENTS_DEMO_DB = "payments.db" }\n')
    path = tmp_path / "agentguard.toml"
    path.write_text(f"[store]\n{store_url}startup_wait = {startup_wait}\n\n[upstream]\n{upstream}\n{tools}")
    return path


def line(config: Path, text: str) -> int:
    """The line of ``config`` that starts with ``text``."""
    [no] = [i for i, ln in enumerate(config.read_text().splitlines(), 1) if ln.startswith(text)]
    return no


def start(
    config: Path, env: dict[str, str] | None = None, *, stdin_closed: bool = False
) -> subprocess.CompletedProcess[str]:
    """The command as a host runs it, with nothing on its input (/dev/null, or ``stdin_closed``: descriptor 0
    closed by a shell's ``0<&-``): a proxy that does start serves, reads the end of its input and exits 0."""
    command = [*COMMAND, str(config)]
    if stdin_closed:
        command = ["sh", "-c", 'exec "$@" 0<&-', "sh", *command]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
        cwd=config.parent, env={"PYTHONPATH": str(PACKAGE_ROOT), "PATH": os.environ.get("PATH", ""), **(env or {})},
    )


def refused(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""  # stdout is the protocol: not a byte before the handshake, not a word of prose
    assert "nothing was served" in run.stderr
    return run.stderr


def closed_port() -> int:
    """A local port nothing listens on (connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_config_that_matches_the_upstream_starts(tmp_path: Path) -> None:
    run = start(write_config(tmp_path, store="sqlite+aiosqlite:///claims.db"))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and "serving" in run.stderr


def test_a_closed_stdin_reads_as_an_empty_one(tmp_path: Path) -> None:
    """Not just /dev/null: a host may start the proxy with its input closed. It checks, serves, meets the end
    of its input and exits 0, with no traceback; its store is opened on a descriptor of its own."""
    run = start(write_config(tmp_path, store="sqlite+aiosqlite:///claims.db"), stdin_closed=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and "serving" in run.stderr and "Traceback" not in run.stderr
    with sqlite3.connect(tmp_path / "claims.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_every_tool_and_argument_the_upstream_lacks_stops_the_proxy(tmp_path: Path) -> None:
    tools = (
        '[tools.create_chargee]\nkey = ["order_id"]\n\n'
        '[tools.create_charge]\nkey = ["orderid"]\nignore = ["memoo"]\nforward_key_to = "idempotency"\n'
    )
    config = write_config(tmp_path, store="sqlite+aiosqlite:///claims.db", tools=tools)
    err = refused(start(config))
    assert (f"tools.create_chargee (line {line(config, '[tools.create_chargee]')}): the upstream offers no tool "
            "named 'create_chargee' (did you mean 'create_charge'?); it offers: create_charge, create_refund, "
            "list_charges") in err
    for field, given, meant, where in (("key", "orderid", "order_id", 'key = ["orderid"]'),
                                       ("ignore", "memoo", "memo", "ignore"),
                                       ("forward_key_to", "idempotency", "idempotency_key", "forward_key_to")):
        assert (f"tools.create_charge.{field} (line {line(config, where)}): {given!r} is not an argument "
                f"of create_charge (did you mean {meant!r}?); its arguments are: {DEMO_ARGUMENTS}") in err
    assert err.count("  - ") == 4


def test_store_and_tool_problems_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where the store's folder should be")
    tools = '[tools.create_charge]\nkey = ["orderid"]\n'
    config = write_config(tmp_path, store=f"sqlite+aiosqlite:///{tmp_path / 'blocker' / 'claims.db'}", tools=tools)
    err = refused(start(config))
    assert f"store.url (line {line(config, 'url =')}): cannot use the store sqlite+aiosqlite:///" in err
    assert "tools.create_charge.key" in err and "did you mean 'order_id'?" in err


@pytest.mark.parametrize(
    ("store", "env", "expected"),
    [
        pytest.param("postgresql+asyncpg://agent:s3cret@db.invalid:notaport/app", {},
                     ["store.url (line 2): cannot use postgresql+asyncpg://agent:***@db.invalid:notaport/app",
                      "malformed store URL"], id="malformed"),
        pytest.param(None, {"AGENTGUARD_URL": "postgresql+psycopg://agent:s3cret@db.invalid/app"},
                     ["store.url (from $AGENTGUARD_URL): cannot use postgresql+psycopg://agent:***@db.invalid/app",
                      "asyncpg only"], id="from-environment"),
        pytest.param("postgresql+asyncpg://agent:s3cret@127.0.0.1:{port}/app", {},
                     ["store.url (line 2): cannot reach the store postgresql+asyncpg://agent:***@127.0.0.1:{port}/app",
                      "Connect call failed", "(retried for 0.3s: store.startup_wait)"], id="unreachable"),
    ],
)
def test_a_store_that_cannot_be_used_stops_the_proxy_without_showing_its_password(
    tmp_path: Path, store: str | None, env: dict[str, str], expected: list[str]
) -> None:
    port = closed_port()
    store = store.format(port=port) if store is not None else None
    err = refused(start(write_config(tmp_path, store=store), env=env))
    for text in expected:
        assert text.format(port=port) in err
    assert "s3cret" not in err  # neither in the problems nor in the log lines before them
    # Only a store that cannot be reached is waited for (within store.startup_wait).
    assert ("retrying for up to 0.3s" in err) == ("cannot reach" in expected[0])


@pytest.mark.postgres
def test_wrong_credentials_stop_the_proxy_at_once(tmp_path: Path) -> None:
    url = make_url(PG_URL).set(username="nobody_here", password="s3cret").render_as_string(hide_password=False)
    err = refused(start(write_config(tmp_path, store=url, startup_wait=60)))
    assert 'role "nobody_here" does not exist' in err and "nobody_here:***@" in err
    assert "s3cret" not in err and "retrying" not in err  # a store that answered "no" is not waited for


def test_an_upstream_that_cannot_be_started_stops_the_proxy(tmp_path: Path) -> None:
    config = write_config(tmp_path, store="sqlite+aiosqlite:///claims.db",
                          upstream=f'command = [{json.dumps(str(tmp_path / "no-such-server"))}]\n')
    err = refused(start(config))
    assert "upstream: the upstream server could not be started or reached" in err


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_store_that_comes_up_within_startup_wait_is_used(tmp_path: Path, store_url: str) -> None:
    # The store's address answers "connection refused" until the proxy has said it is waiting for it; then
    # a relay to the real server starts listening there, and the proxy starts serving.
    port = closed_port()
    real = make_url(store_url)
    config = write_config(tmp_path, store=real.set(host="127.0.0.1", port=port).render_as_string(hide_password=False),
                          startup_wait=120)
    errlog = tmp_path / "stderr.txt"
    params = StdioServerParameters(command=COMMAND[0], args=[*COMMAND[1:], str(config)],
                                   env={"PYTHONPATH": str(PACKAGE_ROOT)}, cwd=str(tmp_path))

    async def relay(client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp(real.host or "127.0.0.1", real.port or 5432) as server:

            async def pump(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream) -> None:
                try:
                    async for chunk in src:
                        await dst.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                pipes.cancel_scope.cancel()

            async with anyio.create_task_group() as pipes:
                pipes.start_soon(pump, client, server)
                pipes.start_soon(pump, server, client)

    async def store_comes_up() -> None:
        # Polled: the proxy writes its stderr from another process.
        while "cannot reach the store" not in errlog.read_text():  # noqa: ASYNC110
            await anyio.sleep(0.02)
        async with await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port) as listener:
            await listener.serve(relay)

    with errlog.open("w") as err:
        async with anyio.create_task_group() as tg:
            tg.start_soon(store_comes_up)
            async with Client(stdio_client(params, errlog=err), mode="legacy") as client:
                first = await client.call_tool("create_charge", CHARGE)
                second = await client.call_tool("create_charge", CHARGE)
            tg.cancel_scope.cancel()
    assert not first.is_error and second.meta and second.meta[META_REPLAYED] is True
    assert "retrying for up to" in errlog.read_text()
