"""The ledger's hash chain: tamper evidence for the ledger of attempts (``_attempts``).

Each entry has a place in its scope's chain (``seq``: 1, 2, 3 ...) and carries the digest of the entry before it
(``prev``) and its own (``digest``: SHA-256 of ``prev``, its place and the hash of its values, :func:`link`).
Editing an entry breaks its digest; deleting one leaves a gap in the places; moving one breaks its digest (its
place is in it). Operators' acts (``resolve``, ``forget``) are entries like any other. :class:`Walk` checks a
chain in order and names the first entry that does not verify (``agentguard verify``).

**One order every writer agrees on.** Each scope's head (its last place and digest) is a row of
``agentguard_ledger_chains``. A batch of entries takes the heads of its scopes under a lock — Postgres: ``FOR
UPDATE``, in the scopes' order, so two batches never wait for each other crosswise; SQLite: the write lock of its
``BEGIN IMMEDIATE`` — places its entries after them and moves them, in its own transaction. Writers in many
processes therefore interleave whole batches, each a run of consecutive places; a unique index on ``(scope,
seq)`` backs it. The lock is held for the batch's few statements and one SHA-256 of a short string per entry:
the hash of each entry's values is computed before it is taken, and all of it runs on the ledger's writer, off
the callers' path.

**Retention cuts a chain only at its start** (:func:`cut_at`): an entry is deleted once it and every entry before
it in its chain are past their retention, and the chain's row keeps the anchor where the sweep cut (the first
place kept and the digest that entry follows), in the same transaction, so what is kept still verifies and a
deletion at the start is told apart from the sweep's.

What it cannot tell: a person with write access to the database can rewrite a whole chain's tail and its head
consistently. ``agentguard verify`` prints each head's digest; a copy kept elsewhere proves the tail since.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Column, String, Table, text
from sqlalchemy.ext.asyncio import AsyncConnection

from .._stdlib_shims import encoder
from ._aiosqlite import Unsynced, Waiters
from ._schema import metadata

if TYPE_CHECKING:
    from ._executor import Executor

CHAINS = "agentguard_ledger_chains"
GENESIS = "0" * 64  # the digest the first entry of a chain follows
# Entries one INSERT of a SQLite batch carries at most (``insert_rows``): one statement, one step, where
# ``executemany`` takes a step per entry, each letting go of the GIL and waiting to take it back from the callers'
# threads (docs/benchmarks.md, "The ledger's batch in a few statements"). Each size's compiled statement is kept by
# the connection: those of 1 to 64 rows, about 260 kB in all.
ROWS_PER_INSERT = 64
CHAIN_COLUMNS = ("seq", "prev", "digest")  # an entry's place in its chain, the digest it follows, its own

chains = Table(
    CHAINS,
    metadata,
    Column("scope", String(255), primary_key=True),
    Column("seq", BigInteger, nullable=False),  # the last entry's place (0: none yet)
    Column("digest", String(64), nullable=False),  # the last entry's digest (GENESIS: none yet)
    Column("anchor_seq", BigInteger, nullable=False),  # the first place kept (1 until a sweep cut the chain)
    Column("anchor", String(64), nullable=False),  # the digest the entry at anchor_seq follows
)

# Where the values of ``_attempts.WRITTEN`` are integers and doubles (normalised before they are hashed and
# written, so that the hash is of what the store gives back).
ATTEMPT, DOUBLES = 7, (10, 11, 12, 13)


def normalised(row: Sequence[Any]) -> tuple[Any, ...]:
    """An entry (the values of ``_attempts.WRITTEN``) as the store gives it back: the attempt an integer, the times
    floats. A value that is neither raises ``TypeError``/``ValueError``: the store refuses that entry alone."""
    if type(row[0]) is not str:
        raise TypeError(f"an entry's scope must be a str, not {type(row[0]).__name__}")
    values = list(row)
    if values[ATTEMPT] is not None:
        values[ATTEMPT] = int(values[ATTEMPT])
    for i in DOUBLES:
        if values[i] is not None:
            values[i] = float(values[i])
    return tuple(values)


# ``json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode`` with its C encoder built once, not once
# per entry (the same text: ``_stdlib_shims``). The digests stay OpenSSL's: an entry's form is some 200 bytes,
# where its SHA-256 costs less than half of CPython's own (0.33 against 0.77 µs here).
_form = encoder()


def entry_hash(values: Sequence[Any]) -> str:
    """SHA-256 of an entry's values (normalised), in a form that tells every value apart (a JSON array)."""
    return hashlib.sha256(_form(list(values)).encode()).hexdigest()


