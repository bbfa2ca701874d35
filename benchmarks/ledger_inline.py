"""The ledger's entry written by the completion's own statement, measured against the ledger's writer (issue 34).

    python -m benchmarks.ledger_inline [--url URL] [--calls N] [--reps R]

Issue 34 asks whether a first call's ledger entry would cost less written by the completion's own statement than
by a second write, the writer's batches. This run answers it on Postgres with the raw driver (asyncpg, one
connection, ``synchronous_commit = off``, pinned to one CPU with its server as ``python -m benchmarks`` is), each
variant a first call's statements in slices taken in turn within every rep:

- the floor: the store's claim and completion (``SQLStore.sql``), as ``python -m benchmarks`` runs them;
- the entry in the completion's statement, not chained: a ``WITH`` that completes the record and inserts the
  entry (the least an inline entry can cost: no place in the chain, so nothing ``agentguard verify`` can check);
- the entry in the completion's statement, chained: the same statement also locks its scope's head (``FOR
  UPDATE``), places the entry after it, digests it as ``_chain.link`` does (SHA-256 on the server) and moves the
  head — one statement, no second write;
- the writer's batches as shipped: the floor's statements, and every 500 entries ``write_attempts`` of a real
  ``SQLStore`` (the entries' form and hashes, the heads locked, a ``COPY``, the heads moved);
- the writer's batches without the chain: the same ``COPY`` of 500 entries, no heads, no hashes.

Each variant's entries are checked before the report: every call left its entry, and the chained ones verify
(``verify_ledger``). What the report gives is each variant's µs a call and what it adds to the floor.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from agentguard._ledger import BATCH
from agentguard.stores import SQLStore
from agentguard.stores._attempts import ATTEMPTS, RAN, WRITTEN
from agentguard.stores._chain import CHAINS, GENESIS, entry_hash, normalised

from ._common import fake_key, observe, run_id
from ._drivers import dsn_of, positional, postgres_script


class Variants:
    """One connection, the store's statements and the inline ones, and the entries each variant wrote."""

    def __init__(self, conn: asyncpg.Connection, store: SQLStore, obs: Any, rid: str) -> None:
        self.conn, self.store, self.obs, self.rid = conn, store, obs, rid
        sql = store.sql
        self.convert = positional()
        self.claim = str(sql.claim.text)
        self.complete = complete = str(sql.complete.text)
        # The entry by the completion's statement: its values after the completion's own parameters.
        done, tail = complete.split(" SELECT fence, CASE", 1)
        values = ("done.scope, done.key, CAST(:task_id AS text), CAST(:operation AS text), CAST(:tool AS text), 'ran',"
                  " 'succeeded', 1, NULL, CAST(:process AS text), CAST(:at AS float8), CAST(:guard_ms AS float8),"
                  " CAST(:wait_ms AS float8), CAST(:at AS float8) + CAST(:retention AS float8)")
        columns = ", ".join(WRITTEN)
        self.inline = (f"{done}, entry AS (INSERT INTO {ATTEMPTS} ({columns}) SELECT {values} FROM done)"
                       f" SELECT fence, CASE{tail}")
        head = f"head AS (SELECT seq, digest FROM {CHAINS} WHERE scope = :scope FOR UPDATE)"
        chained = (f"entry AS (INSERT INTO {ATTEMPTS} ({columns}, seq, prev, digest) SELECT {values}, head.seq + 1,"
                   " head.digest, encode(sha256(convert_to(head.digest || ':' || (head.seq + 1) || ':'"
                   " || CAST(:hashed AS text), 'UTF8')), 'hex') FROM done, head RETURNING seq, digest),"
                   f" moved AS (UPDATE {CHAINS} AS c SET seq = entry.seq, digest = entry.digest FROM entry"
                   " WHERE c.scope = :scope)")
        self.inline_chained = f"WITH {head}, {done[len('WITH '):]}, {chained} SELECT fence, CASE{tail}"
        self.pending: dict[str, list[tuple[Any, ...]]] = {}
        self.keys: dict[str, list[str]] = {}  # each variant's keys (its entries are checked against them)

    async def fetch(self, sql: str, params: dict[str, Any]) -> Any:
        text, args = self.convert(sql)
        return await self.conn.fetch(text, *args(params))

    def scope(self, name: str) -> str:
        return f"inline-{self.rid}-{name}"

    async def first(self, name: str, i: int, rep: int, how: str) -> None:
        """A first call's claim and completion in scope ``name``; its entry written ``how``."""
        obs = self.obs
        scope, key, fence = self.scope(name), fake_key(self.rid, name, rep, i), secrets.randbits(62)
        started = time.time()
        c = {**obs.claim, "scope": scope, "key": key, "fence": fence}
        await self.fetch(self.claim, c)
        p = {**obs.complete, "scope": scope, "key": key, "fence": fence, "result": '{"ok":1}'}
        at = time.time()
        # The entry (the values of WRITTEN), as the writer would queue it: passed to the inline statements, or queued.
        entry = (scope, key, c["task_id"], c["operation"], c["tool"], RAN, "succeeded", 1, None, "bench:1", at,
                 1000 * (at - started), 0.0, at + p["retention"])
        if how == "none" or how.startswith("batch"):
            got = await self.fetch(self.complete, p)
        else:
            p.update(task_id=entry[2], operation=entry[3], tool=entry[4], process=entry[9], at=at, guard_ms=entry[11],
                     wait_ms=entry[12])
            if how == "chained":
                p["hashed"] = entry_hash(normalised(entry))
            got = await self.fetch(self.inline if how == "inline" else self.inline_chained, p)
        if not got:
            raise AssertionError(f"{name}: the completion found no record")
        self.keys.setdefault(name, []).append(key)
        if how.startswith("batch"):
            rows = self.pending.setdefault(name, [])
            rows.append(entry)
            if len(rows) >= BATCH:
                await self.flush(name, how)

    async def flush(self, name: str, how: str) -> None:
        rows, self.pending[name] = self.pending.get(name, []), []
        if not rows:
            return
        if how == "batch":
            if await self.store.write_attempts(rows):
                raise AssertionError("the store left entries out")
        else:
            await self.conn.copy_records_to_table(ATTEMPTS, records=rows, columns=list(WRITTEN))

    async def check(self, chained: dict[str, bool]) -> None:
        """Every call left one entry; the chained variants' chains verify."""
        for name, keys in self.keys.items():
            rows = await self.conn.fetch(f"SELECT key FROM {ATTEMPTS} WHERE scope = $1", self.scope(name))
            written = sorted(r[0] for r in rows)
            if name != "floor" and written != sorted(keys):
                raise SystemExit(f"benchmarks.ledger_inline: {name} wrote {len(written)} entries for {len(keys)} calls")
            if chained.get(name):
                (check,) = await self.store.verify_ledger(self.scope(name))
                if not check.ok or check.entries != len(keys):
                    raise SystemExit(f"benchmarks.ledger_inline: {name}'s chain: {check}")


