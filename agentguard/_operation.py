"""Multi-step operations: atomic phases with recovery points (Brandur Leach's Rocket Rides design).

A tool that creates a local row, charges a card and sends a receipt takes an ``Operation`` parameter and
runs each phase through it. ``op.transaction`` commits the tool's own writes together with the recovery
point; ``op.step`` brackets a foreign call with a durable "started" mark and a durable result. A retry or a
takeover resumes after the last recorded phase. A worker that died *inside* a foreign call leaves a started
mark without a result: an unknown outcome, settled by the tool's ``on_unknown`` policy.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, ParamSpec, Protocol, TypeVar, overload

from sqlalchemy.ext.asyncio import AsyncConnection

from ._codec import Codec
from ._errors import GuardError, OutcomeUnknownError, StepOrderError
from ._keys import sub_key
from ._shapes import Shape, shape_key
from ._storeconfig import resolve_command
from .stores import DONE, STARTED

__all__ = ["Identity", "Operation", "Reconcile", "StepLog", "StepOrderError"]

P = ParamSpec("P")
T = TypeVar("T")

Reconcile = Callable[["Operation", str, str], Awaitable[Any]]
Row = tuple[str, int, str, "str | None"]  # a recorded step: name, position, state, result


def _return_hint(fn: Any) -> Any:
    try:
        return typing.get_type_hints(fn).get("return", Any)
    except Exception:  # lambdas, partials, builtins, unresolvable forward references: untyped replay
        return Any


class Identity(NamedTuple):
    """Whose steps: the operation's downstream key, task, scope and name, and this attempt's number."""

    key: str
    task_id: str
    scope: str
    operation: str
    attempt: int


class StepLog(Protocol):
    """What an ``Operation`` needs of the claim it runs under: its identity and its recorded steps, every
    write fenced on the claim (``LeaseLostError`` once another worker took it over). The engine provides it."""

    @property
    def identity(self) -> Identity: ...

    @property
    def store_url(self) -> str:
        """The store's URL, for the command a person runs to settle a held outcome."""
        ...

    def codec_for(self, annotation: Any) -> Codec: ...

    def error(self, cls: type[GuardError], message: str, **kw: Any) -> Any: ...

    def report_unknown(self, step: str) -> None: ...

    async def load(self) -> list[Row]: ...

    async def put(self, seq: int, name: str, state: str, result: str | None) -> None: ...

    async def record(self, seq: int, name: str, result: str) -> None:
        """The step ran: its result, written through a short store outage (never lost to one)."""

    async def clear(self, name: str) -> None:
        """The step raised: its started mark, cleared through a short store outage."""

    async def transaction(
        self, seq: int, name: str, fn: Callable[[AsyncConnection], Awaitable[Any]], encode: Callable[[Any], str]
    ) -> str:
        """``fn(conn)`` in a transaction on the store's database that first re-checks the claim and commits
        the step as done with ``encode(fn's result)``; returns what was stored."""


