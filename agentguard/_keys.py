"""Key, downstream key and fingerprint derivation: pure functions, no I/O.

The key is derived from (scope, task, operation) and never from the attempt, so every re-invocation of the
same operation in the same task meets the same record. Keys and fingerprints are hashes: no personal data
reaches the key column or the provider.

The canonical form
------------------
A fingerprint is the SHA-256 of the UTF-8 of the arguments' canonical JSON: one object mapping each argument
name (as it is: the top level is always the arguments, never a tag) to its value's canonical form, with keys
sorted by code point, no whitespace, non-ASCII text as itself. Equal canonical forms mean equal values, so a
value of each type that JSON lacks carries a tag, and user data that could read as a tag is escaped:

- ``None``, ``bool``, ``str``, ``int``: themselves (``true`` is never ``1``).
- ``float``: finite only; a whole number is written as that int (``1.0`` is ``1``, ``-0.0`` is ``0``), any
  other value as its shortest repr.
- ``list``, ``tuple``: an array.
- ``dict`` whose keys are all ``str``: an object. A key starting with ``$`` gets one more ``$`` in front
  (``"$x"`` is written ``"$$x"``), so a user key never starts with a single ``$``.
- every other type: a *tag*, an object with one key, ``$`` and the type's name (a single ``$``)::

    {"$decimal": "1.5"}              Decimal, finite, exact: trailing zeros dropped ("1.50" -> "1.5",
                                     "100" -> "1E+2", "-0" -> "0"), never rounded to a context's precision
    {"$datetime": "2026-01-02T03:04:05+01:00"}   datetime.isoformat(): wall time and UTC offset (none if naive)
    {"$date": "2026-01-02"}   {"$time": "03:04:05"}   isoformat()
    {"$timedelta": 90000000}         whole microseconds
    {"$timedelta_ns": 1001}          a pandas Timedelta finer than a microsecond: whole nanoseconds
    {"$uuid": "…"}                   the UUID's canonical text
    {"$bytes": "eA=="}               base64; bytes and bytearray alike
    {"$set": [...]}                  set and frozenset alike: the elements' canonical forms, sorted by their
                                     canonical JSON, each once
    {"$map": [[key, value], ...]}    a dict with any key that is not a str: its pairs sorted by their canonical
                                     JSON (so {1: "a"}, {"1": "a"} and {True: "a"} are three values)
    {"$enum": ["mod.Class", value]}  an Enum member (IntEnum and StrEnum too): its class and its value
    {"$dataclass": ["mod.Class", {"field": value, ...}]}
    {"$model": ["mod.Class", {"field": value, ...}]}   a pydantic model: its fields and extra fields

pandas' ``Timestamp`` is a datetime whose isoformat keeps its nanoseconds and a ``Timedelta`` a timedelta to
the nanosecond; ``NaT``, like a NaN, is refused. numpy's ``float64`` and ``str_`` subclass float and str;
its other scalars (``int64``, ``bool_``, ``float32``, ``datetime64``...) and arrays are refused: convert them
(``.item()``, ``.tolist()``) where the conversion is what you mean.

A subclass of str, int or float that is not an Enum is its plain value; a dict, list or tuple subclass
(OrderedDict, a NamedTuple) is its base. Any other type, a non-finite float or Decimal, a lone surrogate,
a datetime not equal to itself, containers nested more than ``MAX_DEPTH`` deep, a value that refers to itself
and a value whose own code raises while it is read are refused with a TypeError naming the argument. The
documented equivalences are exactly these: tuple and list, a whole float and its int,
-0.0 and 0.0, Decimals that compare equal (scale is not kept), set and frozenset, bytes and bytearray, dict
insertion order, set iteration order. Flat str/int/bool/None arguments have the form they always had.

An operation name (``charge[order_id="o-1"]``, from which the key is derived) checks its key values with this
form but writes them as the release before the tags did (a UUID as its string, an Enum member as its value,
a set as a list...), so that no key changes: see ``operation_name``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from ._codec import refers_to_itself
from ._stdlib_shims import encoder

# OpenSSL's SHA-256 (hashlib's), which uses the CPU's SHA instructions. CPython's own, once taken here for its
# smaller set-up per digest, saves 3% of an unseen call's identity when every argument is short, and costs 1.27×
# with a 300-character argument, 1.9× with a 2,000-character one (``python -m benchmarks.digests``).
_sha256 = hashlib.sha256

MAX_DEPTH = 100  # containers within containers: far beyond any tool's arguments, far below the stack's limit


class _TooDeep(Exception):
    """A container past ``MAX_DEPTH``; the caller says whether the value is deep or refers to itself."""


def _tree(value: Any, depth: int) -> Any:
    """The canonical form of ``value`` as plain JSON values (see the module docstring), ``depth`` being the
    level of ``value`` itself (1 for an argument). Each container checks its own depth on entry."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        return _float(value)
    if t is dict:
        return _object(value, depth)
    if t is list or t is tuple:
        return _array(value, depth)
    return _other(value, depth)


