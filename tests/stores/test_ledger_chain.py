"""Tamper evidence: ledger entries and operators' acts form a hash chain per scope; ``agentguard verify`` walks
it and exits 1 naming the first entry edited, deleted or reordered with plain SQL; the sweep cuts a chain only at
its start and leaves an anchor, so what it keeps still verifies; many writers of one scope at once (threads with
a ledger writer each, processes) still form one chain. On the suite's backend."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard import Guard, KeyReuseError, task

from cli_runs import run
from conftest import pg_dsn, raw_exec, tid

pytestmark = pytest.mark.anyio

ATTEMPTS = "agentguard_attempts"
WRITER = str(Path(__file__).resolve().parents[1] / "chain_writer.py")


async def raw_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql``, read behind the guard's back (plain drivers)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(str(make_url(url).database), timeout=30)
        try:
            return [tuple(r) for r in conn.execute(sql)]
        finally:
            conn.close()
    import asyncpg

    conn2 = await asyncpg.connect(pg_dsn(url))
    try:
        return [tuple(r) for r in await conn2.fetch(sql)]
    finally:
        await conn2.close()


def verify(url: str, tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    """``agentguard verify`` as a person runs it: its exit code, its text, and its JSON."""
    text = run("verify", "--url", url, *args, cwd=tmp_path)
    js = run("verify", "--url", url, "--json", *args, cwd=tmp_path)
    assert text.returncode == js.returncode, (text.stderr, js.stderr)
    return text.returncode, text.stdout + text.stderr, json.loads(js.stdout)


async def chain_of(url: str, scope: str = "default") -> list[tuple[int, int]]:
    """(id, seq) of a scope's entries, in order of place."""
    return [(int(i), int(s)) for i, s in await raw_rows(
        url, f"SELECT id, seq FROM {ATTEMPTS} WHERE scope = '{scope}' ORDER BY seq")]


async def a_story(make_guard: Callable[..., Guard]) -> None:
    """Calls that ran, replayed and were refused, and an operator's act (forget), in the scope ``default``."""
    g = make_guard()

    @g.once(key=["order"])
    async def charge(order: str, amount: int) -> int:
        return amount

    t = tid()
    with task(t):
        for n in range(3):
            await charge(f"o-{n}", 100)
        await charge("o-0", 100)
        with pytest.raises(KeyReuseError):
            await charge("o-0", 999)
    [rec] = [r for r in await g.attempts(task_id=t) if r.operation.endswith('"o-1"]')]
    await g.forget(rec.key)
    await g.flush_ledger()


