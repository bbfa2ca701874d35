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
    _canonical,
    _compact,
    _flat,
    _normalise,
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


def _random_value(rng: random.Random) -> Any:
    kind = rng.randrange(5)
    if kind == 0:
        return "".join(rng.choice(string.printable + "éü€\u2028\"\\") for _ in range(rng.randrange(12)))
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
