"""A guarded call and what becomes of it: the values the state machine passes around, and how a call is built
from a tool, its arguments and the task it belongs to.

``Call``: who (scope, task), what (operation, key, fingerprint) and how (codec, cached errors, conflict
policy). ``Claim``: a call whose key this worker holds, with its fence. ``Replay``: a call answered by a
stored record. ``Outcome``: what :meth:`Guard.run` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _codec
from ._codec import Codec
from ._context import DEFAULT_SCOPE, MAX_OPERATION, MAX_SCOPE, MAX_TASK_ID, check_id, check_task_id, current_task
from ._errors import GuardError, MissingTaskError
from ._keys import argument_hashes, derive_key, hashes_json, operation_name
from ._keys_flat import FlatSignature, flat_fingerprint
from .stores import FAILED, Record

if TYPE_CHECKING:
    from ._lease import Heartbeat

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The result of :meth:`Guard.run`: the (decoded, stored) value and whether it was a replay."""

    value: T
    replayed: bool
    key: str
    operation: str
    task_id: str
    scope: str


@dataclass(slots=True)
class Call:
    scope: str
    task_id: str
    operation: str
    key: str
    fp_args: Mapping[str, Any]
    fingerprint: str
    codec: Codec
    cache_errors: tuple[type[BaseException], ...]
    on_conflict: str
    wait_timeout: float | None
    tool: str
    audit: str | None = None
    arguments: str | None = None  # stored only for resumable tools
    _hashes: dict[str, str] | None = None
    _hashes_json: str | None = None
    flat: tuple[FlatSignature, list[str]] | None = None  # the arguments' canonical JSON, if all are flat
    waited: float = 0.0  # seconds this call waited for another caller of its key (for the ledger, telemetry)
    # What a caller does with a record whose worker went away inside the body (running, its lease run out):
    # "retry" takes it over and runs the body again (right only where the key reaches the provider), "reconcile"
    # takes it over and asks the tool's reconcile first, "hold" leaves it for a person (OutcomeUnknownError).
    on_unknown: str = "hold"

    @property
    def arg_hashes(self) -> dict[str, str]:
        """One short hash per argument (stored at the claim, so a reuse error can name what differs);
        computed only when a claim or an error needs it, never on a cached replay."""
        if self._hashes is None:
            self._hashes = argument_hashes(self.fp_args) if self.flat is None else self.flat[0].hashes(self.flat[1])
        return self._hashes

    @property
    def arg_hashes_json(self) -> str:
        if self._hashes_json is None:
            flat = self.flat
            self._hashes_json = hashes_json(self.arg_hashes) if flat is None else flat[0].hashes_json(flat[1])
        return self._hashes_json

    def error(self, cls: type[GuardError], message: str, **kw: Any) -> Any:
        """``cls(message)`` carrying this call's identity."""
        return cls(message, key=self.key, task_id=self.task_id, operation=self.operation, scope=self.scope, **kw)


class Claim:
    """A call whose key this worker holds: its fence, attempt and origin, and its heartbeat's bookkeeping."""

    __slots__ = ("attempt", "beat", "call", "fence", "gone", "notes", "origin", "renewal", "renewed", "took")

    def __init__(self, call: Call, fence: int, attempt: int, origin: int, took: str | None = None,
                 gone: tuple[int, str | None] | None = None) -> None:
        self.call = call
        self.took = took  # a takeover's: the state it found (running: its worker went away; released)
        # A takeover of a running record: the attempt whose worker went away and its owner token (the ledger's
        # ``went_away`` entry, written with this attempt's own: that process died with its queue).
        self.gone = gone
        self.fence = fence
        self.attempt = attempt
        self.origin = origin
        self.beat: Heartbeat | None = None
        self.renewed = 0.0  # loop time of the claim or of its last renewal
        self.renewal: asyncio.Task[None] | None = None
        self.notes: dict[str, Any] | None = None  # what the body added to the audit (``current_audit()``)

    def audit(self) -> str | None:
        """The audit to store with the outcome: the call's, with the body's notes; None when it has none. Notes
        that cannot be stored are replaced by a note saying why (the outcome matters more than its audit)."""
        if not self.notes:
            return None
        base = _codec.loads(self.call.audit) if self.call.audit else {}
        base = base if isinstance(base, dict) else {}
        try:
            return _codec.dumps({**base, **self.notes})
        except Exception as exc:  # (no stored form, or a value's own code raised)
            why = f"{type(exc).__name__}: {exc}"
            return _codec.dumps({**base, "agentguard": f"the notes of current_audit() could not be stored ({why})"})