def link(prev: str, seq: int, hashed: str) -> str:
    """The digest of the entry at place ``seq`` whose values hash to ``hashed``, following ``prev``."""
    return hashlib.sha256(f"{prev}:{seq}:{hashed}".encode()).hexdigest()


Prepared = tuple[tuple[Any, ...], str]  # an entry's normalised values and their hash
Heads = dict[str, tuple[int, str]]  # scope -> (its last place, its last digest)


def prepared(rows: Iterable[Sequence[Any]]) -> list[Prepared]:
    """The entries normalised and hashed: the work done before the heads are locked."""
    out = []
    for row in rows:
        values = normalised(row)
        out.append((values, entry_hash(values)))
    return out


def place(entries: Sequence[Prepared], heads: Heads) -> tuple[list[tuple[Any, ...]], Heads]:
    """Each entry after its scope's head, in order: the rows to write (values, then ``CHAIN_COLUMNS``) and the
    heads moved."""
    moved = dict(heads)
    rows = []
    for values, hashed in entries:
        scope = values[0]
        seq, prev = moved[scope]
        seq += 1
        digest = link(prev, seq, hashed)
        rows.append((*values, seq, prev, digest))
        moved[scope] = (seq, digest)
    return rows, {scope: moved[scope] for scope in moved if moved[scope] != heads.get(scope)}


def cut_at(window: Sequence[Sequence[Any]]) -> tuple[int, int, str] | None:
    """Where a sweep cuts a chain: ``window`` is its first entries from its anchor on, in order, each ``(seq,
    digest, expired)``. Returns (how many to delete, the new anchor's place, the digest it follows), or None when
    the first is not past its retention."""
    kept = next((i for i, (_, _, expired) in enumerate(window) if not expired), len(window))
    if kept == 0:
        return None
    last = window[kept - 1]
    return kept, (int(window[kept][0]) if kept < len(window) else int(last[0]) + 1), str(last[1])


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """What ``agentguard verify`` found of one scope's chain: how many entries verified, from which place to
    which, the head's digest (keep a copy elsewhere: it proves everything up to it), how many entries are not in
    a chain (written before the store had one), and the first problem, if any: what it is and the entry it names
    (its id and place)."""

    scope: str
    entries: int
    first: int | None
    last: int | None
    head: str
    unchained: int
    problem: str | None = None
    entry_id: int | None = None
    seq: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class Walk:
    """One chain checked entry by entry, in order of place, from its anchor: the first problem is kept and the
    walk stops there."""

    def __init__(self, scope: str, anchor_seq: int, anchor: str, head_seq: int, head: str) -> None:
        self.scope, self.head_seq, self.head = scope, head_seq, head
        self.expected, self.prev = anchor_seq, anchor
        self.before: tuple[int, int] | None = None  # (id, seq) of the entry last verified
        self.count = 0
        self.first: int | None = None
        self.problem: str | None = None
        self.entry_id: int | None = None
        self.seq: int | None = None

    def _fail(self, problem: str, entry_id: int | None, seq: int | None) -> bool:
        self.problem, self.entry_id, self.seq = problem, entry_id, seq
        return False

    def _after(self) -> str:
        return (f"after entry id={self.before[0]} (seq {self.before[1]})" if self.before is not None
                else "at the start of the chain (where the last sweep left it)")

    def feed(self, entry_id: int, seq: int, prev: str | None, digest: str | None, values: Sequence[Any]) -> bool:
        """Check the next entry; False once a problem is found (the walk ends)."""
        if seq < self.expected:
            return self._fail(f"entry id={entry_id} (seq {seq}) is before the chain's anchor (seq {self.expected}): "
                              "it was inserted or moved", entry_id, seq)
        if seq > self.expected:
            gap = f"seq {self.expected}" + (f" to {seq - 1}" if seq - 1 > self.expected else "")
            return self._fail(f"entries are missing {self._after()}: {gap} (deleted); the next is entry id={entry_id} "
                              f"(seq {seq})", entry_id, self.expected)
        try:
            hashed = entry_hash(normalised(values))
        except (TypeError, ValueError):
            hashed = ""
        if prev is None or digest is None or link(prev, seq, hashed) != digest:
            moved = _written_at(prev, seq, hashed, digest)
            if moved is not None:
                return self._fail(f"entry id={entry_id} (seq {seq}) was moved: it was written at seq {moved} "
                                  "(entries reordered)", entry_id, seq)
            return self._fail(f"entry id={entry_id} (seq {seq}) was edited: its values do not match its digest",
                              entry_id, seq)
        if prev != self.prev:
            return self._fail(f"entry id={entry_id} (seq {seq}) does not follow the entry before it ({self._after()}): "
                              "that one was rewritten, or the entries were reordered", entry_id, seq)
        self.prev, self.before = digest, (entry_id, seq)
        self.expected += 1
        self.count += 1
        if self.first is None:
            self.first = seq
        return True

    def end(self) -> None:
        """After the last entry: the chain must reach its head."""
        if self.problem is not None:
            return
        if self.expected - 1 < self.head_seq:
            gap = f"seq {self.expected}" + (f" to {self.head_seq}" if self.head_seq > self.expected else "")
            self._fail(f"the newest entries are missing {self._after()}: {gap} (deleted; the chain's head is at "
                       f"seq {self.head_seq})", None, self.expected)
        elif self.prev != self.head:
            self._fail(f"the chain's head does not match its newest entry ({self._after()}): the head was edited",
                       None, self.head_seq)

    def check(self, unchained: int) -> ChainCheck:
        return ChainCheck(self.scope, self.count, self.first, self.expected - 1 if self.count else None, self.head,
                          unchained, self.problem, self.entry_id, self.seq)


