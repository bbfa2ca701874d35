"""Key, downstream key and fingerprint derivation: pure functions, no I/O.

The key is derived from (scope, task, operation) and never from the attempt, so every re-invocation of the
same operation in the same task meets the same record. Keys and fingerprints are hashes: no personal data
reaches the key column or the provider.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ._codec import encoder

# CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before): the same digest as hashlib's OpenSSL one,
# with far less set-up per digest. A call takes four (key, fingerprint, one per argument), and measured
# under real I/O that set-up was a tenth of the guard's own time. OpenSSL's where neither is built in.
try:
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the Python version
    try:
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    except ImportError:
        _sha256 = hashlib.sha256


def _default(obj: Any) -> Any:
    # Only called for values json cannot encode natively; each branch yields a stable, typed form.
    if isinstance(obj, BaseModel):
        return _normalise(obj.model_dump(mode="json"))
    if isinstance(obj, decimal.Decimal):
        if not obj.is_finite():
            raise TypeError(f"non-finite Decimal {obj!r} has no canonical form")
        return {"$decimal": str(obj.normalize())}
    if isinstance(obj, dt.datetime):
        return {"$datetime": obj.isoformat()}
    if isinstance(obj, dt.date):
        return {"$date": obj.isoformat()}
    if isinstance(obj, dt.time):
        return {"$time": obj.isoformat()}
    if isinstance(obj, dt.timedelta):
        return {"$timedelta": obj.total_seconds()}
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, set | frozenset):
        return sorted(canonical_json(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _normalise(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    raise TypeError(f"cannot canonicalise a value of type {type(obj).__qualname__}")


def _normalise(value: Any) -> Any:
    # json renders 1.0 and 1 differently; a fingerprint must not. Containers are walked (cheaply: the
    # common flat str/int arguments fall straight through).
    t = type(value)
    if t is float:
        return int(value) if value.is_integer() else value
    if t is dict:
        return {k: _normalise(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_normalise(v) for v in value]
    return value


# Encoders built once: json.dumps(..., **options) builds a new encoder on every call.
_canonical = encoder(sort_keys=True, allow_nan=False, default=_default)
_compact = encoder(sort_keys=True, ensure_ascii=True)


_ascii = json.encoder.encode_basestring_ascii
_unicode = json.encoder.encode_basestring


def _flat_texts(values: Iterable[Any]) -> list[str] | None:
    """Each value's canonical JSON if every one is a str/int/bool/None (what ``canonical_json`` gives), else
    None: the general encoder is needed."""
    out = []
    try:
        for v in values:
            t = type(v)
            if t is str:
                out.append(_unicode(v))
            elif t is int:
                out.append(int.__repr__(v))
            elif v is None:
                out.append("null")
            elif t is bool:
                out.append("true" if v else "false")
            else:
                return None
    except ValueError:  # more digits than int -> str allows: the general path names the argument
        return None
    return out


def _flat(arguments: Mapping[str, Any]) -> str | None:
    """The canonical JSON of a flat mapping of str/int/bool/None values, built directly (byte-identical
    to ``canonical_json``), or None when a value needs the general encoder."""
    names = sorted(arguments)
    texts = _flat_texts(map(arguments.__getitem__, names))
    if texts is None:
        return None
    return "{" + ",".join([_unicode(k) + ":" + t for k, t in zip(names, texts)]) + "}"  # noqa: B905 - one per name


class FlatSignature:
    """The identity of calls to one tool whose arguments are all str/int/bool/None — the common case —
    built in one pass over names fixed at decoration: byte-identical to ``fingerprint``, ``operation_name``,
    ``argument_hashes`` and ``hashes_json``, which the general path (and the tests) use."""

    __slots__ = ("_hash_text", "_key_index", "_memo", "_op_text", "_text", "names", "tool")

    MEMO = 1024  # identities remembered per tool: a repeated call (a replay) hashes nothing
    MEMO_TEXT = 2048  # arguments longer than this as JSON are not kept (their hashing is not the cost)

    def __init__(self, tool: str, names: Sequence[str], key_fields: Sequence[str]) -> None:
        ordered = sorted(names)
        index = {n: i for i, n in enumerate(ordered)}
        keys = sorted(set(key_fields))  # every key field is a name
        self.tool = tool
        self.names = tuple(ordered)
        # %-templates of the canonical forms (one C call fills each; a name's own "%" is escaped):
        # {"a":%s,"b":%s}, {"a":"%s","b":"%s"} for the hashes, and tool[k=%s] for the operation.
        self._text = "{" + ",".join(_pct(_unicode(n) + ":") + "%s" for n in ordered) + "}"
        self._hash_text = "{" + ",".join(_pct(_ascii(n) + ':"') + '%s"' for n in ordered) + "}"
        self._key_index = tuple(index[k] for k in keys)
        self._op_text = _pct(tool) + "[" + ",".join(_pct(f"{k}=") + "%s" for k in keys) + "]"
        self._memo: dict[tuple[str, str, str], tuple[str, str, str]] = {}

    def values(self, arguments: Mapping[str, Any]) -> list[str] | None:
        """Each argument's canonical JSON, in name order; None when one needs the general path."""
        if len(arguments) != len(self.names):
            return None
        return _flat_texts(map(arguments.__getitem__, self.names))

    def identity(self, scope: str, task_id: str, values: Sequence[str]) -> tuple[str, str, str]:
        """``(operation, key, fingerprint)`` of a call in a task. Each is a pure function of the scope, the
        task id and the arguments' canonical JSON, so a repeat of the same call is served from a small memo.
        (The per-argument hashes are left to ``hashes_json``: only a claim or a reuse error needs them.)"""
        text = self._text % tuple(values)
        memo = self._memo
        found = memo.get((scope, task_id, text))
        if found is None:
            operation = self.operation(values)
            found = (operation, derive_key(scope, task_id, operation), _sha(text))
            if len(text) <= self.MEMO_TEXT:
                if len(memo) >= self.MEMO:
                    memo.clear()  # (a memo, not a cache of outcomes: forgetting costs two digests)
                memo[(scope, task_id, text)] = found
        return found

    def operation(self, values: Sequence[str]) -> str:
        index = self._key_index
        if not index:
            return self.tool
        if len(index) == 1:
            return self._op_text % (values[index[0]],)
        return self._op_text % tuple([values[i] for i in index])

    def hashes(self, values: Sequence[str]) -> dict[str, str]:
        return {n: _sha(v)[:24] for n, v in zip(self.names, values, strict=True)}

    def hashes_json(self, values: Sequence[str]) -> str:
        """``hashes_json(self.hashes(values))``, without the dict: what a claim stores."""
        return self._hash_text % tuple([_sha(v)[:24] for v in values])