class Replay:
    """A call answered by a stored terminal record."""

    __slots__ = ("call", "record", "source")

    def __init__(self, call: Call, record: Record, source: str = "store") -> None:
        self.call = call
        self.record = record
        self.source = source  # "store", or "cache" (the in-process cache: no round trip)

    def result(self) -> Any:
        rec, call = self.record, self.call
        assert rec.result is not None
        if rec.state == FAILED:
            error = _codec.decode_error(rec.result, call.cache_errors)
            if isinstance(error, GuardError):  # (one of agentguard's own, recorded in the body's place)
                error.key, error.task_id = call.key, call.task_id
                error.operation, error.scope = call.operation, call.scope
            raise error
        try:
            return call.codec.decode(rec.result)
        except Exception as exc:  # the stored value no longer fits the tool's return type
            raise call.error(
                GuardError, f"the stored result of {call.operation!r} cannot be decoded as "
                f"{call.codec.annotation!r} ({exc}); the tool was not run again",
            ) from None


# -- building calls ---------------------------------------------------------------------------------------


def make_call(
    tool: str,
    arguments: Mapping[str, Any],
    key_values: Mapping[str, Any] | str | None,
    task_id: str | None,
    scope: str | None,
    codec: Codec,
    cache_errors: tuple[type[BaseException], ...],
    on_conflict: str,
    wait_timeout: float | None,
    audit: str | None = None,
) -> Call:
    """A call of ``tool`` in the given task (else the ``task(...)`` context's), whatever its arguments."""
    if scope is not None:
        scope = check_id(scope, "scope", MAX_SCOPE)
    if task_id is None:
        info = current_task()
        if info is None:
            raise no_task(tool)
        task_id, scope = info.task_id, scope or info.scope
    else:
        task_id = check_task_id(task_id, source="task_id=", tool=tool)
    scope = scope or DEFAULT_SCOPE
    if type(key_values) is str:  # (a key callable's result, or run(key="...")): stored in the operation
        key_values = check_id(key_values, f"the key of {tool!r}", MAX_TASK_ID)
    fp = flat_fingerprint(arguments)
    operation = operation_name(tool, key_values)
    # (positional: this is on every call's path)
    return Call(scope, task_id, operation, derive_key(scope, task_id, operation), arguments, fp, codec,
                cache_errors, on_conflict, wait_timeout, tool, audit)


def flat_call(
    flat: FlatSignature, values: list[str], arguments: Mapping[str, Any], codec: Codec,
    cache_errors: tuple[type[BaseException], ...], on_conflict: str, wait_timeout: float | None,
) -> Call:
    """``make_call`` for a decorated tool whose arguments are all flat (str/int/bool/None), in the task
    context: the same identity from one pass over the arguments' canonical JSON (see ``agentguard._keys_flat``)."""
    info = current_task()
    if info is None:
        raise no_task(flat.tool)
    scope, task_id = info.scope, info.task_id
    operation, key, fp, hashes = flat.identity(scope, task_id, values)
    return Call(scope, task_id, operation, key, arguments, fp, codec, cache_errors, on_conflict, wait_timeout,
                flat.tool, None, None, None, hashes, (flat, values))


def no_task(tool: str) -> MissingTaskError:
    return MissingTaskError(
        f"no task id for {tool!r}: call it inside `with agentguard.task(<task id>):` (or give the adapter a "
        "task_id); the tool was not run",
        operation=tool,
    )


def check_operation(operation: object) -> str:
    """An operation (tool) name: a str (TypeError otherwise) that follows the id rule (ValueError)."""
    if not isinstance(operation, str):
        raise TypeError(f"operation must be a string naming the operation, got {type(operation).__name__} "
                        f"{operation!r}")
    return check_id(operation, "operation", MAX_OPERATION)


def check_errors(cache_errors: Any) -> tuple[type[BaseException], ...]:
    if isinstance(cache_errors, type):
        cache_errors = (cache_errors,)
    if not isinstance(cache_errors, tuple | list) or not all(
        isinstance(c, type) and issubclass(c, Exception) for c in cache_errors
    ):
        raise TypeError(f"cache_errors must be a tuple of Exception classes, got {cache_errors!r}")
    return tuple(cache_errors)