class Operation:
    """Injected into a guarded tool that declares a parameter annotated ``Operation``."""

    def __init__(self, steps: StepLog, on_unknown: str, reconcile: Reconcile | None) -> None:
        self._steps = steps
        self._on_unknown = on_unknown
        self._reconcile = reconcile
        self._recorded: dict[int, tuple[str, str, str | None]] | None = None
        self._names: set[str] = set()
        self._seq = 0

    # -- identity -------------------------------------------------------------------------------------

    @property
    def downstream_key(self) -> str:
        """The operation's own downstream key (what ``idempotency_key`` receives)."""
        return self._steps.identity.key

    @property
    def task_id(self) -> str:
        return self._steps.identity.task_id

    @property
    def scope(self) -> str:
        return self._steps.identity.scope

    @property
    def operation(self) -> str:
        return self._steps.identity.operation

    @property
    def attempt(self) -> int:
        """1 on the first claim, one more on each takeover."""
        return self._steps.identity.attempt

    def key(self, name: str, *, shape: Shape = None) -> str:
        """A sub-key for the foreign call of step ``name``: per step, per operation, per task; identical on
        every attempt and takeover. ``shape``: written for a provider that takes shorter keys (``"square"``,
        a maximum length, a ``downstream.KeyShape``)."""
        key = sub_key(self._steps.identity.key, name)
        return key if shape is None else shape_key(key, shape)

    def __repr__(self) -> str:
        return f"Operation({self.operation!r}, task={self.task_id!r}, attempt={self.attempt})"

    # -- bookkeeping ----------------------------------------------------------------------------------

    async def _load(self) -> dict[int, tuple[str, str, str | None]]:
        if self._recorded is None:
            rows = await self._steps.load()
            self._recorded = {seq: (name, state, result) for name, seq, state, result in rows}
        return self._recorded

    async def _next(self, name: str) -> tuple[int, tuple[str, str, str | None] | None]:
        if not isinstance(name, str) or not name:
            raise TypeError("a step name must be a non-empty string")
        recorded = await self._load()
        if name in self._names:
            raise self._steps.error(StepOrderError, f"step {name!r} was called twice in {self.operation!r}; "
                                                    "step names are unique within an operation. Nothing was run.")
        seq = self._seq
        self._names.add(name)
        self._seq += 1
        rec = recorded.get(seq)
        if (rec is not None and rec[0] != name) or (
            rec is None and any(r[0] == name for r in recorded.values())
        ):
            was = rec[0] if rec is not None else "nothing"
            raise self._steps.error(
                StepOrderError,
                f"step #{seq + 1} of {self.operation!r} was {was!r} on an earlier attempt but is {name!r} now: "
                "steps must run in the same order on every attempt. Nothing was run.",
            )
        return seq, rec

    # -- phases ---------------------------------------------------------------------------------------

    @overload
    async def step(self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    @overload
    async def step(self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def step(self, name: str, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this operation and record its result durably (fenced).

        On a retry or takeover a recorded step returns its stored result (same type) without running.
        """
        seq, rec = await self._next(name)
        codec = self._steps.codec_for(_return_hint(fn))
        if rec is not None and rec[1] == DONE:
            assert rec[2] is not None
            return codec.decode(rec[2])
        if rec is not None and rec[1] == STARTED:
            # The worker that held the claim before us died inside this step: its outcome is unknown.
            found = await self._settle_unknown(name, seq, codec)
            if found is not None:
                return found[0]
        await self._steps.put(seq, name, STARTED, None)
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except BaseException:
            await self._steps.clear(name)  # it raised: its outcome is known (it failed)
            raise
        try:
            encoded = codec.encode(value)
        except (TypeError, ValueError) as exc:
            raise self._steps.error(GuardError, f"the result of step {name!r} could not be stored ({exc}); the "
                                                "step ran, so its outcome stays unknown for the next attempt") from None
        await self._steps.record(seq, name, encoded)
        return codec.decode(encoded)

    async def _settle_unknown(self, name: str, seq: int, codec: Codec) -> tuple[Any] | None:
        policy = self._on_unknown
        self._steps.report_unknown(name)
        if policy == "hold":
            raise self._steps.error(
                OutcomeUnknownError,
                f"step {name!r} of {self.operation!r} started on an earlier attempt whose worker died before "
                "recording its outcome; on_unknown='hold', so nothing more was run. Settle it with "
                f"`{resolve_command(self._steps.store_url, self.downstream_key, self.scope)}`.",
                step=name,
            )
        if policy == "reconcile":
            assert self._reconcile is not None
            found = await self._reconcile(self, name, self.key(name))
            if found is not None:
                encoded = codec.encode(found)
                await self._steps.put(seq, name, DONE, encoded)
                return (codec.decode(encoded),)
        return None  # "retry", or reconciled as "did not happen": run it again with the same sub-key

    async def transaction(self, name: str, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Call ``fn(conn)`` in a transaction on the guard's own database whose commit also records this
        step and ``fn``'s result: the tool's local writes and the recovery point commit together or not at
        all. A recorded transaction returns its stored result without calling ``fn``."""
        seq, rec = await self._next(name)
        codec: Codec = self._steps.codec_for(_return_hint(fn))
        if rec is not None and rec[1] == DONE:
            assert rec[2] is not None
            decoded: T = codec.decode(rec[2])
            return decoded

        def encode(value: Any) -> str:
            try:
                return codec.encode(value)
            except (TypeError, ValueError) as exc:
                raise self._steps.error(GuardError, f"the result of transaction {name!r} cannot be stored ({exc}); "
                                                    "it was rolled back") from None

        result: T = codec.decode(await self._steps.transaction(seq, name, fn, encode))
        return result