def _pct(text: str) -> str:
    return text.replace("%", "%%")


def canonical_json(value: Any) -> str:
    """The canonical JSON form used for fingerprints: sorted keys, no whitespace, typed extras."""
    t = type(value)
    if t is str:
        return _unicode(value)  # what the encoder writes for a str
    if t is int or t is bool or value is None:
        return "null" if value is None else ("true" if value is True else "false") if t is bool else str(value)
    return _canonical(_normalise(value))


def _sha(text: str) -> str:
    digest: str = _sha256(text.encode()).hexdigest()
    return digest


def argument_hashes(arguments: Mapping[str, Any]) -> dict[str, str]:
    """One short hash per argument, so a reuse error can name what differs without storing values.

    Raises TypeError naming the argument that has no canonical form.
    """
    out: dict[str, str] = {}
    for name, value in arguments.items():
        try:
            out[name] = _sha(canonical_json(value))[:24]
        except RecursionError:
            raise TypeError(f"argument {name!r} cannot be fingerprinted: it refers to itself") from None
        except (TypeError, ValueError) as exc:
            raise TypeError(f"argument {name!r} cannot be fingerprinted: {exc}") from None
    return out


def fingerprint(arguments: Mapping[str, Any]) -> str:
    """A hash of the canonical JSON of the arguments that affect the outcome (one encode, one hash).

    Raises TypeError naming the argument that has no canonical form.
    """
    flat = _flat(arguments)
    if flat is not None:
        return _sha(flat)
    try:
        return _sha(_canonical(_normalise(dict(arguments))))
    except (TypeError, ValueError, RecursionError):
        argument_hashes(arguments)  # names the culprit
        raise


def hashes_json(hashes: Mapping[str, str]) -> str:
    # == _compact(hashes) (sorted keys, ASCII escapes; the values are hex), without the encoder's setup
    return "{" + ",".join(f'{_ascii(k)}:"{hashes[k]}"' for k in sorted(hashes)) + "}"


def operation_name(tool: str, key_values: Mapping[str, Any] | str | None) -> str:
    """The readable operation: ``charge`` or ``charge[order_id="o-1"]``. Stored for audit only."""
    if key_values is None:
        return tool
    if isinstance(key_values, str):
        return f"{tool}[{key_values}]"
    if not key_values:
        return tool
    try:
        inner = ",".join(f"{k}={canonical_json(v)}" for k, v in sorted(key_values.items()))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"key field of {tool!r} cannot be canonicalised: {exc}") from None
    return f"{tool}[{inner}]"


def derive_key(scope: str, task_id: str, operation: str) -> str:
    """The record key and downstream key: a fixed-length opaque hash of (scope, task, operation)."""
    # == _compact([scope, task_id, operation]), without building an encoder
    return "ag_" + _sha(f"[{_ascii(scope)},{_ascii(task_id)},{_ascii(operation)}]")[:48]


def sub_key(key: str, name: str) -> str:
    """A sub-key for one of several foreign calls inside one operation; stable across attempts."""
    return "ag_" + _sha(json.dumps([key, name], separators=(",", ":")))[:48]
