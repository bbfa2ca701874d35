"""Shims that give the standard library's own results for less set-up per call.

Each returns exactly what the general spelling returns (the tests compare them); they exist because the
guard's own work per call is a few microseconds, and the general spellings set something up on every call.

- ``encoder(...)``: ``json.JSONEncoder(separators=(",", ":"), ...).encode`` with its C encoder built once,
  not once per ``encode`` (no circular-reference check: a self-referring value raises RecursionError).
- ``scan_plain``: ``json.JSONDecoder().scan_once``, the C scanner alone, for text known to have no tag (no
  object hook to call per object).
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any


def encoder(*, sort_keys: bool = False, ensure_ascii: bool = False, allow_nan: bool = True,
            default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """A compact JSON encoder built once (see the module docstring)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator: the general spelling
        return json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=ensure_ascii,
                                allow_nan=allow_nan, default=default).encode

    def refuse(obj: Any) -> Any:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    strings = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    c_encode = make(None, default or refuse, strings, None, ":", ",", sort_keys, False, allow_nan)
    join = "".join

    def encode(obj: Any) -> str:
        return join(c_encode(obj, 0))

    return encode


__all__ = ["encoder", "scan_plain"]

scan_plain: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed: a decoder is what it takes
)
