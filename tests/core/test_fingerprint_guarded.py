"""Fingerprints through real guarded calls, on both stores: values the old canonical form could not tell
apart are a reuse error, the documented equivalences replay, and arguments or results that have no
canonical form are refused with an error naming them (never a UnicodeEncodeError or a RecursionError).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from agentguard import Guard, GuardError, KeyReuseError, task

from conftest import tid

MAX_DEPTH = 100  # the documented limit (README: "nesting deeper than 100 levels")

pytestmark = pytest.mark.anyio


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass
class Refund:
    charge: str
    cents: int


class Payee(BaseModel):
    iban: str


UTC_NOON = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)
BIG = dt.timedelta(days=10**8)

# Unequal values: a reuse error, never a replay. All but the last four pairs collided before every type had a
# tag (the second call silently replayed the first's result).
DISTINCT: list[tuple[Any, Any]] = [
    ({1, 2}, ["1", "2"]),
    ({1: "a"}, {"1": "a"}),
    ({True: "a"}, {"true": "a"}),
    (b"x", {"$bytes": "eA=="}),
    (Decimal("1.5"), {"$decimal": "1.5"}),
    ({1, 2}, {"$set": [1, 2]}),
    (uuid.UUID(int=5), "00000000-0000-0000-0000-000000000005"),
    (Colour.RED, "red"),
    (Level.LOW, 1),
    (UTC_NOON, UTC_NOON.isoformat()),
    (UTC_NOON, UTC_NOON.replace(tzinfo=None)),
    (Refund("ch_1", 5), {"charge": "ch_1", "cents": 5}),
    (Payee(iban="DE02"), {"iban": "DE02"}),
    (Decimal("1.00000000000000000000000000001"), Decimal("1")),
    (BIG + dt.timedelta(microseconds=1), BIG),
    (Decimal("1.5"), 1.5),
    (Decimal("1"), 1),
    (True, 1),
    ({"$x": 1}, {"$$x": 1}),
]

# The documented equivalences: the second call replays the first.
EQUIVALENT: list[tuple[Any, Any]] = [
    ((1, "a"), [1, "a"]),
    (1.0, 1),
    (-0.0, 0.0),
    (Decimal("1.50"), Decimal("1.5")),
    ({1, 9, "a"}, frozenset({"a", 9, 1})),
    (b"x", bytearray(b"x")),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    (UTC_NOON, UTC_NOON.replace(tzinfo=dt.timezone(dt.timedelta(0), "Z"))),
]


async def test_values_that_used_to_collide_are_a_reuse_error(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def record(value: Any) -> int:
        nonlocal runs
        runs += 1
        return runs

    for a, b in DISTINCT:
        for first, second in ((a, b), (b, a)):
            with task(tid()):
                await record(first)
                with pytest.raises(KeyReuseError) as info:
                    await record(second)
            assert info.value.differing == ("value",), (first, second)
    assert runs == 2 * len(DISTINCT)  # each second call refused, not replayed and not run


async def test_documented_equivalences_replay(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0

    @guard.once
    async def record(value: Any) -> int:
        nonlocal runs
        runs += 1
        return runs

    for a, b in EQUIVALENT:
        with task(tid()):
            assert await record(a) == await record(b) == runs
    assert runs == len(EQUIVALENT)


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


async def test_arguments_without_a_canonical_form_are_named_and_nothing_runs(
    make_guard: Callable[..., Guard],
) -> None:
    guard = make_guard()
    runs = 0

    @guard.once(key=["order_id"])
    async def charge(order_id: str, memo: Any = "") -> None:
        nonlocal runs
        runs += 1

    @guard.once(key=["order_id"])
    def charge_sync(order_id: str, memo: Any = "") -> None:
        nonlocal runs
        runs += 1

    @guard.once(key=["order_id"], ignore=["order_id"])  # a key field left out of the fingerprint
    async def refund(order_id: str) -> None:
        nonlocal runs
        runs += 1

    loop: list[Any] = []
    loop.append({"parent": loop})
    surrogate = r"argument 'memo' cannot be fingerprinted: it contains a lone surrogate \(not valid Unicode text\)"
    with task(tid()):
        for memo in ("\ud800", "ok \udc00", ["\ud800"], {"k\ud800": 1}, {1: "\udfff"}):
            with pytest.raises(TypeError, match=surrogate):
                await charge("o-1", memo)  # a str takes the one-pass (flat) identity; the others the general one
            with pytest.raises(TypeError, match=surrogate):
                charge_sync("o-1", memo)
        with pytest.raises(TypeError, match=r"argument 'order_id' .*lone surrogate"):
            await charge("o-\ud800")  # a key field
        with pytest.raises(TypeError, match=r"key field 'order_id' of 'refund' .*lone surrogate"):
            await refund("o-\ud800")
        with pytest.raises(TypeError, match=rf"argument 'memo' .*nested more than {MAX_DEPTH} levels deep"):
            await charge("o-1", _nested(1000))
        with pytest.raises(TypeError, match=r"argument 'memo' cannot be fingerprinted: it refers to itself"):
            await charge("o-1", loop)
        with pytest.raises(TypeError, match=r"argument 'memo' cannot be fingerprinted: it refers to itself"):
            charge_sync("o-1", loop)

        async def body(key: str) -> None:
            nonlocal runs
            runs += 1

        with pytest.raises(TypeError, match=surrogate):
            await guard.run("send", body, arguments={"memo": "\ud800"})
        with pytest.raises(TypeError, match=r"key field 'to' of 'send' .*lone surrogate"):
            await guard.run("send", body, key={"to": "\ud800"})
        with pytest.raises(TypeError, match=r"argument name '\\udc00' .*lone surrogate"):
            await guard.run("send", body, arguments={"\udc00": 1})
        assert await charge("o-1", _nested(MAX_DEPTH)) is None  # at the limit: fine
    assert runs == 1
    assert len(await guard.records()) == 1


async def test_results_that_cannot_be_stored_are_a_guard_error(make_guard: Callable[..., Guard]) -> None:
    guard = make_guard()
    runs = 0
    loop: list[Any] = []
    loop.append(loop)

    @guard.once
    async def untyped(kind: str):  # type: ignore[no-untyped-def]
        nonlocal runs
        runs += 1
        return {"surrogate": "\ud800", "key": {"k\udfff": 1}, "deep": _nested(5000), "loop": loop}[kind]

    @guard.once
    async def typed(kind: str) -> list[Any]:
        nonlocal runs
        runs += 1
        return {"surrogate": ["\ud800"], "deep": _nested(5000), "loop": loop}[kind]

    @guard.once
    def typed_sync(kind: str) -> str:
        nonlocal runs
        runs += 1
        return "\ud800"

    why = {"surrogate": "lone surrogate", "key": "lone surrogate", "deep": "nested too deeply",
           "loop": "refers to itself"}
    calls = 0
    for tool, kinds in ((untyped, why), (typed, ["surrogate", "deep", "loop"])):
        for kind in kinds:
            with task(tid()), pytest.raises(GuardError, match=rf"could not be stored \(.*{why[kind]}"):
                calls += 1
                await tool(kind)
    with task(tid()), pytest.raises(GuardError, match=r"could not be stored \(.*lone surrogate"):
        calls += 1
        typed_sync("surrogate")
    assert runs == calls  # each body ran once; its result was refused cleanly, not passed to the store


async def test_pandas_and_numpy_values_are_exact_or_refused(make_guard: Callable[..., Guard]) -> None:
    """Timedeltas a nanosecond apart were one value (the second call replayed the first's result): now a reuse
    error; a whole-microsecond Timedelta or Timestamp is the timedelta or datetime it equals; what numpy or
    pandas holds that the canonical form does not know exactly is refused, naming the argument."""
    pd = pytest.importorskip("pandas")
    np = pytest.importorskip("numpy")
    guard = make_guard()
    runs = 0

    @guard.once
    async def record(value: Any) -> int:
        nonlocal runs
        runs += 1
        return runs

    distinct = [
        (pd.Timedelta(1, "ns"), pd.Timedelta(2, "ns")),
        (pd.Timedelta(1001, "ns"), pd.Timedelta(1002, "ns")),
        (pd.Timedelta(1001, "ns"), dt.timedelta(microseconds=1)),
        (pd.Timestamp("2026-01-02T03:04:05.000000001"), pd.Timestamp("2026-01-02T03:04:05.000000002")),
        (pd.Timestamp("2026-01-02T03:04:05.000001", tz="UTC"), pd.Timestamp("2026-01-02T03:04:05.000001")),
    ]
    for a, b in distinct:
        with task(tid()):
            await record(a)
            with pytest.raises(KeyReuseError):
                await record(b)
    assert runs == len(distinct)

    equal = [
        (pd.Timedelta(3, "us"), dt.timedelta(microseconds=3)),
        (pd.Timestamp("2026-01-02T03:04:05.000006", tz="UTC"), dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)),
        (np.float64(0.25), 0.25),
        (np.str_("o-1"), "o-1"),
    ]
    for a, b in equal:
        with task(tid()):
            assert await record(a) == await record(b) == runs
    assert runs == len(distinct) + len(equal)

    for value in (pd.NaT, np.int64(1), np.bool_(True), np.float32(0.5), np.array([1, 2]), np.datetime64("2026-01-02")):
        with task(tid()), pytest.raises(TypeError, match=r"argument 'value' cannot be fingerprinted"):
            await record(value)
    assert runs == len(distinct) + len(equal)  # nothing refused ran
