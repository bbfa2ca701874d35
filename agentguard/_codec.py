"""Result (de)serialisation: a pydantic TypeAdapter of the return annotation over a tagged JSON form.

The first caller receives the *decoded stored* value, exactly as every replay does, so first call and
replays can never disagree. Tags keep the Python types that plain JSON loses (Decimal, tuple, datetime,
bytes, sets, non-string dict keys), so even an un-annotated tool replays ``Decimal("0.10")`` as a Decimal
and ``()`` as a tuple rather than as a string or a list.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import importlib
import json
import math
import re
import typing
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, PydanticUserError, TypeAdapter

from ._stdlib_shims import encoder, scan_plain

_TAG = "$ag"


def _tag(obj: Any, *, typed: bool) -> Any:
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_TAG: "float", "v": repr(obj)}
    if isinstance(obj, list):
        return [_tag(v, typed=typed) for v in obj]
    if isinstance(obj, dict):
        if _TAG not in obj and all(type(k) is str for k in obj):
            return {k: _tag(v, typed=typed) for k, v in obj.items()}
        return {_TAG: "dict", "v": [[_tag(k, typed=typed), _tag(v, typed=typed)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "v": [_tag(v, typed=typed) for v in obj]}
    if isinstance(obj, decimal.Decimal):
        return {_TAG: "decimal", "v": str(obj)}
    if isinstance(obj, dt.datetime):
        return {_TAG: "datetime", "v": obj.isoformat()}
    if isinstance(obj, dt.date):
        return {_TAG: "date", "v": obj.isoformat()}
    if isinstance(obj, dt.time):
        return {_TAG: "time", "v": obj.isoformat()}
    if isinstance(obj, dt.timedelta):
        return {_TAG: "timedelta", "v": [obj.days, obj.seconds, obj.microseconds]}
    if isinstance(obj, uuid.UUID):
        return {_TAG: "uuid", "v": str(obj)}
    if isinstance(obj, bytes | bytearray):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, frozenset):
        return {_TAG: "frozenset", "v": [_tag(v, typed=typed) for v in obj]}
    if isinstance(obj, set):
        return {_TAG: "set", "v": [_tag(v, typed=typed) for v in obj]}
    if typed and isinstance(obj, enum.Enum):
        return _tag(obj.value, typed=typed)
    hint = " (annotate the tool's return type so it can be rebuilt)" if not typed else ""
    raise TypeError(f"a value of type {type(obj).__qualname__} cannot be stored{hint}")


_UNTAG: dict[str, Callable[[Any], Any]] = {
    "float": float,
    "dict": lambda v: {k: x for k, x in v},
    "tuple": tuple,
    "decimal": decimal.Decimal,
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": uuid.UUID,
    "bytes": base64.b64decode,
    "frozenset": frozenset,
    "set": set,
}


def _hook(d: dict[str, Any]) -> Any:
    tag = d.get(_TAG)
    if tag is None:
        return d
    return _UNTAG[tag](d["v"])


_encode = encoder()
_decode_tagged = json.JSONDecoder(object_hook=_hook).decode
_TAG_KEY = f'"{_TAG}"'


def _decode(text: str) -> Any:
    """Our stored JSON back to values. Text with no ``"$ag"`` in it has no tag (the encoder writes that key
    literally): the C scanner alone reads it, without a hook call per object."""
    if _TAG_KEY not in text:
        try:
            value, end = scan_plain(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return _decode_tagged(text)


# Plain JSON values only (no NaN, no types JSON lacks): the fast path of Codec.store.
_plain = encoder(allow_nan=False)


def _children(value: Any) -> Iterable[Any]:
    """What a walk of ``value`` descends into (the fingerprint's walk and the codec's alike)."""
    if isinstance(value, dict):
        return [*value, *value.values()]
    if isinstance(value, list | tuple | set | frozenset):
        return value
    if isinstance(value, BaseModel):
        return [*value.__dict__.values(), *(value.__pydantic_extra__ or {}).values()]
    if isinstance(value, enum.Enum):
        return (value.value,)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    return ()


_LEAVES = (str, int, float, bool, type(None))


def refers_to_itself(value: Any) -> bool:
    """Whether ``value`` contains itself (a list holding itself, a dict holding its parent): what tells a
    walk that ran out of depth on a cycle from one that met deep nesting. An explicit stack, each container
    once: linear in the containers, and no recursion of its own."""
    path = {id(value)}
    done: set[int] = set()
    stack = [(value, iter(_children(value)))]
    while stack:
        node, items = stack[-1]
        for child in items:
            if type(child) in _LEAVES:
                continue
            ident = id(child)
            if ident in path:
                return True
            if ident not in done:
                path.add(ident)
                stack.append((child, iter(_children(child))))
                break
        else:
            stack.pop()
            path.discard(id(node))
            done.add(id(node))
    return False


MAX_DEPTH = 500  # containers within containers in a stored result: every supported Python reads it back
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]")


def _deeper_than(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` nests containers more than ``limit`` deep. (How deep a value may nest before
    the JSON codecs give up differs between Python versions — 3.13's C stack allows far more than 3.11's — so
    the limit is explicit: a result one worker stores, every worker can replay.) Counted at C speed first: text
    with at most ``limit`` opening brackets cannot nest deeper."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for ch in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        depth += 1 if ch in "[{" else -1
        if depth > limit:
            return True
    return False


def _too_deep(value: Any) -> ValueError:
    if refers_to_itself(value):
        return ValueError("the value refers to itself, so it cannot be stored")
    return ValueError("the value is nested too deeply to be stored")


_SURROGATE = "the value contains a lone surrogate (not valid Unicode text), which no store can hold"


def _check_text(text: str) -> str:
    """``text`` if both stores can hold it (ASCII is checked in O(1)); else ValueError."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise ValueError(_SURROGATE) from None
    return text