MOVED_WINDOW = 1000  # places either side where a moved entry's original place is looked for


def _written_at(prev: str | None, seq: int, hashed: str, digest: str | None) -> int | None:
    """The place an entry whose digest does not match its place was written at, if near: it was moved."""
    if prev is None or digest is None or not hashed:
        return None
    for other in range(max(1, seq - MOVED_WINDOW), seq + MOVED_WINDOW + 1):
        if other != seq and link(prev, other, hashed) == digest:
            return other
    return None


# -- the statements -----------------------------------------------------------------------------------------


class Chain:
    """The chain's statements for one store: the ledger's table ``attempts``, its ``written`` columns, the
    database clock ``now``."""

    def __init__(self, attempts: str, written: Sequence[str], now: str) -> None:
        self.attempts, self.written = attempts, tuple(written)
        columns = (*self.written, *CHAIN_COLUMNS)
        self.columns = columns
        once = f"(SELECT {now})"
        # SQLite, on a connection's own thread (positional ``?``)
        self.sq_head = f"SELECT seq, digest FROM {CHAINS} WHERE scope = ?"
        self.sq_last = (f"SELECT seq, digest FROM {attempts} WHERE scope = ? AND seq IS NOT NULL"
                        " ORDER BY seq DESC LIMIT 1")
        self.sq_first = f"SELECT seq, prev FROM {attempts} WHERE scope = ? AND seq IS NOT NULL ORDER BY seq LIMIT 1"
        self.sq_new_head = (f"INSERT INTO {CHAINS} (scope, seq, digest, anchor_seq, anchor) VALUES (?, ?, ?, ?, ?)"
                            " ON CONFLICT (scope) DO NOTHING")
        self.sq_insert = (f"INSERT INTO {attempts} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})")
        self._inserts: dict[int, str] = {}  # rows -> an INSERT of that many (sq_insert_rows)
        self.sq_move = f"UPDATE {CHAINS} SET seq = ?, digest = ? WHERE scope = ?"
        # Postgres, through asyncpg ($n)
        self.pg_new_heads = (
            f"INSERT INTO {CHAINS} (scope, seq, digest, anchor_seq, anchor)"
            " SELECT s, COALESCE(l.seq, 0), COALESCE(l.digest, $2), COALESCE(f.seq, 1), COALESCE(f.prev, $2)"
            " FROM unnest($1::text[]) AS s"
            f" LEFT JOIN LATERAL (SELECT seq, digest FROM {attempts} WHERE scope = s AND seq IS NOT NULL"
            " ORDER BY seq DESC LIMIT 1) AS l ON true"
            f" LEFT JOIN LATERAL (SELECT seq, prev FROM {attempts} WHERE scope = s AND seq IS NOT NULL"
            " ORDER BY seq LIMIT 1) AS f ON true"
            " ORDER BY s ON CONFLICT (scope) DO NOTHING"
        )
        # (in the scopes' order: two batches that share scopes lock them in the same order)
        self.pg_lock_heads = (f"SELECT scope, seq, digest FROM {CHAINS} WHERE scope = ANY($1::text[])"
                              " ORDER BY scope FOR UPDATE")
        self.pg_move = (f"UPDATE {CHAINS} AS c SET seq = v.seq, digest = v.digest FROM unnest($1::text[],"
                        " $2::bigint[], $3::text[]) AS v(scope, seq, digest) WHERE c.scope = v.scope")
        # The sweep: whether anything is to delete, reading no row however large the table (the expiry index's edge
        # for the entries written before the chain — in its order, or Postgres may read the table to find none —;
        # each chain's first entry kept, by its place), then cuts.
        self.to_sweep = text(
            f"SELECT NULL AS scope FROM (SELECT 1 AS one FROM {attempts} WHERE expires_at < {once} AND seq IS NULL"
            " ORDER BY expires_at LIMIT 1) AS unchained UNION ALL"
            f" SELECT c.scope FROM {CHAINS} c WHERE (SELECT a.expires_at FROM {attempts} a WHERE a.scope = c.scope"
            f" AND a.seq >= c.anchor_seq ORDER BY a.seq LIMIT 1) < {once}"
        )
        self.sweep_unchained = text(
            f"DELETE FROM {attempts} WHERE id IN (SELECT id FROM {attempts} WHERE expires_at < {once}"
            " AND seq IS NULL LIMIT :batch)"
        )
        self.anchor_for_update = text(f"SELECT anchor_seq FROM {CHAINS} WHERE scope = :scope FOR UPDATE")
        self.anchor = text(f"SELECT anchor_seq FROM {CHAINS} WHERE scope = :scope")
        self.window = text(
            f"SELECT seq, digest, CASE WHEN expires_at < {once} THEN 1 ELSE 0 END FROM {attempts}"
            " WHERE scope = :scope AND seq >= :anchor_seq ORDER BY seq LIMIT :size"
        )
        self.cut = text(f"DELETE FROM {attempts} WHERE scope = :scope AND seq >= :anchor_seq AND seq < :upto")
        self.move_anchor = text(f"UPDATE {CHAINS} SET anchor_seq = :upto, anchor = :anchor WHERE scope = :scope")
        # verify
        self.heads = text(f"SELECT scope, seq, digest, anchor_seq, anchor FROM {CHAINS}"
                          " WHERE (CAST(:scope AS VARCHAR) IS NULL OR scope = :scope) ORDER BY scope")
        self.census = text(
            f"SELECT scope, count(seq), count(*) - count(seq) FROM {attempts}"
            " WHERE (CAST(:scope AS VARCHAR) IS NULL OR scope = :scope) GROUP BY scope ORDER BY scope"
        )
        self.page = text(
            f"SELECT id, seq, prev, digest, {', '.join(self.written)} FROM {attempts}"
            " WHERE scope = :scope AND seq > :after ORDER BY seq LIMIT :page"
        )
        self.late_unchained = text(
            f"SELECT id FROM {attempts} WHERE scope = :scope AND seq IS NULL AND id > :first ORDER BY id LIMIT 1"
        )
        self.first_id = text(f"SELECT min(id) FROM {attempts} WHERE scope = :scope AND seq IS NOT NULL")

    def sq_insert_rows(self, n: int) -> str:
        """SQLite: an INSERT of ``n`` entries (``sq_insert``'s columns, ``n`` rows of values). ``OR ROLLBACK``: a
        constraint it breaks ends the batch's whole transaction, as the batch's own ``ROLLBACK`` would, so SQLite
        keeps no statement journal for it (a copy of every page it changes, spilled to a temporary file past 64 KiB,
        which cost a statement of many rows more than an insert of each)."""
        text = self._inserts.get(n)
        if text is None:
            one = f"({', '.join('?' * len(self.columns))})"
            text = self._inserts[n] = (f"INSERT OR ROLLBACK INTO {self.attempts} ({', '.join(self.columns)}) VALUES "
                                       + ", ".join([one] * n))
        return text

    def rows_per_insert(self, conn: sqlite3.Connection) -> int:
        """Entries one INSERT carries on ``conn``: ``ROWS_PER_INSERT``, fewer where its limit of variables is lower
        (999 before SQLite 3.32), a power of two."""
        fits = max(conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(self.columns), 1)
        return min(ROWS_PER_INSERT, 1 << (fits.bit_length() - 1))


