"""The engine's side of a multi-step operation: the ``StepLog`` an ``Operation`` runs on.

Every write is fenced on the claim (a transaction that first re-checks, locks and renews it), so a worker
whose claim was taken over records nothing; a step's result, and the clearing of a step that raised, are
written through a short store outage (the step already ran: losing its record would leave its outcome
unknown for the next attempt).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from ._calls import Claim
from ._codec import Codec
from ._drivers import uncancellable
from ._engine import Engine
from ._errors import GuardError
from ._operation import Identity, Row
from .stores import DONE


class ClaimSteps:
    """The steps of the operation a claim runs (implements ``agentguard._operation.StepLog``)."""

    __slots__ = ("_claim", "_codec_for", "_engine")

    def __init__(self, engine: Engine, claim: Claim, codec_for: Callable[[Any], Codec]) -> None:
        self._engine = engine
        self._claim = claim
        self._codec_for = codec_for

    @property
    def identity(self) -> Identity:
        call = self._claim.call
        return Identity(call.key, call.task_id, call.scope, call.operation, self._claim.attempt)

    @property
    def store_url(self) -> str:
        return self._engine.store.url

    def codec_for(self, annotation: Any) -> Codec:
        return self._codec_for(annotation)

    def error(self, cls: type[GuardError], message: str, **kw: Any) -> Any:
        return self._claim.call.error(cls, message, **kw)

    def report_unknown(self, step: str) -> None:
        self._engine.events.emit("takeover", self._claim.call, self._claim.attempt, f"unknown outcome of step {step!r}")

    async def load(self) -> list[Row]:
        c, engine = self._claim.call, self._engine
        return await engine.store_call(engine.store.load_steps(c.scope, c.key, self._claim.origin))

    async def put(self, seq: int, name: str, state: str, result: str | None) -> None:
        claim, engine = self._claim, self._engine
        c = claim.call
        if not await engine.store_call(engine.store.put_step(
            c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=engine.lease, name=name, seq=seq,
            state=state, result=result,
        )):
            raise engine.lease_lost(claim)

    async def record(self, seq: int, name: str, result: str) -> None:
        await uncancellable(self._engine.settled(
            self._claim, f"recording step {name!r}", lambda: self.put(seq, name, DONE, result), heartbeat=False
        ))

    async def clear(self, name: str) -> None:
        claim, engine = self._claim, self._engine
        c = claim.call
        await uncancellable(engine.settled(claim, f"clearing step {name!r}", lambda: engine.store_call(
            engine.store.clear_step(c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=engine.lease,
                                    name=name)
        ), heartbeat=False))  # (not ours any more: a takeover decides about the mark; nothing to raise)

    async def transaction(
        self, seq: int, name: str, fn: Callable[[AsyncConnection], Awaitable[Any]], encode: Callable[[Any], str]
    ) -> str:
        claim, engine = self._claim, self._engine
        c = claim.call

        async def run() -> str:
            async with engine.store.step_transaction(
                c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=engine.lease, name=name, seq=seq
            ) as tx:
                if tx is None:
                    raise engine.lease_lost(claim)
                encoded = encode(await fn(tx.connection))
                await tx.record(encoded)
                return encoded

        return await engine.store_call(run())