def _array(value: Iterable[Any], depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise _TooDeep
    depth += 1
    return [_tree(v, depth) for v in value]


def _float(value: float) -> int | float:
    # json renders 1.0 and 1 differently; a fingerprint must not (nor -0.0 and 0.0, both whole).
    if value.is_integer():
        return int(value)
    if not math.isfinite(value):
        raise TypeError(f"non-finite float {value!r} has no canonical form")
    return value


def _object(value: Mapping[Any, Any], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _TooDeep
    out: dict[str, Any] = {}
    for k, v in value.items():
        if type(k) is not str:
            if not isinstance(k, str) or isinstance(k, enum.Enum):
                return _map(value, depth)
            k = str.__str__(k)
        if k[:1] == "$":
            k = "$" + k  # escaped: a user key never starts with the single "$" of a tag
        out[k] = _tree(v, depth + 1)
    return out


def _map(value: Mapping[Any, Any], depth: int) -> Any:
    depth += 1  # (its depth was checked by _object)
    pairs = {}
    for k, v in value.items():
        pair = [_tree(k, depth), _tree(v, depth)]
        pairs[_canonical(pair)] = pair
    return {"$map": [pairs[text] for text in sorted(pairs)]}


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _other(value: Any, depth: int) -> Any:
    # The types JSON lacks, each with its tag; subclasses of JSON's own types after Enums (IntEnum is an int).
    if isinstance(value, enum.Enum):
        return {"$enum": [_path(type(value)), _tree(value.value, depth + 1)]}
    if isinstance(value, dict):
        return _object(value, depth)
    if isinstance(value, list | tuple):
        return _array(value, depth)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _float(float.__float__(value))
    if isinstance(value, decimal.Decimal):
        return {"$decimal": _decimal(value)}
    if isinstance(value, _ISO_TYPES):
        return _iso(value)
    if isinstance(value, dt.timedelta):
        return _timedelta(value)
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, set | frozenset):
        if depth > MAX_DEPTH:
            raise _TooDeep
        depth += 1
        items = {}
        for v in value:
            item = _tree(v, depth)
            items[_canonical(item)] = item
        return {"$set": [items[text] for text in sorted(items)]}
    if isinstance(value, BaseModel):
        fields = {**value.__dict__, **(value.__pydantic_extra__ or {})}
        return {"$model": [_path(type(value)), _object(fields, depth + 1)]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        except AttributeError as exc:
            raise TypeError(f"{type(value).__qualname__} has an unset field ({exc})") from None
        return {"$dataclass": [_path(type(value)), _object(fields, depth + 1)]}
    raise TypeError(f"cannot canonicalise a value of type {type(value).__qualname__}")


# datetime before date: a datetime is a date too.
_ISO = ((dt.datetime, "$datetime"), (dt.date, "$date"), (dt.time, "$time"))
_ISO_TYPES = (dt.datetime, dt.date, dt.time)


def _iso(value: dt.date | dt.time) -> dict[str, str]:
    if value != value:  # pandas' NaT, like a NaN, is not equal to itself: no value it could be written as is
        raise TypeError(f"{value!r} has no canonical form (it is not equal to itself)")
    tag = next(tag for cls, tag in _ISO if isinstance(value, cls))
    return {tag: value.isoformat()}


def _timedelta(value: dt.timedelta) -> dict[str, int]:
    """Whole microseconds; a duration finer than that (pandas' Timedelta keeps nanoseconds, a component that
    ``timedelta`` itself does not see) as whole nanoseconds under its own tag, so that 1 ns and 2 ns are two
    values and a Timedelta of whole microseconds is the timedelta it equals."""
    micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    nanos = getattr(value, "nanoseconds", 0)
    if type(nanos) is not int or not 0 <= nanos < 1000:
        raise TypeError(f"{type(value).__qualname__} has a nanoseconds component {nanos!r} that is not 0..999")
    if nanos:
        return {"$timedelta_ns": micros * 1000 + nanos}
    return {"$timedelta": micros}


def _decimal(value: decimal.Decimal) -> str:
    """The text of a finite Decimal without trailing zeros, exactly: ``normalize()`` would round to the
    context's 28 digits (two unequal values, one text) and overflow past its exponent range."""
    if not value.is_finite():
        raise TypeError(f"non-finite Decimal {value!r} has no canonical form")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    end = len(digits)
    while end > 1 and digits[end - 1] == 0:
        end -= 1
    if end == 1 and digits[0] == 0:
        return "0"  # -0 and 0E+5 are 0
    return str(decimal.Decimal((sign, digits[:end], exponent + len(digits) - end)))


def _nested_too_deeply(value: Any) -> TypeError:
    if refers_to_itself(value):
        return TypeError("it refers to itself")
    return TypeError(f"it is nested more than {MAX_DEPTH} levels deep (the limit)")


SURROGATE = "it contains a lone surrogate (not valid Unicode text)"


# Encoders built once: json.dumps(..., **options) builds a new encoder on every call. (No default: the walk
# above leaves only JSON's own types.)
_canonical = encoder(sort_keys=True, allow_nan=False)
_compact = encoder(sort_keys=True, ensure_ascii=True)


_ascii = json.encoder.encode_basestring_ascii
_unicode = json.encoder.encode_basestring


def canonical_json(value: Any) -> str:
    """The canonical JSON form of one value (see the module docstring).

    Raises TypeError (or ValueError for an int too long to write) saying why a value has none.
    """
    t = type(value)
    if t is str:
        return _unicode(value)  # what the encoder writes for a str
    if t is int or t is bool or value is None:
        return "null" if value is None else ("true" if value is True else "false") if t is bool else str(value)
    try:
        return _canonical(_tree(value, 1))
    except (_TooDeep, RecursionError):
        raise _nested_too_deeply(value) from None
    except (TypeError, ValueError):
        raise
    except Exception as exc:  # the user's own code (an ``items()``, a property, an ``__eq__``) failed while read
        raise _raised_while_read(exc) from None


def _raised_while_read(exc: Exception) -> TypeError:
    return TypeError(f"reading it raised {type(exc).__qualname__}: {exc}")


def _general(arguments: Mapping[str, Any]) -> str:
    """The canonical JSON of the arguments (what ``agentguard._keys_flat`` builds for flat ones in one pass)."""
    tree = {}
    for name, value in arguments.items():
        if not isinstance(name, str):
            raise TypeError(f"argument names must be strings, got {type(name).__name__} {name!r}")
        tree[name] = _tree(value, 1)  # (names as they are: the top level is never a tag)
    return _canonical(tree)


def sha(text: str) -> str:
    digest: str = _sha256(text.encode()).hexdigest()
    return digest


def encodes(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate). ASCII is checked in O(1)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def argument_error(name: str, why: str) -> TypeError:
    return TypeError(f"argument {name!r} cannot be fingerprinted: {why}")


def argument_hashes(arguments: Mapping[str, Any]) -> dict[str, str]:
    """One short hash per argument, so a reuse error can name what differs without storing values.

    Raises TypeError naming the argument that has no canonical form.
    """
    out: dict[str, str] = {}
    for name, value in arguments.items():
        if not isinstance(name, str):
            raise TypeError(f"argument names must be strings, got {type(name).__name__} {name!r}")
        if not encodes(name):
            raise TypeError(f"argument name {name!r} cannot be fingerprinted: {SURROGATE}")
        try:
            text = canonical_json(value)
        except (TypeError, ValueError) as exc:
            raise argument_error(name, str(exc)) from None
        try:
            out[name] = sha(text)[:24]
        except UnicodeEncodeError:
            raise argument_error(name, SURROGATE) from None
    return out


def fingerprint(arguments: Mapping[str, Any]) -> str:
    """A hash of the canonical JSON of the arguments that affect the outcome (one encode, one hash).

    Raises TypeError naming the argument that has no canonical form.
    """
    try:
        return sha(_general(arguments))
    except Exception as exc:  # (UnicodeEncodeError is a ValueError; any other: the user's code, while read)
        argument_hashes(arguments)  # names the culprit
        why = exc if isinstance(exc, TypeError | ValueError) else _raised_while_read(exc)
        raise TypeError(f"the arguments cannot be fingerprinted: {why}") from None


def hashes_json(hashes: Mapping[str, str]) -> str:
    # == _compact(hashes) (sorted keys, ASCII escapes; the values are hex), without the encoder's setup
    return "{" + ",".join(f'{_ascii(k)}:"{hashes[k]}"' for k in sorted(hashes)) + "}"


def operation_name(tool: str, key_values: Mapping[str, Any] | str | None) -> str:
    """The readable operation: ``charge`` or ``charge[order_id="o-1"]``, from which the key is derived.

    Raises TypeError naming a key field whose value has no canonical form.
    """
    if key_values is None:
        return tool
    if isinstance(key_values, str):
        return f"{tool}[{key_values}]"
    if not key_values:
        return tool
    parts = []
    for name in sorted(key_values):
        value = key_values[name]
        try:
            text = canonical_json(value)  # (also the check: depth, self-reference, types)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"key field {name!r} of {tool!r} cannot be canonicalised: {exc}") from None
        if type(value) not in _FLAT:
            # (a value the release before could not name keeps its canonical form: no record has an old name)
            with contextlib.suppress(Exception):  # (any: a user object's own code may fail while read)
                text = _legacy_text(value)
        if not encodes(text):
            raise TypeError(f"key field {name!r} of {tool!r} cannot be canonicalised: {SURROGATE}")
        parts.append(f"{name}={text}")
    return f"{tool}[{','.join(parts)}]"


# -- operation names keep the text key values had before the tagged form ---------------------------------
# A key is derived from the operation name, and a changed key meets no record: a call completed before an
# upgrade and retried after it would run again, under a new downstream key the provider cannot match. So
# a key value is named as it always was. That text is not injective (a UUID and its string, {1, 2} and
# ["1", "2"] read alike); the fingerprint, which holds the key fields unless they are ignored, tells such
# calls apart: a KeyReuseError, never a silent replay.

_FLAT = (str, int, bool, type(None))


def _legacy_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return _legacy_normalise(obj.model_dump(mode="json"))
    if isinstance(obj, decimal.Decimal):
        return {"$decimal": str(obj.normalize())}
    if isinstance(obj, _ISO_TYPES):
        return _iso(obj)
    if isinstance(obj, dt.timedelta):
        return {"$timedelta": obj.total_seconds()}
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, set | frozenset):
        return sorted(_legacy_text(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _legacy_normalise(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    raise TypeError(f"cannot canonicalise a value of type {type(obj).__qualname__}")  # pragma: no cover


def _legacy_normalise(value: Any) -> Any:
    t = type(value)
    if t is float:
        return int(value) if value.is_integer() else value
    if t is dict:
        return {k: _legacy_normalise(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_legacy_normalise(v) for v in value]
    return value


_legacy = encoder(sort_keys=True, allow_nan=False, default=_legacy_default)


def _legacy_text(value: Any) -> str:
    return _legacy(_legacy_normalise(value))


def derive_key(scope: str, task_id: str, operation: str) -> str:
    """The record key and downstream key: a fixed-length opaque hash of (scope, task, operation)."""
    # == _compact([scope, task_id, operation]), without building an encoder
    return "ag_" + sha(f"[{_ascii(scope)},{_ascii(task_id)},{_ascii(operation)}]")[:48]


def sub_key(key: str, name: str) -> str:
    """A sub-key for one of several foreign calls inside one operation; stable across attempts."""
    return "ag_" + sha(json.dumps([key, name], separators=(",", ":")))[:48]
