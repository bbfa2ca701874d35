"""Shortcuts beside their general paths (docs/architecture.md, "Executors and shortcuts"): each must give exactly
what the general spelling gives, on random inputs, mistakes included.

- ``Binder.bind`` against ``inspect.Signature.bind`` and ``apply_defaults``;
- ``flat_call`` against ``make_call``: the whole ``Call``;
- ``_stdlib_shims``' ``encoder`` and ``scan_plain`` against ``json``;
- a record kept by the in-process replay cache against the record the store keeps.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import random
import string
from collections.abc import Callable
from typing import Any

import pytest

from agentguard import Guard, task
from agentguard._binder import Binder
from agentguard._calls import Call, flat_call, make_call
from agentguard._codec import Codec
from agentguard._keys_flat import FlatSignature
from agentguard._stdlib_shims import encoder, scan_plain

from conftest import tid

P = inspect.Parameter


def _outcome(fn: Callable[[], dict[str, Any]]) -> tuple[str, Any]:
    try:
        return "bound", fn()
    except TypeError as exc:
        return "refused", str(exc)


def _signature(rng: random.Random) -> inspect.Signature:
    """A random valid signature; most are named parameters only (the binder's own case), some are not."""
    params: list[P] = []
    names = iter(rng.sample(["a", "b", "c", "d", "e", "f", "g"], 7))
    if rng.random() < 0.15:
        params.append(P(next(names), P.POSITIONAL_ONLY))
    defaulted = False
    for _ in range(rng.randrange(4)):
        defaulted = defaulted or rng.random() < 0.4
        params.append(P(next(names), P.POSITIONAL_OR_KEYWORD, default=0 if defaulted else P.empty))
    if rng.random() < 0.15:
        params.append(P("args", P.VAR_POSITIONAL))
    for _ in range(rng.randrange(3)):
        params.append(P(next(names), P.KEYWORD_ONLY, default=rng.choice([P.empty, None])))
    if rng.random() < 0.15:
        params.append(P("kwargs", P.VAR_KEYWORD))
    return inspect.Signature(params)


@pytest.mark.storeless
def test_the_binder_binds_as_the_signature_does() -> None:
    """Every call, valid or not, on random signatures: the same arguments, defaults filled in, or the same
    ``TypeError`` (the binder hands every mistake to ``Signature.bind`` for its exact message)."""
    rng = random.Random(3)
    seen = {"bound": 0, "refused": 0, "by the binder": 0}
    for _ in range(3000):
        sig = _signature(rng)
        binder = Binder(sig)
        names = [n for n in sig.parameters if n not in ("args", "kwargs")]
        args = tuple(rng.randrange(100) for _ in range(rng.randrange(len(names) + 2)))
        kwargs = {n: rng.randrange(100) for n in rng.sample([*names, "zz"], rng.randrange(len(names) + 2))}

        def general(sig: inspect.Signature = sig, args: tuple[Any, ...] = args,
                    kwargs: dict[str, Any] = kwargs) -> dict[str, Any]:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments)

        def shortcut(binder: Binder = binder, args: tuple[Any, ...] = args,
                     kwargs: dict[str, Any] = kwargs) -> dict[str, Any]:
            return binder.bind(args, dict(kwargs))

        expected, got = _outcome(general), _outcome(shortcut)
        assert got == expected, (sig, args, kwargs)
        seen[expected[0]] += 1
        seen["by the binder"] += binder.simple and expected[0] == "bound"  # (not handed to Signature.bind)
    assert seen["bound"] > 300 and seen["refused"] > 500 and seen["by the binder"] > 200, seen


def _flat(rng: random.Random) -> Any:
    kind = rng.randrange(4)
    if kind == 0:
        return "".join(rng.choice(string.printable + "é€%$\"\\\u2028") for _ in range(rng.randrange(10)))
    if kind == 1:
        return rng.randrange(-(10**20), 10**20)
    return rng.choice([True, False, None, 0, 1, "$decimal", "%s"])


def _fields(call: Call) -> dict[str, Any]:
    return {"scope": call.scope, "task_id": call.task_id, "operation": call.operation, "key": call.key,
            "fp_args": dict(call.fp_args), "fingerprint": call.fingerprint, "codec": call.codec,
            "cache_errors": call.cache_errors, "on_conflict": call.on_conflict, "wait_timeout": call.wait_timeout,
            "tool": call.tool, "audit": call.audit, "arguments": call.arguments, "on_unknown": call.on_unknown,
            "arg_hashes": call.arg_hashes, "arg_hashes_json": call.arg_hashes_json, "waited": call.waited}


