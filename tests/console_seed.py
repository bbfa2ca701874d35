"""Records for the console's tests, made by real guarded calls in a process of their own.

    python tests/console_seed.py URL done TASK     a task: a two-step booking, a replay, a refund that fails
    python tests/console_seed.py URL hold TASK     a booking whose worker is SIGKILLed inside its charge step:
                                                   after the lease (1 s) it is held on an unknown outcome
    python tests/console_seed.py URL release TASK  a payout whose provider is unreachable: the claim is released
                                                   (prints {"key": ...})
    python tests/console_seed.py URL resume TASK   call the booking again: prints its result, or the error
    python tests/console_seed.py URL repay TASK    call the payout again: prints its result, or the error

The provider is made up (its charge id is derived from the sub-key), and so are amounts and ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from agentguard import Guard, GuardError, Operation, task


class CardDeclined(Exception):
    pass


def tools(guard: Guard, mode: str) -> tuple[Any, Any, Any]:
    async def charge_card(amount_cents: int, idempotency_key: str) -> dict[str, object]:
        if mode == "hold":
            os.kill(os.getpid(), signal.SIGKILL)  # the provider may have charged; the worker dies here
        return {"id": "ch_" + idempotency_key[-8:], "amount_cents": amount_cents}

    async def send_receipt(order: str) -> str:
        return f"receipt for {order}"

    @guard.once(key=["order"], on_unknown="hold")
    async def book(order: str, amount_cents: int, op: Operation) -> dict[str, object]:
        charge = await op.step("charge", charge_card, amount_cents, idempotency_key=op.key("charge"))
        await op.step("send_receipt", send_receipt, order)
        return {"order": order, "charge": charge}

    @guard.once(key=["order"], cache_errors=(CardDeclined,))
    async def refund(order: str, amount_cents: int) -> str:
        raise CardDeclined(f"refund of {amount_cents} declined")

    @guard.once(key=["order"])
    async def payout(order: str, idempotency_key: str) -> str:
        if mode == "release":
            print(json.dumps({"key": idempotency_key}))
            raise ConnectionError("the provider is unreachable")
        return f"paid out {order}"

    return book, refund, payout


async def main(url: str, mode: str, task_id: str) -> None:
    async with Guard(url, lease=1.0) as guard:
        book, refund, payout = tools(guard, mode)
        with task(task_id):
            if mode == "done":
                await book("o-1", 2500)
                await book("o-1", 2500)  # a replay
                with contextlib.suppress(CardDeclined):
                    await refund("o-1", 500)
            elif mode == "hold":
                await book("o-2", 4200)
            elif mode == "release":
                with contextlib.suppress(ConnectionError):
                    await payout("o-3")
            else:
                try:
                    print(json.dumps({"ok": await (book("o-2", 4200) if mode == "resume" else payout("o-3"))}))
                except GuardError as exc:
                    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
