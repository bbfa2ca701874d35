"""The codec's fast path (plain JSON values written by the C encoder, proven by reading them back) must give
exactly what the general path gives: the same stored text when untyped, and the same value, type for type,
for every caller."""

from __future__ import annotations

import datetime as dt
import enum
import random
import string
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict

from agentguard._codec import Codec, decode_error, dumps, encode_error

pytestmark = pytest.mark.storeless  # independent of the store's backend


class Colour(enum.IntEnum):
    RED = 1


class Charge(BaseModel):
    charge_id: str
    amount: Decimal


class ChargeDict(TypedDict):
    charge_id: str
    amount_cents: int


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same type all the way down (1 is not True, (1,) is not [1])."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)


def _random(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(12 if depth < 3 else 7)
    if kind == 0:
        return "".join(rng.choice(string.printable + "éü€\u2028\"\\") for _ in range(rng.randrange(8)))
    if kind == 1:
        return rng.randrange(-(10**20), 10**20)
    if kind == 2:
        return rng.choice([True, False, None, 0, 0.0, -0.0, float("nan"), float("inf")])
    if kind == 3:
        return rng.random() * 10 ** rng.randrange(-5, 20)
    if kind == 4:
        return Decimal(rng.randrange(10**6)) / 100
    if kind == 5:
        return rng.choice([dt.date(2026, 1, 2), b"\x00\xff", Colour.RED, frozenset({1, 2})])
    if kind == 6:
        return rng.choice(["$ag", {"$ag": "tuple", "v": [1]}, {"$ag": "nope"}, {"$ag": "float", "v": "x"}])
    if kind in (7, 8):
        return [_random(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 9:
        return tuple(_random(rng, depth + 1) for _ in range(rng.randrange(3)))
    if kind == 10:
        return {rng.choice(["a", "b", "é", "$ag", 1, None, True]): _random(rng, depth + 1) for _ in range(3)}
    return {"".join(rng.choice("abc") for _ in range(3)): _random(rng, depth + 1) for _ in range(rng.randrange(4))}


def _general(codec: Codec, value: Any) -> tuple[str, Any]:
    text = codec.encode(value)
    return text, codec.decode(text)


@pytest.mark.parametrize("annotation", [Any, dict[str, Any], list[Any], tuple[Any, ...]])
def test_fast_path_equals_general_path_on_random_values(annotation: Any) -> None:
    rng = random.Random(11)
    codec = Codec(annotation)
    checked = 0
    for _ in range(3000):
        value = _random(rng)
        try:
            expected = _general(codec, value)
        except (TypeError, ValueError):
            with pytest.raises((TypeError, ValueError)):
                codec.store(value)
            continue
        text, got = codec.store(value)
        assert _same(got, expected[1]), (value, got, expected[1])
        assert _same(codec.decode(text), got)  # a replay receives what the first caller received
        if annotation is Any:
            assert text == expected[0] == dumps(value)
        checked += 1
    assert checked > 300


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (Charge, Charge(charge_id="ch_1", amount=Decimal("0.10"))),
        (Charge, {"charge_id": "ch_1", "amount": "0.10"}),
        (ChargeDict, {"charge_id": "ch_1", "amount_cents": 4900}),
        (int, True),
        (float, 1),
        (dict[str, float], {"a": 1}),
        (Colour, 1),
        (str, "x"),
        (tuple[int, str], [1, "a"]),
        (dict[int, str], {1: "a"}),
    ],
)
def test_typed_values_reach_every_caller_alike(annotation: Any, value: Any) -> None:
    codec = Codec(annotation)
    text, got = codec.store(value)
    assert _same(got, _general(codec, value)[1])
    assert _same(codec.decode(text), got)


def test_values_that_cannot_be_stored_say_why() -> None:
    with pytest.raises(TypeError, match="annotate"):
        Codec().store(object())
    with pytest.raises(TypeError, match="does not fit"):
        Codec(int).store("not a number")
    loop: list[Any] = []
    loop.append({"again": loop})
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for codec in (Codec(), Codec(list[Any]), Codec(Any)):
        with pytest.raises(ValueError, match="refers to itself"):
            codec.store(loop)
        with pytest.raises(ValueError, match="nested too deeply"):
            codec.store(deep)
        for value in (["\ud800"], ["ok", {"k\udfff": 1}], [("\udc00",)]):  # plain JSON, a str key, a tag
            with pytest.raises(ValueError, match="lone surrogate"):  # (no store can hold one: refused here)
                codec.store(value)
    with pytest.raises(ValueError, match="lone surrogate"):
        Codec(str).store("\ud800")
    with pytest.raises(ValueError, match="lone surrogate"):
        dumps({"a": "\ud800"})
    assert Codec(str).store("é\U0001f600") == ('"é\U0001f600"', "é\U0001f600")  # a surrogate pair's character
    replayed = decode_error(encode_error(ValueError(loop, "\ud800")), (ValueError,))  # a cached error's args
    assert type(replayed) is ValueError and "\\ud800" in str(replayed)


def test_dict_and_list_annotations_skip_only_an_identity_validation() -> None:
    # Plain JSON decoded under dict[str, Any] / list[Any] is returned as it is (validating it would copy it);
    # anything tagged is still validated, so a stored dict with non-string keys is refused, not passed on.
    for annotation, text, want in ((dict[str, Any], '{"a":[1,{"b":null}]}', {"a": [1, {"b": None}]}),
                                   (list[Any], '[1,"x",{"y":2}]', [1, "x", {"y": 2}])):
        assert Codec(annotation).decode(text) == want
    with pytest.raises(ValidationError):
        Codec(dict[str, Any]).decode(dumps({1: "a"}, typed=True))
    assert Codec(list[Any]).decode(dumps((1, 2), typed=True)) == [1, 2]  # a tuple, validated into a list