TAMPERING = {
    # what was done with plain SQL -> what verify must name (filled with the ids of the chain's entries)
    "edit": ("UPDATE {t} SET detail = 'succeeded, honest' WHERE id = {c}", "entry id={c} (seq 3) was edited"),
    "edit_time": ("UPDATE {t} SET at = at - 3600 WHERE id = {c}", "entry id={c} (seq 3) was edited"),
    "delete": ("DELETE FROM {t} WHERE id = {c}", "entries are missing after entry id={b} (seq 2): seq 3 (deleted)"),
    "delete_first": ("DELETE FROM {t} WHERE id = {a}", "entries are missing at the start of the chain"),
    "delete_newest": ("DELETE FROM {t} WHERE id = {z}", "the newest entries are missing"),
    "swap": ("UPDATE {t} SET seq = -1 WHERE id = {b}; UPDATE {t} SET seq = 2 WHERE id = {c};"
             " UPDATE {t} SET seq = 3 WHERE id = {b}", "entry id={c} (seq 2) was moved: it was written at seq 3"),
    "insert": ("INSERT INTO {t} (scope, key, task_id, operation, tool, kind, detail, attempt, process, at,"
               " expires_at) VALUES ('default', 'ag_x', 't', 'op', 'charge', 'ran', 'forged', 1, 'h:1', 1, 2e9)",
               "is not in the chain but was written after it began"),
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
async def test_verify_names_the_first_entry_tampered_with(
    make_guard: Callable[..., Guard], store_url: str, tmp_path: Path, how: str,
) -> None:
    await a_story(make_guard)
    chain = await chain_of(store_url)
    assert [seq for _, seq in chain] == list(range(1, 7))  # 5 calls and the operator's act
    if how == "edit":  # (the command's report of a chain that verifies: once)
        code, out, js = verify(store_url, tmp_path)
        assert code == 0 and "ok        scope 'default': 6 entries verified (seq 1 to 6)" in out, out
        assert js["ok"] and js["scopes"][0]["entries"] == 6 and len(js["scopes"][0]["head"]) == 64
    else:
        [check] = await make_guard().verify_ledger()
        assert check.ok and check.entries == 6

    ids = {"a": chain[0][0], "b": chain[1][0], "c": chain[2][0], "z": chain[-1][0], "t": ATTEMPTS}
    sql, named = TAMPERING[how]
    await raw_exec(store_url, sql.format(**ids))
    code, out, js = verify(store_url, tmp_path)
    assert code == 1 and "TAMPERED  scope 'default'" in out and named.format(**ids) in out, out
    assert not js["ok"] and named.format(**ids) in js["scopes"][0]["problem"]


async def test_an_edited_head_and_other_scopes_are_told_apart(
    make_guard: Callable[..., Guard], store_url: str, tmp_path: Path,
) -> None:
    await a_story(make_guard)
    other = make_guard()

    @other.once(key=["order"])
    async def refund(order: str) -> str:
        return order

    with task(tid(), scope="acme"):
        await refund("o-9")
    checks = await other.verify_ledger()
    assert [(c.scope, c.entries, c.ok) for c in checks] == [("acme", 1, True), ("default", 6, True)]
    # (its first digit changed, whatever it was)
    await raw_exec(store_url, "UPDATE agentguard_ledger_chains SET digest = CASE WHEN substr(digest, 1, 1) = 'f'"
                              " THEN 'e' ELSE 'f' END || substr(digest, 2) WHERE scope = 'acme'")
    code, out, js = verify(store_url, tmp_path)
    assert code == 1 and "the chain's head does not match its newest entry" in out
    assert [s["ok"] for s in js["scopes"]] == [False, True]  # only acme's chain is named
    code, _, _ = verify(store_url, tmp_path, "--scope", "default")
    assert code == 0


async def test_the_sweep_cuts_a_chain_at_its_start_and_what_it_keeps_verifies(
    make_guard: Callable[..., Guard], store_url: str, tmp_path: Path,
) -> None:
    short, long = make_guard(retention=1), make_guard(retention=3600)

    for g, orders in ((short, ("o-1", "o-2", "o-3")), (long, ("o-4", "o-5"))):
        @g.once(key=["order"])
        async def charge(order: str) -> str:
            return order

        with task(tid()):
            for order in orders:
                await charge(order)
        await g.flush_ledger()
    # The short guard's three entries (places 1-3) expire in a second; the long guard's two (4-5) in an hour.
    assert [seq for _, seq in await chain_of(store_url)] == [1, 2, 3, 4, 5]
    for _ in range(600):  # (a bound that only ends a test that would hang)
        await long.sweep()
        if len(await chain_of(store_url)) <= 2:
            break
        await asyncio.sleep(0.1)
    assert [seq for _, seq in await chain_of(store_url)] == [4, 5]
    assert await raw_rows(store_url, "SELECT anchor_seq FROM agentguard_ledger_chains") == [(4,)]
    [check] = await long.verify_ledger()
    assert check.ok and (check.entries, check.first, check.last) == (2, 4, 5)
    # The anchor tells the sweep's cut from a deletion at the start.
    [(first, _), _] = await chain_of(store_url)
    await raw_exec(store_url, f"DELETE FROM {ATTEMPTS} WHERE id = {first}")
    code, out, _ = verify(store_url, tmp_path)
    assert code == 1 and "entries are missing at the start of the chain" in out and "seq 4" in out


@pytest.mark.slow
async def test_many_writers_of_one_scope_form_one_chain(store_url: str, tmp_path: Path) -> None:
    processes, threads, calls = 3, 3, 40
    async with Guard(store_url) as g:
        await g.ensure_schema()
    argv = [sys.executable, WRITER, store_url]
    workers = [subprocess.Popen([*argv, f"w{n}", str(threads), str(calls)],  # noqa: ASYNC220 (a barrier follows)
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for n in range(processes)]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    for w in workers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in workers:
        out, _ = w.communicate(timeout=300)
        assert w.returncode == 0 and out.strip() == "done", out
    total = processes * threads * calls
    chain = await chain_of(store_url)
    assert [seq for _, seq in chain] == list(range(1, total + 1))
    # Every writer's batches interleaved with the others' (many batches, not one per writer).
    writers = [p for (p,) in await raw_rows(store_url, f"SELECT process FROM {ATTEMPTS} ORDER BY seq")]
    assert len(set(writers)) == processes and sum(a != b for a, b in itertools.pairwise(writers)) > 3
    code, out, js = verify(store_url, tmp_path)
    assert code == 0 and js["scopes"][0]["entries"] == total, out
