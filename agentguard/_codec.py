"""Result (de)serialisation: a pydantic TypeAdapter of the return annotation over a tagged JSON form.

The first caller receives the *decoded stored* value, exactly as every replay does, so first call and
replays can never disagree. Tags keep the Python types that plain JSON loses (Decimal, tuple, datetime,
bytes, sets, non-string dict keys), so even an un-annotated tool replays ``Decimal("0.10")`` as a Decimal
and ``()`` as a tuple rather than as a string or a list.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import importlib
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, PydanticUserError, TypeAdapter

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


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_decode = json.JSONDecoder(object_hook=_hook).decode


def dumps(obj: Any, *, typed: bool = False) -> str:
    return _encode(_tag(obj, typed=typed))


def loads(text: str) -> Any:
    return _decode(text)


class Codec:
    """Encodes a tool's return value for storage and decodes it for the caller and every replay."""

    __slots__ = ("_adapter", "annotation")

    def __init__(self, annotation: Any = Any) -> None:
        self.annotation = annotation
        self._adapter: TypeAdapter[Any] | None = None
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
        raw = loads(text)
        return raw if self._adapter is None else self._adapter.validate_python(raw)


def encode_error(exc: BaseException) -> str:
    cls = type(exc)
    try:
        args: Any = _tag(list(exc.args), typed=False)
    except TypeError:
        args = None
    return json.dumps({"type": f"{cls.__module__}:{cls.__qualname__}", "message": str(exc), "args": args})


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
