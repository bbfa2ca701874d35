"""Keys and fingerprints are stored and forwarded to providers: their formats are pinned here, and the fast
paths must be byte-identical to the general canonical encoder."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import http
import json
import random
import string
import uuid
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from agentguard._keys import (
    MAX_DEPTH,
    _canonical,
    _compact,
    _general,
    _unicode,
    argument_hashes,
    canonical_json,
    derive_key,
    fingerprint,
    hashes_json,
    operation_name,
    sub_key,
)
from agentguard._keys_flat import FlatSignature, flat_json
from agentguard.stores import _chain

pytestmark = pytest.mark.storeless  # independent of the store's backend


def test_formats_are_pinned() -> None:
    op = operation_name("charge", {"order_id": "o-1"})
    assert op == 'charge[order_id="o-1"]'
    assert derive_key("acct_42", "ticket-8812", op) == "ag_6739037c5c0f63e2a13c8498e81181094263933a7a46164b"
    assert fingerprint({"order_id": "o-1", "amount_cents": 4900}) == (
        "cd03ddc60ad1833dd4602d931b67679c36f456e7e5832b7d482d4bb48c610d11"
    )
    assert sub_key("ag_x", "charge") == "ag_aba39d01f90cdf4ec492673f4744e57ab1e23df59b8137db"


def test_a_ledger_entrys_digests_are_pinned() -> None:
    """The form an entry is hashed in, and its link, never change: chains written by an earlier version must still
    verify. (The digests below were made by ``json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))`` and
    ``hashlib.sha256``, before the writer took its encoder from ``_stdlib_shims``.)"""
    row = ("default", "ag_6739037c5c0f63e2a13c8498e81181094263933a7a46164b", "ticket-8812", 'charge[order_id="o-1"]',
           "charge", "ran", "succeeded \u2014 \u00e9", 1, None, "host:42", 1767225600.25, 0.125, 0, 1767312000.25)
    [(values, hashed)] = _chain.prepared([row])
    assert type(values[12]) is float  # (normalised before it is hashed: as the store gives it back)
    assert hashed == "3fb1e88db02cc21f3411a390eadb718abf986a2b6e0f32f817ef51adfeddc279"
    assert _chain.link(_chain.GENESIS, 1, hashed) == "b53603b21e7f4f94f02042065e55f2c8987b336b920d09e95aff89adb459a83f"


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
    # what the C encoder would write differently from the canonical form is left to the general path
    assert flat_json({1: "a"}) is None  # type: ignore[dict-item]  # (the encoder would write the name "1")
    assert flat_json({"a": http.HTTPStatus.OK}) is None and flat_json({"a": 1.0}) is None
    assert flat_json({"a": 10**5000}) is None  # more digits than int -> str allows
    mixed = {"b": True, "a": None, "é": "\u2028\ud800", "n": -(10**30)}
    assert flat_json(mixed) == _general(mixed)
    rng = random.Random(7)
    for _ in range(500):
        args = {"".join(rng.choice("abcé_$") for _ in range(rng.randrange(1, 6))): _random_value(rng)
                for _ in range(rng.randrange(4))}
        flat = flat_json(args)
        if flat is not None:
            assert flat == _general(args)
        parts = [str(_random_value(rng)) for _ in range(3)]
        general = json.dumps(parts, separators=(",", ":"))
        assert derive_key(*parts) == "ag_" + hashlib.sha256(general.encode()).hexdigest()[:48]
        hashes = argument_hashes(args)
        assert hashes_json(hashes) == _compact(hashes)
        for value in args.values():
            if isinstance(value, str):
                assert canonical_json(value) == _canonical(value)


def _flat_value(rng: random.Random) -> Any:
    kind = rng.randrange(7)
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
    if kind == 5:
        return rng.choice(["o-1", 4900, "$decimal", '{"$set":[1]}'])  # a tag's text in a str is a str
    return rng.choice([{"$x": 1}, (1,), uuid.UUID(int=1), {1: "a"}])  # tagged or escaped: the general path


def test_the_one_pass_identity_matches_the_general_path() -> None:
    rng = random.Random(11)
    seen_flat = seen_general = 0
    for _ in range(2000):
        names = sorted({"".join(rng.choice("abé_\"%s{$") for _ in range(rng.randrange(1, 5)))
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
        operation, key, fp, hashes_text = sig.identity("acct_42", "ticket-8812", values)
        assert fp == expected
        assert operation == operation_name("charge", {k: args[k] for k in key_fields} or None)
        assert key == derive_key("acct_42", "ticket-8812", operation)
        assert sig.identity("acct_42", "ticket-8812", values) == (operation, key, fp, hashes_text)  # the memo
        assert sig.identity("acct_42", "other-task", values)[1] != key  # the task is part of the memo's key
        hashes = sig.hashes(values)
        assert hashes == argument_hashes(args)
        assert hashes_text == sig.hashes_json(values) == hashes_json(hashes) == _compact(hashes)
    assert seen_flat > 500 and seen_general > 200
    assert FlatSignature("t", ["a"], []).values({"a": 1, "b": 2}) is None  # not the signature's names
    sig = FlatSignature("t", ["a"], ["a"])
    for i in range(FlatSignature.MEMO * 2 + 5):  # bounded: forgetting costs hashes, never a wrong identity
        assert sig.identity("s", "t", [str(i)]) == ("t[a=" + str(i) + "]", derive_key("s", "t", f"t[a={i}]"),
                                                        fingerprint({"a": i}), hashes_json(argument_hashes({"a": i})))
        assert len(sig._memo) <= FlatSignature.MEMO
    sig._memo.clear()
    long_text = "x" * FlatSignature.MEMO_TEXT
    assert sig.identity("s", "t", [_unicode(long_text)])[2] == fingerprint({"a": long_text})
    assert not sig._memo  # long arguments are hashed each time, never kept


class Currency(enum.Enum):
    EUR = "eur"


@dataclasses.dataclass
class Parcel:
    weight_g: int
    fragile: bool


class Payee(BaseModel):
    iban: str
    amount: Decimal


for _cls in (Currency, Parcel, Payee):  # the pinned text must not depend on how pytest imports this file
    _cls.__module__ = "shop"


# (arguments, their canonical JSON, their fingerprint): the stored format. A change here is a change of
# every stored record's fingerprint for such arguments: deliberate, and in the CHANGELOG.
VECTORS: list[tuple[dict[str, Any], str, str]] = [
    ({"order_id": "o-1", "amount_cents": 4900},
     '{"amount_cents":4900,"order_id":"o-1"}',
     "cd03ddc60ad1833dd4602d931b67679c36f456e7e5832b7d482d4bb48c610d11"),
    ({"amount": 12.5, "qty": 3.0, "n": -(10**30)},
     '{"amount":12.5,"n":-1000000000000000000000000000000,"qty":3}',
     "e55f8b6d2558ba7ead14589c17b047d2173329b8a326aef10ef2fd41f0ac8178"),
    ({"items": ("a", ["b", -0.0])},
     '{"items":["a",["b",0]]}',
     "caae3e2884dabb73357ae479662d5a5c75b99235ce864527fb3894c2a6fc3f75"),
    ({"price": Decimal("12.30"), "big": Decimal("1.00000000000000000000000000001")},
     '{"big":{"$decimal":"1.00000000000000000000000000001"},"price":{"$decimal":"12.3"}}',
     "151d5bb654cfbd1136fe0e1fc214f1fe7a5a7af66ef877075f1473245b95a2a9"),
    ({"at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=1))),
      "on": dt.date(2026, 1, 2), "naive": dt.datetime(2026, 1, 2, 3, 4, 5), "t": dt.time(9, 30)},
     '{"at":{"$datetime":"2026-01-02T03:04:05+01:00"},"naive":{"$datetime":"2026-01-02T03:04:05"},'
     '"on":{"$date":"2026-01-02"},"t":{"$time":"09:30:00"}}',
     "b7c05c4757ad68fe77b4a8452ee89c0f6141ae543862e629202e9b2a9566c742"),
    ({"id": uuid.UUID(int=5), "as_text": "00000000-0000-0000-0000-000000000005"},
     '{"as_text":"00000000-0000-0000-0000-000000000005","id":{"$uuid":"00000000-0000-0000-0000-000000000005"}}',
     "0f7e2e1cbc1355590793a589db60d2029810a2be67da62ef5ca198ba276cbfb8"),
    ({"tags": {3, "a", 1.5, None}, "frozen": frozenset({(1, 2)})},
     '{"frozen":{"$set":[[1,2]]},"tags":{"$set":["a",1.5,3,null]}}',
     "ad09f5e4e15d3dfdddd9fe6ba16f282aa8bfd650708a29cd193a027e839e6545"),
    ({"raw": b"x", "buf": bytearray(b"\x00\xff")},
     '{"buf":{"$bytes":"AP8="},"raw":{"$bytes":"eA=="}}',
     "d4a592dab9e0c6ebc717da1b809dfa05099df76560b3195947ebee03d6074950"),
    ({"m": {1: "a", "1": "b", None: "c"}},
     '{"m":{"$map":[["1","b"],[1,"a"],[null,"c"]]}}',
     "0c762255e8eea485aec823d88a7ce8e438fbde7345d34c714927ba9a25fddb00"),
    ({"q": {"$gt": 5, "$$x": "y", "b": [1]}},
     '{"q":{"$$$x":"y","$$gt":5,"b":[1]}}',
     "dbf5769d007ee6405cb0e4c60473f3a1e4fae2243419e02421f19b513c9339e9"),
    ({"c": Currency.EUR, "status": http.HTTPStatus.OK},
     '{"c":{"$enum":["shop.Currency","eur"]},"status":{"$enum":["http.HTTPStatus",200]}}',
     "811306fb8d7941ff698c5e1c84837a7e727fcb51dd679978927f8af528fd07e1"),
    ({"p": Parcel(1200, True)},
     '{"p":{"$dataclass":["shop.Parcel",{"fragile":true,"weight_g":1200}]}}',
     "97796145da2b0e18eeb4f841b408f2ddb0c197a6e017e157c738d96b61aa4daa"),
    ({"who": Payee(iban="DE02", amount=Decimal("5.00"))},
     '{"who":{"$model":["shop.Payee",{"amount":{"$decimal":"5"},"iban":"DE02"}]}}',
     "8706e4145dea209cf92aab9eef72bfcad0fd7bd94f84690b1d91b3bd28768718"),
    ({"wait": dt.timedelta(days=1, seconds=90, microseconds=7)},
     '{"wait":{"$timedelta":86490000007}}',
     "d3043550cbc644cfcad03d2237bb4d8f1e83bbfe5b9f1d2f29e3fe5e38d8061e"),
    ({"memo": "é€\u2028\"\\"},
     '{"memo":"é€\u2028\\"\\\\"}',
     "48c9a249e1a9b482419156036e6abf8e47befdac3e3794e5512176b9917571fa"),
]


@pytest.mark.parametrize(("arguments", "text", "digest"), VECTORS, ids=lambda v: "")
def test_canonical_form_is_pinned(arguments: dict[str, Any], text: str, digest: str) -> None:
    assert _general(arguments) == text
    assert fingerprint(arguments) == digest == hashlib.sha256(text.encode()).hexdigest()
    assert json.loads(text)  # plain JSON
    flat = flat_json(arguments)
    assert flat is None or flat == text


# Fingerprints the release before the tagged form computed for these arguments (str/int/bool/None, floats,
# lists, tuples, str-keyed dicts without "$" keys, Decimal, datetime, date, time, bytes kept their form), so
# their stored records still replay.
UNCHANGED: list[tuple[Any, str]] = [
    ("o-1", "0a94f93c12e81f421433f1f95d7f7be0861530bcc1785d4d33886bbf112248ff"),
    ("é€\u2028", "b6b1f5b54596ff5aa27aa6b194555897fbf53f290c403e2a3cd167d051f45050"),
    (4900, "a1ff17b91abd6b981ca2ffa7429ecfde34e107e90de76f6d2a511a8fa79a527f"),
    (-(10**30), "ceeb1eed65f617932e96a704fe75186111888091e284456b348c533ce76ff958"),
    (True, "5daa0644c4a1c43ea018f7f1ef2944b90e0165ef1f2d5669ca89e5d4f69ac597"),
    (None, "d091f9c83c091f79652fe8786375b3fe4ce0861a56f5bfbafedbe431877ff0e8"),
    (12.5, "1029b4774a51058db2e8faf81b9568a88b4945432c2a6c36e3a6391d4aeef01a"),
    (4900.0, "a1ff17b91abd6b981ca2ffa7429ecfde34e107e90de76f6d2a511a8fa79a527f"),
    (-0.0, "45b619e97b5d9b029af4522e9ffb02fa99ff2bf226c82ee22a7cc10269a557e8"),
    ([1, "a", None, [2.5]], "3b6e024561de68e759e5a867df07ca813a9a23bd0aa5678561f1b5610bceed72"),
    ((1, 2), "01530d164d479cf08e26d3b1ad9bdba927120d97e2d057a6d792db778780d720"),
    ({"b": 1, "a": {"c": [True]}}, "05ae9c5b1055c83c49130457f608e8869e55f3692c36195ea7be74f40309f01e"),
    (Decimal("12.30"), "ed6cd10101ad606f7dfd57d52326ead48ca0fa040ced2390c450b7af23b0755c"),
    (Decimal("100"), "1eb723754f3ccd799516b258503ece1480aab176f3c7bb03f92f714c01e7a384"),
    (Decimal("-1.5E-7"), "07076094a0de83603cbc962c789edbc0552ba4cba78fcb2f395f549da679e886"),
    (dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=1))),
     "1efdc7538eb9ddc9be1e83dc3a46a2c51e6cc7e59c83a5fe05e56d69b617eb39"),
    (dt.datetime(2026, 1, 2, 3, 4), "83b40e73510bac7b274ffc984b02ecf5c7d418482765c40ee395ca98584b9b4a"),
    (dt.date(2026, 1, 2), "5f6763b5ba09b11b951464cfd3ddaba44867c5b7d6af646571be84fb666f38c7"),
    (dt.time(3, 4, 5), "d110a1f6fe41837e79ead39ed22dd6e5c6794d89b277fac962262429f057161e"),
    (b"\x00\xffx", "825c33fe80d82aeb71fd9485845a1b69e1e8ee54e4fbabcd4206a75a68295266"),
    (bytearray(b"ab"), "bd83e648a5a68408b33b4c677b0ecaf1d421356bc74c74878d0be6d3ccc13239"),
    ({"x": [Decimal("1.10"), dt.date(2026, 5, 1), b"z"]},
     "ddfed884676d5cac3decb3748f45e31674384804fff581d6c3deb54a91b73bf1"),
]


def test_values_that_needed_no_tag_keep_their_fingerprints() -> None:
    for value, digest in UNCHANGED:  # (each is fingerprint({"a": value}) as the previous release computed it)
        assert fingerprint({"a": value}) == digest, value


# Operation names the release before the tagged form gave these key values: the key is derived from the name,
# so a call completed before an upgrade and retried after it meets its record instead of running again.
OPERATION_NAMES: list[tuple[Any, str]] = [
    (uuid.UUID(int=5), '"00000000-0000-0000-0000-000000000005"'),
    (Currency.EUR, '"eur"'),
    (http.HTTPStatus.OK, "200"),
    ({3, "a", 1.5}, '["\\"a\\"","1.5","3"]'),
    (Parcel(1200, True), '{"fragile":true,"weight_g":1200}'),
    (Payee(iban="DE02", amount=Decimal("5.00")), '{"amount":"5.00","iban":"DE02"}'),
    (dt.timedelta(seconds=90), '{"$timedelta":90.0}'),
    ({1: "a", 2: "c"}, '{"1":"a","2":"c"}'),
    ({"$gt": 5}, '{"$gt":5}'),
    (Decimal("12.30"), '{"$decimal":"12.3"}'),
    (dt.date(2026, 1, 2), '{"$date":"2026-01-02"}'),
    (1.0, "1"),
    (("a", [1, 2.5]), '["a",[1,2.5]]'),
    (b"x", '{"$bytes":"eA=="}'),
]


def test_key_fields_keep_the_operation_names_they_had() -> None:
    for value, text in OPERATION_NAMES:
        assert operation_name("charge", {"k": value}) == f"charge[k={text}]", value
    # A value the release before could not name (its keys did not sort) has no old record: the tagged form.
    assert operation_name("charge", {"k": {1: "a", None: "c"}}) == 'charge[k={"$map":[[1,"a"],[null,"c"]]}]'
    assert operation_name("charge", {"b": "x", "a": 1}) == 'charge[a=1,b="x"]'


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value  # `levels` lists, one inside the other


def test_what_has_no_canonical_form_is_named() -> None:
    assert canonical_json(_nested(MAX_DEPTH)) == "[" * MAX_DEPTH + "]" * MAX_DEPTH
    root = deepest = _nested(MAX_DEPTH)
    for _ in range(MAX_DEPTH - 1):
        deepest = deepest[0]
    deepest.extend([Decimal("1"), "x"])  # values in the deepest container are not containers: allowed
    assert canonical_json(root).endswith('[{"$decimal":"1"},"x"' + "]" * MAX_DEPTH)
    deepest.append(())
    with pytest.raises(TypeError, match="nested more than"):
        canonical_json(root)
    with pytest.raises(TypeError, match=rf"argument 'a' .*nested more than {MAX_DEPTH} levels deep"):
        fingerprint({"a": _nested(MAX_DEPTH + 1)})
    with pytest.raises(TypeError, match=r"argument 'a' .*nested more than 100 levels deep"):
        fingerprint({"a": _nested(5000)})  # (beyond the interpreter's own recursion limit)
    loop: list[Any] = [1]
    loop.append({"again": (loop,)})
    with pytest.raises(TypeError, match=r"argument 'b' cannot be fingerprinted: it refers to itself"):
        fingerprint({"a": 1, "b": loop})
    with pytest.raises(TypeError, match=r"argument 'b' cannot be fingerprinted: it refers to itself"):
        argument_hashes({"b": loop})
    for value in ("\ud800", "ok\udfff", ["\ud800"], {"k\ud800": 1}, {1: "\ud800"}):
        for args in ({"memo": value}, {"memo": value, "n": 1.5}):  # the flat path and the general one
            with pytest.raises(TypeError, match=r"argument 'memo' .*lone surrogate"):
                fingerprint(args)
    with pytest.raises(TypeError, match=r"argument name '\\ud800' .*lone surrogate"):
        fingerprint({"\ud800": 1})
    with pytest.raises(TypeError, match=r"key field 'order' of 'charge' .*lone surrogate"):
        operation_name("charge", {"order": "o-\ud800"})
    with pytest.raises(TypeError, match=r"key field 'order' of 'charge' .*refers to itself"):
        operation_name("charge", {"order": loop})
    with pytest.raises(TypeError, match="argument names must be strings"):
        fingerprint({1: "a"})  # type: ignore[dict-item]
    for bad in (float("inf"), Decimal("NaN"), object(), {"x": [1, {2, object()}]}):
        with pytest.raises(TypeError, match="argument 'a' cannot be fingerprinted"):
            fingerprint({"a": bad})


def test_the_flat_identity_names_a_lone_surrogate() -> None:
    sig = FlatSignature("send", ["to", "memo"], ["to"])
    values = sig.values({"to": "x", "memo": "hi \ud83d"})  # half of an emoji's surrogate pair
    assert values is not None
    with pytest.raises(TypeError, match=r"argument 'memo' cannot be fingerprinted: it contains a lone surrogate"):
        sig.identity("s", "t", values)
    assert not sig._memo


def test_decimals_are_exact_whatever_the_context() -> None:
    # normalize() rounds to the context's 28 digits and overflows past its exponent range; the form does not.
    assert canonical_json(Decimal("1.00000000000000000000000000001")) != canonical_json(Decimal("1"))
    assert canonical_json(Decimal("1E+1000000")) == '{"$decimal":"1E+1000000"}'
    assert canonical_json(Decimal("-0.00")) == canonical_json(Decimal("0E+5")) == '{"$decimal":"0"}'
    assert canonical_json(Decimal("1.50")) == canonical_json(Decimal("1.5")) == '{"$decimal":"1.5"}'
    assert canonical_json(Decimal("1200")) == '{"$decimal":"1.2E+3"}'
