"""Keys and fingerprints are stored and forwarded to providers: their formats are pinned here, and the fast
paths must be byte-identical to the general canonical encoder."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import string
from decimal import Decimal
from typing import Any

from agentguard._keys import (
    FlatSignature,
    _canonical,
    _compact,
    _flat,
    _normalise,
    _unicode,
    argument_hashes,
    canonical_json,
    derive_key,
    fingerprint,
    hashes_json,
    operation_name,
    sub_key,
)


def test_formats_are_pinned() -> None:
    op = operation_name("charge", {"order_id": "o-1"})
    assert op == 'charge[order_id="o-1"]'
    assert derive_key("acct_42", "ticket-8812", op) == "ag_6739037c5c0f63e2a13c8498e81181094263933a7a46164b"
    assert fingerprint({"order_id": "o-1", "amount_cents": 4900}) == (
        "cd03ddc60ad1833dd4602d931b67679c36f456e7e5832b7d482d4bb48c610d11"
    )
    assert sub_key("ag_x", "charge") == "ag_aba39d01f90cdf4ec492673f4744e57ab1e23df59b8137db"


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(string.printable + "éü€\u2028\"\\") for _ in range(rng.randrange(12)))


def _random_value(rng: random.Random) -> Any:
    kind = rng.randrange(5)
    if kind == 0:
        return _random_text(rng)
    if kind == 1:
        return rng.randrange(-(10**20), 10**20)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return Decimal(rng.randrange(10**6)) / 100
    return [rng.random(), dt.date(2026, 1, 1 + rng.randrange(28))]


def test_fast_paths_match_the_canonical_encoder() -> None:
    rng = random.Random(7)
    for _ in range(500):
        args = {"".join(rng.choice("abcé_") for _ in range(rng.randrange(1, 6))): _random_value(rng)
                for _ in range(rng.randrange(4))}
        flat = _flat(args)
        if flat is not None:
            assert flat == _canonical(_normalise(args))
        parts = [str(_random_value(rng)) for _ in range(3)]
        general = json.dumps(parts, separators=(",", ":"))
        assert derive_key(*parts) == "ag_" + hashlib.sha256(general.encode()).hexdigest()[:48]
        hashes = argument_hashes(args)
        assert hashes_json(hashes) == _compact(hashes)
        for value in args.values():
            if isinstance(value, str):
                assert canonical_json(value) == _canonical(value)


def _flat_value(rng: random.Random) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return _random_text(rng)
    if kind == 1:
        return rng.randrange(-(10**20), 10**20)
    if kind == 2:
        return rng.choice([True, False, None, 0, 1])
    if kind == 3:
        return 1.0  # not flat: the general path (which renders it as 1)
    if kind == 4:
        return 10**5000  # flat by type, but too long for int -> str: the general path names it
    return rng.choice(["o-1", 4900])


def test_the_one_pass_identity_matches_the_general_path() -> None:
    rng = random.Random(11)
    seen_flat = seen_general = 0
    for _ in range(2000):
        names = sorted({"".join(rng.choice("abé_\"%s{") for _ in range(rng.randrange(1, 5)))
                        for _ in range(rng.randrange(5))})
        key_fields = [n for n in names if rng.random() < 0.4]
        sig = FlatSignature("charge", list(reversed(names)), key_fields)
        args = {n: _flat_value(rng) for n in names}
        values = sig.values(args)
        try:
            expected = fingerprint(args)
        except TypeError:
            assert values is None  # the general path raises the precise error
            continue
        if values is None:
            seen_general += 1
            continue
        seen_flat += 1
        operation, key, fp = sig.identity("acct_42", "ticket-8812", values)
        assert fp == expected
        assert operation == operation_name("charge", {k: args[k] for k in key_fields} or None)
        assert key == derive_key("acct_42", "ticket-8812", operation)
        assert sig.identity("acct_42", "ticket-8812", values) == (operation, key, fp)  # the memo
        assert sig.identity("acct_42", "other-task", values)[1] != key  # the task is part of the memo's key
        hashes = sig.hashes(values)
        assert hashes == argument_hashes(args)
        assert sig.hashes_json(values) == hashes_json(hashes) == _compact(hashes)
    assert seen_flat > 500 and seen_general > 200
    assert FlatSignature("t", ["a"], []).values({"a": 1, "b": 2}) is None  # not the signature's names
    sig = FlatSignature("t", ["a"], ["a"])
    for i in range(FlatSignature.MEMO * 2 + 5):  # bounded: forgetting costs hashes, never a wrong identity
        assert sig.identity("s", "t", [str(i)]) == ("t[a=" + str(i) + "]", derive_key("s", "t", f"t[a={i}]"),
                                                        fingerprint({"a": i}))
        assert len(sig._memo) <= FlatSignature.MEMO
    sig._memo.clear()
    long_text = "x" * FlatSignature.MEMO_TEXT
    assert sig.identity("s", "t", [_unicode(long_text)])[2] == fingerprint({"a": long_text})
    assert not sig._memo  # long arguments are hashed each time, never kept