def dumps(obj: Any, *, typed: bool = False) -> str:
    """Our stored JSON of ``obj``. Raises TypeError/ValueError when it cannot be stored."""
    try:
        text = _encode(_tag(obj, typed=typed))
    except RecursionError:
        raise _too_deep(obj) from None
    if _deeper_than(text):
        raise _too_deep(obj)
    return _check_text(text)


def loads(text: str) -> Any:
    return _decode(text)


# Annotations that accept every decoded JSON object (or array) unchanged: validating one is a copy, so a
# decoded value of exactly that type is returned as it is.
_UNCHANGED: dict[Any, type] = {
    dict[str, Any]: dict, typing.Dict[str, Any]: dict, dict: dict,  # noqa: UP006
    list[Any]: list, typing.List[Any]: list, list: list,  # noqa: UP006
}


class Codec:
    """Encodes a tool's return value for storage and decodes it for the caller and every replay."""

    __slots__ = ("_adapter", "_unchanged", "annotation")

    def __init__(self, annotation: Any = Any) -> None:
        self.annotation = annotation
        self._adapter: TypeAdapter[Any] | None = None
        try:
            self._unchanged: type | None = _UNCHANGED.get(annotation)
        except TypeError:  # unhashable annotation
            self._unchanged = None
        if annotation is not Any:
            try:
                self._adapter = TypeAdapter(annotation)
            except PydanticUserError as exc:
                raise TypeError(f"return annotation {annotation!r} cannot be stored and replayed: {exc}") from None

    def encode(self, value: Any) -> str:
        """Raises TypeError/ValueError when the value cannot be stored."""
        if self._adapter is None:
            if isinstance(value, BaseModel):
                raise TypeError(
                    f"a {type(value).__qualname__} model cannot be rebuilt without a return annotation"
                )
            return dumps(value)
        adapter = self._adapter
        try:
            py = adapter.dump_python(value, mode="python", warnings="error")
        except Exception:  # not an instance of the annotation: coerce it, as the replay will
            try:
                py = adapter.dump_python(adapter.validate_python(value), mode="python", warnings="error")
            except Exception as exc:  # pydantic raises several types here; all mean "not storable"
                first = str(exc).strip().splitlines()[0]
                raise TypeError(f"result does not fit the return annotation {self.annotation!r}: {first}") from None
        return dumps(py, typed=True)

    def decode(self, text: str) -> Any:
        raw = _decode(text)
        if self._adapter is None or (type(raw) is self._unchanged and _TAG_KEY not in text):
            return raw  # (untagged: plain JSON, whose object keys are all strings)
        return self._adapter.validate_python(raw)

    def store(self, value: Any) -> tuple[str, Any]:
        """``(encode(value), decode(encode(value)))``: the text to store and what every caller receives.

        A value that is plain JSON already (str-keyed dicts, lists, str, int, finite float, bool, None, and
        no dict that looks like a tag) is written by the C encoder alone and read back once: that read is
        both the proof that nothing was lost (it compares equal, and a tuple, a non-string key or a tag
        never would) and the decoded value. Anything else takes the general path of ``encode``.
        """
        try:
            text = _plain(value)
            raw = _decode(text)
            same = bool(raw == value)
        except Exception:  # (the value's own ``__eq__`` may raise anything): the general path decides
            same = False
        if same:
            if _deeper_than(text):
                raise _too_deep(value)
            _check_text(text)
            if self._adapter is None or type(raw) is self._unchanged:
                return text, raw
            try:
                return text, self._adapter.validate_python(raw)
            except Exception:  # not of the annotated type: the general path coerces it, or says why not
                pass
        text = self.encode(value)
        try:
            return text, self.decode(text)
        except RecursionError:  # (its tags nest deeper than the value itself)
            raise _too_deep(value) from None


def encode_error(exc: BaseException) -> str:
    cls = type(exc)
    try:
        args: Any = _tag(list(exc.args), typed=False)
    except Exception:  # (no stored form, or an argument's own code raised): rebuilt from the message
        args = None
    try:
        message = str(exc)
    except Exception as why:  # the exception's own __str__ raised: its class still says what happened
        message, args = f"({cls.__qualname__}, whose message could not be read: {type(why).__name__})", None
    return json.dumps({"type": f"{cls.__module__}:{cls.__qualname__}", "message": message, "args": args})


def _find_class(path: str, candidates: tuple[type[BaseException], ...]) -> type[BaseException] | None:
    stack = list(candidates)
    while stack:
        cls = stack.pop()
        if f"{cls.__module__}:{cls.__qualname__}" == path:
            return cls
        stack.extend(cls.__subclasses__())
    module, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None


def decode_error(text: str, candidates: tuple[type[BaseException], ...]) -> BaseException:
    """Rebuild a cached error: same class, same message."""
    data = json.loads(text, object_hook=_hook)
    cls = _find_class(data["type"], candidates)
    message: str = data["message"]
    if cls is None:
        return RuntimeError(f"{data['type']}: {message} (replayed; the original class could not be imported)")
    if data["args"] is not None:
        try:
            exc = cls(*data["args"])
            if str(exc) == message:
                return exc
        except Exception:  # a constructor with other required arguments: rebuild below
            pass
    exc = cls.__new__(cls)
    exc.args = (message,)
    return exc