# -- writing: a batch placed after its scopes' heads, in one transaction ----------------------------------------


Also = Sequence[tuple[str, Sequence[Sequence[Any]]]]  # more statements of a batch's transaction, each with its rows


def sqlite_append(conn: Any, chain: Chain, entries: Sequence[Prepared], unsynced: bool, also: Also = (),
                  waiters: Waiters | None = None) -> None:
    """On an aiosqlite connection's thread (autocommit): ``entries`` placed after their scopes' heads and
    written, and the heads moved, in one transaction that holds the write lock from its start (so no other
    writer can place entries meanwhile); ``also`` run in it after them. ``unsynced``: its commit not synced, as
    a claim's is (``_aiosqlite.Unsynced``). ``waiters``: the store's, told that this long write holds the lock
    (a write of the store kept waiting meanwhile goes on as it ends: ``Waiters.holding``)."""
    with Unsynced(conn) if unsynced else contextlib.nullcontext():
        conn.execute("BEGIN IMMEDIATE")
        with waiters.holding() if waiters is not None else contextlib.nullcontext():
            try:
                heads: Heads = {}
                for scope in sorted({values[0] for values, _ in entries}):
                    head = conn.execute(chain.sq_head, (scope,)).fetchone()
                    if head is None:
                        head = _sqlite_new_head(conn, chain, scope)
                    heads[scope] = (int(head[0]), str(head[1]))
                rows, moved = place(entries, heads)
                insert_rows(conn, chain, rows)
                conn.executemany(chain.sq_move, [(seq, digest, scope) for scope, (seq, digest) in moved.items()])
                for sql, params in also:
                    conn.executemany(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise


def insert_rows(conn: sqlite3.Connection, chain: Chain, rows: Sequence[Sequence[Any]]) -> None:
    """``rows`` (each ``Chain.columns``' values) inserted in their order, as ``executemany(chain.sq_insert, rows)``
    inserts them, in a few statements: as many as ``Chain.rows_per_insert`` in each, the rest in powers of two (so
    that a connection compiles a handful of statements, never one per batch size)."""
    most, at = chain.rows_per_insert(conn), 0
    while at < len(rows):
        n = min(most, 1 << ((len(rows) - at).bit_length() - 1))
        conn.execute(chain.sq_insert_rows(n), list(itertools.chain.from_iterable(rows[at:at + n])))
        at += n


def _sqlite_new_head(conn: Any, chain: Chain, scope: str) -> tuple[int, str]:
    """A scope's first batch (or its chain's row gone): its head where its entries end, else at the start."""
    last = conn.execute(chain.sq_last, (scope,)).fetchone()
    first = conn.execute(chain.sq_first, (scope,)).fetchone()
    head = (int(last[0]), str(last[1])) if last is not None else (0, GENESIS)
    anchor = (int(first[0]), str(first[1])) if first is not None else (1, GENESIS)
    conn.execute(chain.sq_new_head, (scope, *head, *anchor))
    return head


async def pg_append(drv: Any, chain: Chain, entries: Sequence[Prepared], known: set[str], also: Also = ()) -> None:
    """On an asyncpg connection: ``entries`` placed after their scopes' heads (locked ``FOR UPDATE`` in the
    scopes' order), copied, and the heads moved, in one transaction; ``also`` run in it after them. A scope's
    row is made first, on its own (``known``: the scopes this store has seen made), so that no transaction waits
    for a new row while it holds another's lock."""
    scopes = sorted({values[0] for values, _ in entries})
    for _ in (1, 2):
        missing = [s for s in scopes if s not in known]
        if missing:
            await drv.execute(chain.pg_new_heads, missing, GENESIS)
            known.update(missing)
        async with drv.transaction():
            locked = await drv.fetch(chain.pg_lock_heads, scopes)
            heads: Heads = {r[0]: (int(r[1]), str(r[2])) for r in locked}
            if len(heads) < len(scopes):  # (a chain's row deleted meanwhile, by hand: made again, once)
                known.difference_update(scopes)
                continue
            rows, moved = place(entries, heads)
            await drv.copy_records_to_table(chain.attempts, records=rows, columns=chain.columns)
            names = list(moved)
            await drv.execute(chain.pg_move, names, [moved[s][0] for s in names], [moved[s][1] for s in names])
            for sql, params in also:
                await drv.executemany(sql, params)
            return
    raise LookupError(f"the ledger's chain rows of {scopes} vanished while the entries were written")


# -- the sweep: each chain cut at its start, its anchor moved in the same transaction ----------------------------


@contextlib.asynccontextmanager
async def _writing(conn: AsyncConnection, sqlite: bool) -> Any:
    """A transaction on ``conn`` (autocommit) that writes. SQLite: ``BEGIN IMMEDIATE``, the write lock from its
    start, so that what it reads stays so until it commits. Postgres: its statements' row locks (``FOR UPDATE``)."""
    if not sqlite:
        tx = await conn.execution_options(isolation_level="READ COMMITTED")
        async with tx.begin():
            yield tx
        return
    await conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.exec_driver_sql("ROLLBACK")
        raise
    await conn.exec_driver_sql("COMMIT")


async def sweep(executor: Executor, chain: Chain, batch: int,
                paced: Callable[[Callable[[int], Awaitable[int]], int], Awaitable[int]]) -> int:
    """Delete ledger entries past their retention, in paced batches: those written before the store had a chain,
    and each chain's expired start, its anchor moved with each cut. Reads no row when nothing is to delete."""
    sqlite = executor.dialect.name == "sqlite"

    async def probe(conn: AsyncConnection) -> list[str | None]:
        return [r[0] for r in await conn.execute(chain.to_sweep)]

    found = await executor.run("sweeping the attempt ledger", probe, body_ran=None)
    total = 0
    if None in found:

        async def unchained(size: int) -> int:
            async def one(conn: AsyncConnection) -> int:
                return int((await conn.execute(chain.sweep_unchained, {"batch": size})).rowcount or 0)

            return await executor.run("sweeping the attempt ledger", one, body_ran=None)

        total += await paced(unchained, batch)
    for scope in sorted(s for s in found if s is not None):

        async def cut(size: int, scope: str = scope) -> int:
            async def one(conn: AsyncConnection) -> int:
                async with _writing(conn, sqlite) as tx:
                    anchored = chain.anchor if sqlite else chain.anchor_for_update  # (SQLite: locked already)
                    got = (await tx.execute(anchored, {"scope": scope})).first()
                    if got is None:
                        return 0
                    anchor_seq = int(got[0])
                    window = [tuple(r) for r in await tx.execute(
                        chain.window, {"scope": scope, "anchor_seq": anchor_seq, "size": size})]
                    where = cut_at(window)
                    if where is None:
                        return 0
                    _, upto, anchor = where
                    params = {"scope": scope, "anchor_seq": anchor_seq, "upto": upto}
                    deleted = int((await tx.execute(chain.cut, params)).rowcount or 0)
                    await tx.execute(chain.move_anchor, {"scope": scope, "upto": upto, "anchor": anchor})
                    return deleted

            return await executor.run("sweeping the attempt ledger's chain", one, body_ran=None)

        total += await paced(cut, batch)
    return total


# -- verifying ---------------------------------------------------------------------------------------------------

PAGE = 2000  # entries read per statement while walking a chain


@contextlib.asynccontextmanager
async def _snapshot(conn: AsyncConnection, sqlite: bool) -> Any:
    """A read-only transaction that sees the store as it was at its first read (a sweep or a writer committing
    meanwhile changes nothing it sees). SQLite: a deferred ``BEGIN`` (WAL: a reader's snapshot); Postgres:
    REPEATABLE READ."""
    if not sqlite:
        tx = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with tx.begin():
            yield tx
        return
    await conn.exec_driver_sql("BEGIN")
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            await conn.exec_driver_sql("COMMIT")


async def verify(executor: Executor, chain: Chain, scope: str | None = None) -> list[ChainCheck]:
    """Walk every chain (or ``scope``'s), in one snapshot: a :class:`ChainCheck` per scope that has entries or a
    chain, in the scopes' order."""
    sqlite = executor.dialect.name == "sqlite"

    async def run(conn: AsyncConnection) -> list[ChainCheck]:
        async with _snapshot(conn, sqlite) as tx:
            heads = {r[0]: (int(r[1]), str(r[2]), int(r[3]), str(r[4]))
                     for r in await tx.execute(chain.heads, {"scope": scope})}
            census = {r[0]: (int(r[1]), int(r[2])) for r in await tx.execute(chain.census, {"scope": scope})}
            out = []
            for s in sorted(heads.keys() | census.keys()):
                chained, unchained = census.get(s, (0, 0))
                head = heads.get(s)
                if head is None:
                    if chained:
                        out.append(ChainCheck(s, 0, None, None, "", unchained, f"scope {s!r} has {chained} chained "
                                              "entries but no chain row: the chain's head was deleted", None, None))
                    else:
                        out.append(ChainCheck(s, 0, None, None, "", unchained))
                    continue
                out.append(await _walk(tx, chain, s, head, unchained))
            return out

    return await executor.run("verifying the attempt ledger", run, body_ran=None)


async def _walk(conn: AsyncConnection, chain: Chain, scope: str, head: tuple[int, str, int, str],
                unchained: int) -> ChainCheck:
    head_seq, head_digest, anchor_seq, anchor = head
    walk = Walk(scope, anchor_seq, anchor, head_seq, head_digest)
    after, going = 0, True
    while going:
        page = list(await conn.execute(chain.page, {"scope": scope, "after": after, "page": PAGE}))
        for r in page:
            entry_id, seq = int(r[0]), int(r[1])
            if seq > head_seq:  # (placed after the head we read: impossible in one snapshot, unless edited)
                walk._fail(f"entry id={entry_id} (seq {seq}) is past the chain's head (seq {head_seq}): it was "
                           "inserted or moved, or the head was edited", entry_id, seq)
                going = False
                break
            if not walk.feed(entry_id, seq, r[2], r[3], tuple(r[4:])):
                going = False
                break
            after = seq
        else:
            going = len(page) == PAGE
    walk.end()
    if walk.problem is None and unchained:
        # Entries outside the chain are older than it (written before the store had one); one written after the
        # chain's first entry was inserted by hand, or by a process of an earlier version still writing.
        first = (await conn.execute(chain.first_id, {"scope": scope})).scalar()
        if first is not None:
            late = (await conn.execute(chain.late_unchained, {"scope": scope, "first": int(first)})).scalar()
            if late is not None:
                walk._fail(f"entry id={late} is not in the chain but was written after it began: inserted by hand, or "
                           "by a process of an earlier version", int(late), None)
    return walk.check(unchained)