@pytest.mark.storeless
def test_a_flat_call_is_the_call_make_call_builds() -> None:
    """A call whose arguments are all str/int/bool/None, built by the flat shortcut and by the general path, in
    random tasks and scopes: every field of the two ``Call`` objects the same."""
    rng = random.Random(5)
    codec, errors = Codec(Any), (ValueError,)
    for _ in range(1000):
        names = sorted({"".join(rng.choice("abé_%$\"") for _ in range(rng.randrange(1, 4)))
                        for _ in range(rng.randrange(5))})
        key_fields = [n for n in names if rng.random() < 0.4]
        sig = FlatSignature("charge", names, key_fields)
        arguments = {n: _flat(rng) for n in names}
        values = sig.values(arguments)
        assert values is not None
        scope = rng.choice(["default", "acct_42", "é%"])
        with task(rng.choice(["t-1", "ticket 8812", "%s"]), scope=scope):
            fast = flat_call(sig, values, arguments, codec, errors, "wait", 5.0)
            general = make_call("charge", arguments, {n: arguments[n] for n in key_fields} or None, None, None,
                                codec, errors, "wait", 5.0)
        assert _fields(fast) == _fields(general), arguments


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return "".join(rng.choice(string.printable + "é€\u2028\"\\\x00") for _ in range(rng.randrange(8)))
    if kind == 1:
        return rng.randrange(-(10**30), 10**30)
    if kind == 2:
        return rng.choice([True, False, None, 0.0, -0.0, 1e300, float("nan"), float("inf"), -float("inf")])
    if kind == 3:
        return rng.random() * 10 ** rng.randrange(-10, 20)
    if kind == 4:
        return rng.choice([{1, 2}, b"x", object()])  # no JSON form: refused (or given to ``default``)
    if kind in (5, 6):
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return tuple(_json_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {rng.choice(["a", "b", "é", "$ag", 1, 2.5, True, None]): _json_value(rng, depth + 1) for _ in range(3)}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.storeless
def test_the_stdlib_shims_give_the_standard_librarys_results() -> None:
    """``encoder`` writes what ``json.JSONEncoder`` with the same options writes (and refuses what it refuses),
    ``scan_plain`` reads what ``json.loads`` reads."""
    rng = random.Random(7)
    options = [{"sort_keys": s, "ensure_ascii": a, "allow_nan": n, "default": d}
               for s in (False, True) for a in (False, True) for n in (False, True) for d in (None, repr)]
    fast = [encoder(**o) for o in options]  # type: ignore[arg-type]
    general = [json.JSONEncoder(separators=(",", ":"), **o).encode for o in options]  # type: ignore[arg-type]
    written = refused = 0
    for _ in range(2000):
        value = _json_value(rng)
        for mine, theirs in zip(fast, general, strict=True):
            try:
                expected = theirs(value)
            except (TypeError, ValueError) as exc:
                with pytest.raises(type(exc)):
                    mine(value)
                refused += 1
                continue
            text = mine(value)
            assert text == expected, value
            written += 1
            got, end = scan_plain(text, 0)
            assert end == len(text) and _same(got, json.loads(text)), text
    assert written > 5000 and refused > 5000


@pytest.mark.anyio
@pytest.mark.parametrize("outcome", ["returned", "cached error"])
async def test_a_cached_record_is_the_record_the_store_keeps(store_url: str, outcome: str) -> None:
    """What a replay reads from the in-process cache (recorded there by the caller that ran the body) is what it
    would read from the store: the same state, stored result, fingerprint, argument hashes, attempts, fence and
    origin (only the lease, the owner and the time left differ: a completed record has neither lease nor owner
    that a replay reads, and the cache's entry dies before the record's retention ends)."""
    async with Guard(store_url) as guard:

        @guard.once(key=["order_id"], cache_errors=(ValueError,))
        async def charge(order_id: str, amount: int) -> dict[str, Any]:
            if outcome == "cached error":
                raise ValueError(f"declined: {order_id}")
            return {"order_id": order_id, "amount": amount}

        with task(tid(), scope="acct_42"), contextlib.suppress(ValueError):  # (a cached error: recorded, raised)
            await charge("o-1", 4900)
        machine = guard._machine
        ((scope, key),) = list(machine.cache._entries)
        cached = machine.cache.get(scope, key)
        stored = await guard._store.read(scope, key)
    assert cached is not None and stored is not None
    same = ("scope", "key", "state", "fence", "fingerprint", "arg_hashes", "result", "attempts", "task_id",
            "operation", "origin")
    assert {f: getattr(cached, f) for f in same} == {f: getattr(stored, f) for f in same}
    assert cached.state == ("succeeded" if outcome == "returned" else "failed")
