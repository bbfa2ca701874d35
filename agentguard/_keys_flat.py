"""The flat-argument identity: a shortcut beside the general path of ``agentguard._keys``.

Most tools take only ``str``/``int``/``bool``/``None`` arguments. For them each argument's canonical JSON is
written directly (``json``'s own string escaper, ``int.__repr__``), and a tool's canonical forms are
%-templates built once at decoration, so a call's fingerprint, operation name, key and per-argument hashes
come from one pass over its arguments and one C call per form, and a repeated call (a replay) is served from
a small memo, its per-argument hashes with it (measured against the memo alone, in front of the general path's
functions: without the templates a replay cost 2-3 µs more; docs/benchmarks.md). A mapping of flat arguments
that no signature fixes (``Guard.run``, a proxied MCP call) has its canonical JSON written by the C encoder
alone (``flat_json``). Every result is byte-identical to the general path — ``fingerprint``,
``operation_name``, ``derive_key``, ``argument_hashes`` and ``hashes_json`` in ``agentguard._keys``, which are
the specification — and tests/whitebox/test_whitebox_keys.py compares them on thousands of random calls.
Anything not flat takes the general path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._keys import SURROGATE, _canonical, argument_error, derive_key, encodes, fingerprint, sha

_ascii = json.encoder.encode_basestring_ascii
_unicode = json.encoder.encode_basestring
# The types whose canonical JSON is what the encoder writes (no tag, no escape): for a mapping of them under str
# names, ``canonical_json`` is the C encoder's output, with no walk over the values first.
FLAT = frozenset({str, int, bool, type(None)})


def flat_texts(values: Iterable[Any]) -> list[str] | None:
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


def flat_json(arguments: Mapping[str, Any]) -> str | None:
    """The canonical JSON of a mapping of str/int/bool/None values under str names, written by the C encoder
    alone (byte-identical to ``canonical_json``), or None when a name or value needs the general path."""
    for name, value in arguments.items():
        if type(name) is not str or type(value) not in FLAT:
            return None
    try:
        return _canonical(arguments)
    except ValueError:  # more digits than int -> str allows: the general path names the argument
        return None


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
        self._memo: dict[tuple[str, str, str], tuple[str, str, str, str]] = {}

    def values(self, arguments: Mapping[str, Any]) -> list[str] | None:
        """Each argument's canonical JSON, in name order; None when one needs the general path."""
        if len(arguments) != len(self.names):
            return None
        return flat_texts(map(arguments.__getitem__, self.names))

    def identity(self, scope: str, task_id: str, values: Sequence[str]) -> tuple[str, str, str, str]:
        """``(operation, key, fingerprint, hashes_json)`` of a call in a task. Each is a pure function of the
        scope, the task id and the arguments' canonical JSON, so a repeat of the same call is served from a small
        memo. (The per-argument hashes come with the rest: every claim's parameters carry them, a replay's read too.)"""
        text = self._text % tuple(values)
        memo = self._memo
        found = memo.get((scope, task_id, text))
        if found is None:
            try:
                fp = sha(text)
            except UnicodeEncodeError:  # (a lone surrogate, which a model's JSON can carry)
                raise self._unencodable(values) from None
            operation = self.operation(values)
            found = (operation, derive_key(scope, task_id, operation), fp, self.hashes_json(values))
            if len(text) <= self.MEMO_TEXT:
                if len(memo) >= self.MEMO:
                    memo.clear()  # (a memo, not a cache of outcomes: forgetting costs the digests)
                memo[(scope, task_id, text)] = found
        return found

    def _unencodable(self, values: Sequence[str]) -> TypeError:
        for name, text in zip(self.names, values, strict=True):
            if not encodes(text):
                return argument_error(name, SURROGATE)
        raise AssertionError("some argument failed to encode")  # pragma: no cover - identity's text is theirs

    def operation(self, values: Sequence[str]) -> str:
        index = self._key_index
        if not index:
            return self.tool
        if len(index) == 1:
            return self._op_text % (values[index[0]],)
        return self._op_text % tuple([values[i] for i in index])

    def hashes(self, values: Sequence[str]) -> dict[str, str]:
        return {n: sha(v)[:24] for n, v in zip(self.names, values, strict=True)}

    def hashes_json(self, values: Sequence[str]) -> str:
        """``hashes_json(self.hashes(values))``, without the dict: what a claim stores."""
        return self._hash_text % tuple([sha(v)[:24] for v in values])


def _pct(text: str) -> str:
    return text.replace("%", "%%")


def flat_fingerprint(arguments: Mapping[str, Any]) -> str:
    """``fingerprint(arguments)``, written in one pass when every argument is flat."""
    flat = flat_json(arguments)
    if flat is not None and encodes(flat):
        return sha(flat)
    return fingerprint(arguments)  # the general path, which also names an argument without a canonical form