VARIANTS = {  # label: (scope name, how its entry is written, chained)
    "floor: claim + complete (no entry)": ("floor", "none", False),
    "entry in the completion's statement, not chained": ("inline", "inline", False),
    "entry in the completion's statement, chained": ("chained", "chained", True),
    "the writer's batches as shipped (chained)": ("batch", "batch", True),
    "the writer's batches, COPY only (not chained)": ("copy", "batch-copy", False),
}


async def measure(url: str, calls: int, reps: int, warmup: int, slices: int = 8) -> dict[str, list[float]]:
    """Every variant's µs per call, one value per rep (a rep's batches flushed inside it)."""
    obs = await observe(url, {})
    store = SQLStore(url)
    conn = await asyncpg.connect(dsn_of(url))
    v = Variants(conn, store, obs, run_id())
    try:
        for name, _, chained in VARIANTS.values():
            if chained:  # (the heads made once, as the writer does on a scope's first batch)
                await conn.execute(f"INSERT INTO {CHAINS} (scope, seq, digest, anchor_seq, anchor)"
                                   " VALUES ($1, 0, $2, 1, $2) ON CONFLICT (scope) DO NOTHING", v.scope(name), GENESIS)
        steps: dict[str, Callable[[int, int], Awaitable[None]]] = {
            label: (lambda i, rep, name=name, how=how: v.first(name, i, rep, how))
            for label, (name, how, _) in VARIANTS.items()
        }
        for label, step in steps.items():
            for i in range(warmup):
                await step(i, -1)
            await v.flush(VARIANTS[label][0], VARIANTS[label][1])
        out: dict[str, list[float]] = {label: [] for label in steps}
        for rep in range(reps):
            spent = dict.fromkeys(steps, 0.0)
            order = list(steps)[rep % len(steps):] + list(steps)[:rep % len(steps)]
            for s in range(slices):
                for label in order:
                    name, how, _ = VARIANTS[label]
                    started = time.perf_counter()
                    for i in range(s * calls // slices, (s + 1) * calls // slices):
                        await steps[label](i, rep)
                    if s == slices - 1:
                        await v.flush(name, how)
                    spent[label] += time.perf_counter() - started
            for label, total in spent.items():
                out[label].append(1e6 * total / calls)
        await v.check({name: chained for name, _, chained in VARIANTS.values()})
        return out
    finally:
        await conn.close()
        await store.dispose()


def report(out: dict[str, list[float]]) -> str:
    floor = out[next(iter(VARIANTS))]
    lines = [f"{'variant':52} {'µs/call':>9} {'+ over the floor':>17} {'÷ floor':>8}", "-" * 90]
    for label, values in out.items():
        added = [a - b for a, b in zip(values, floor, strict=True)]
        ratios = [a / b for a, b in zip(values, floor, strict=True)]
        lines.append(f"{label:52} {statistics.median(values):9.1f} {statistics.median(added):+14.1f} µs "
                     f"{statistics.median(ratios):7.3f}× (reps {min(ratios):.3f}–{max(ratios):.3f})")
    return "\n".join(lines)


if __name__ == "__main__":
    postgres_script("ledger_inline", __doc__ or "", "agentguard_ledger_inline", measure, report, calls=2000,
                    warmup=500, what="first calls")
