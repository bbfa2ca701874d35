"""The state machine's side of a multi-step operation: the ``StepLog`` an ``Operation`` runs on.

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
from ._drive import run, uncancellable
from ._errors import GuardError
from ._machine import Machine, Run
from ._operation import Identity, Row
from .stores import DONE


class ClaimSteps:
    """The steps of the operation a claim runs (implements ``agentguard._operation.StepLog``)."""

    __slots__ = ("_claim", "_codec_for", "_machine")

    def __init__(self, machine: Machine, claim: Claim, codec_for: Callable[[Any], Codec]) -> None:
        self._machine = machine
        self._claim = claim
        self._codec_for = codec_for

    @property
    def identity(self) -> Identity:
        call = self._claim.call
        return Identity(call.key, call.task_id, call.scope, call.operation, self._claim.attempt)

    @property
    def store_url(self) -> str:
        return self._machine.store.url

    def codec_for(self, annotation: Any) -> Codec:
        return self._codec_for(annotation)

    def error(self, cls: type[GuardError], message: str, **kw: Any) -> Any:
        return self._claim.call.error(cls, message, **kw)

    def report_unknown(self, step: str) -> None:
        claim = self._claim
        self._machine.events.emit("takeover", claim.call, claim.attempt, f"unknown outcome of step {step!r}")

    async def load(self) -> list[Row]:
        c, machine = self._claim.call, self._machine
        return await machine.store_call(machine.store.load_steps(c.scope, c.key, self._claim.origin))

    async def put(self, seq: int, name: str, state: str, result: str | None) -> None:
        claim, machine = self._claim, self._machine
        c = claim.call
        if not await machine.store_call(machine.store.put_step(
            c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=machine.lease, name=name, seq=seq,
            state=state, result=result,
        )):
            raise machine.lease_lost(claim)

    async def record(self, seq: int, name: str, result: str) -> None:
        machine = self._machine
        await uncancellable(run(machine, machine.settled(
            self._claim, f"recording step {name!r}", Run(lambda: self.put(seq, name, DONE, result)), heartbeat=False
        )))

    async def clear(self, name: str) -> None:
        claim, machine = self._claim, self._machine
        c = claim.call
        clear = Run(lambda: machine.store_call(machine.store.clear_step(
            c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=machine.lease, name=name)))
        # (not ours any more: a takeover decides about the mark; nothing to raise)
        await uncancellable(run(machine, machine.settled(claim, f"clearing step {name!r}", clear, heartbeat=False)))

    async def transaction(
        self, seq: int, name: str, fn: Callable[[AsyncConnection], Awaitable[Any]], encode: Callable[[Any], str]
    ) -> str:
        claim, machine = self._claim, self._machine
        c = claim.call

        async def run() -> str:
            async with machine.store.step_transaction(
                c.scope, c.key, fence=claim.fence, origin=claim.origin, lease=machine.lease, name=name, seq=seq
            ) as tx:
                if tx is None:
                    raise machine.lease_lost(claim)
                encoded = encode(await fn(tx.connection))
                await tx.record(encoded)
                return encoded

        return await machine.store_call(run())
