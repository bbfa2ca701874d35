"""The guard's own Python work, with no I/O at all.

Two ways, so neither hides anything:

- the whole decorated call (bind, fingerprint, key, context, state machine, heartbeat task, codec, events)
  over an in-memory store that answers every statement at once: ``no-I/O guard`` rows;
- the pure pieces timed alone: ``_Spec.call`` (bind + fingerprint + key), the codec's encode + decode, and
  ``with task(...)``.

The stand-in store follows the store's current contract (``claim`` returns our fence, or the existing
record); its records are copies of a real record read from a real store, so new fields come along. When
the guard or the store changes shape, these rows print "n/a" with the reason instead of a wrong number.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentguard import Guard, task

from . import _common as c
from ._harness import Stat, Unavailable, Variant, run_group

Log = Callable[[str], None]


class NoIOStore:
    """Answers the guard's statements from a dict, immediately, doing as little as it can: a claim keeps the
    claim's own parameters, a completion keeps (parameters, state, result), and a record is built only when
    a claim meets an existing row (``finish()`` builds them all up front, outside the timed loop)."""

    memory = False

    def __init__(self, real: Any, template: Any, rows: dict[tuple[str, str], Any]) -> None:
        self._real, self.rows = real, rows
        self._cls = type(template)
        self._base = _fields_of(template)
        self.backend, self.url = real.backend, real.url

    def _record(self, entry: Any) -> Any:
        params, state, result = entry if isinstance(entry, tuple) else (entry, "running", None)
        return self._cls(**{
            **self._base, "scope": params["scope"], "key": params["key"], "state": state, "fence": params["fence"],
            "fingerprint": params["fingerprint"], "arg_hashes": params["arg_hashes"], "result": result,
            "attempts": 1, "owner": params["owner"] if result is None else None, "task_id": params["task_id"],
            "operation": params["operation"], "live": result is None, "expired": False,
        })

    def finish(self) -> None:
        for k, entry in self.rows.items():
            if not isinstance(entry, self._cls):
                self.rows[k] = self._record(entry)

    async def claim(self, params: dict[str, Any]) -> Any:
        k = (params["scope"], params["key"])
        entry = self.rows.get(k)
        if entry is None:
            self.rows[k] = params
            return params["fence"]
        if not isinstance(entry, self._cls):
            entry = self.rows[k] = self._record(entry)
        return entry

    async def read(self, scope: str, key: str) -> Any:
        return self.rows.get((scope, key))

    async def complete(self, scope: str, key: str, fence: int, state: str, result: str, retention: float) -> bool:
        k = (scope, key)
        self.rows[k] = (self.rows[k], state, result)
        return True

    async def release(self, scope: str, key: str, fence: int, retention: float) -> bool:
        return True

    async def renew(self, scope: str, key: str, fence: int, lease: float) -> bool:
        return True

    async def take_over(self, params: dict[str, Any]) -> int | None:
        return None

    async def ensure_schema(self) -> None:
        return None

    async def dispose(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if callable(value):
            raise AttributeError(f"the no-I/O stand-in has no {name}(): the store's interface changed")
        return value


def _fields_of(record: Any) -> dict[str, Any]:
    if hasattr(record, "_asdict"):  # a NamedTuple
        return dict(record._asdict())
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


async def _template(path: Path) -> Any:
    """A real completed record, read back from a real (SQLite) store."""
    from agentguard.stores import SQLStore

    url = f"sqlite+aiosqlite:///{path}"
    g = Guard(url, sqlite_synchronous="OFF")
    tool = c.guarded(g, c.Body())
    with task("template"):
        await tool("o-template", c.AMOUNT)
    await g.aclose()
    store = SQLStore(url)
    try:
        rec = await store.read(c.SCOPE, _only_key(path))
    finally:
        await store.dispose()
    if rec is None:
        raise Unavailable("could not read back a record to model the stand-in's records on")
    return rec, store


def _only_key(path: Path) -> str:
    import sqlite3

    with sqlite3.connect(path) as conn:
        return str(conn.execute("SELECT key FROM agentguard_calls LIMIT 1").fetchone()[0])


async def overhead(tmp: Path, *, n: int, reps: int, warmup: int, log: Log) -> tuple[dict[str, Stat], list[str]]:
    notes: list[str] = []
    try:
        template, real = await _template(tmp / "template.db")
    except Exception as exc:
        return {"no-I/O guard": Stat("no-I/O guard", unavailable=f"cannot build the stand-in store: {exc!r}")}, notes
    rows: dict[tuple[str, str], Any] = {}
    url = f"sqlite+aiosqlite:///{tmp / 'template.db'}"
    guards: list[Guard] = []
    stores: list[NoIOStore] = []

    def stub_guard() -> Guard:
        g = Guard(url)
        if not hasattr(g, "_store"):
            raise Unavailable("Guard no longer keeps its store in ._store")
        g._store = store = NoIOStore(real, template, rows)  # type: ignore[assignment]
        stores.append(store)
        guards.append(g)
        return g

    orders = [f"o-{i}" for i in range(max(n, warmup, 256))]
    tids: dict[str, str] = {}
    plain = c.Body()

    async def unguarded(i: int) -> None:
        await plain(orders[i], c.AMOUNT, "ag_" + "0" * 48)

    tools: dict[str, Any] = {}
    bodies: dict[str, c.Body] = {}

    def stubbed(name: str) -> Callable[[int, int], Any]:
        async def prepare(rep: int, k: int) -> None:
            if rep == -1:
                try:
                    bodies[name] = body = c.Body()
                    tools[name] = c.guarded(stub_guard(), body)
                    if name != "first":
                        tools["pop"] = c.guarded(stub_guard(), c.Body())
                    with task("probe-" + name):
                        await tools[name]("probe", c.AMOUNT)
                        await tools[name]("probe", c.AMOUNT)
                except Unavailable:
                    raise
                except Exception as exc:
                    raise Unavailable(f"the guard does not run over the no-I/O stand-in store: {exc!r}") from None
            tids[name] = tid = f"{name}-{rep}"
            if name == "replay":
                tools["replay-guard"] = c.guarded(stub_guard(), bodies[name])  # a cold cache every rep
                with task(tid):
                    for i in range(k):
                        await tools["pop"](orders[i], c.AMOUNT)
                stores[-1].finish()
            if name == "cached":
                with task(tid):
                    for _ in range(2):
                        for i in range(min(k, 256)):
                            await tools[name](orders[i], c.AMOUNT)

        return prepare

    async def first(i: int) -> None:
        with task(tids["first"]):
            await tools["first"](orders[i], c.AMOUNT)

    async def replay(i: int) -> None:
        with task(tids["replay"]):
            await tools["replay-guard"](orders[i], c.AMOUNT)

    async def cached(i: int) -> None:
        with task(tids["cached"]):
            await tools["cached"](orders[i % 256], c.AMOUNT)

    # The pure pieces, through the decorator's own spec object.
    piece_guard = Guard(url)
    guards.append(piece_guard)
    piece_tool = c.guarded(piece_guard, c.Body())
    spec: Any = getattr(piece_tool, "__agentguard__", None)
    value = await c.Body()("o-1", c.AMOUNT, "ag_" + "1" * 48)

    # _Spec.call on arguments it has not seen (so the identity is computed, not served from the tool's
    # memo), in a task entered once per rep: the context's own cost is the "with task(...)" piece.
    piece_orders: list[str] = []
    piece_ctx: list[contextvars.Context] = []

    async def piece_spec(i: int) -> None:
        piece_ctx[0].run(spec.call, (piece_orders[i], c.AMOUNT), {})

    store = getattr(spec.codec, "store", None)  # encode + decode as the guard does it, in one step

    async def piece_codec(i: int) -> None:
        if store is not None:
            store(value)
        else:
            spec.codec.decode(spec.codec.encode(value))

    async def piece_task(i: int) -> None:
        with task("pieces"):
            pass

    async def need_spec(rep: int, k: int) -> None:
        if rep == -1:
            try:
                with task("pieces"):
                    spec.call(("o-1", c.AMOUNT), {})
                spec.codec.decode(spec.codec.encode(value))
            except Exception as exc:
                raise Unavailable(f"the decorator's spec changed shape: {exc!r}") from None

    async def fresh_spec(rep: int, k: int) -> None:
        await need_spec(rep, k)
        piece_orders[:] = [f"p-{rep}-{i}" for i in range(k)]
        ctx = contextvars.copy_context()
        ctx.run(task(f"pieces-{rep}").__enter__)
        piece_ctx[:] = [ctx]

    async def empty(i: int) -> None:
        return None

    variants = [
        Variant("harness: an empty call", empty, note="the harness's own cost per call, taken off each piece"),
        Variant("unguarded call", unguarded),
        Variant("no-I/O guard: first call", first, stubbed("first"), "whole call, in-memory store"),
        Variant("no-I/O guard: replay", replay, stubbed("replay"), "whole call, cache miss"),
        Variant("no-I/O guard: cached replay", cached, stubbed("cached")),
        Variant("piece: bind + fingerprint + key (_Spec.call)", piece_spec, fresh_spec),
        Variant("piece: codec encode + decode", piece_codec, need_spec),
        Variant("piece: with task(...)", piece_task),
    ]
    try:
        stats = await run_group(variants, n=n, reps=reps, warmup=warmup, log=log)
    finally:
        for g in guards:
            await g.aclose()
    return stats, notes
