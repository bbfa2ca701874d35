"""The chaos run's findings, from inside: what a worker starting on a store that went away is told (the run
itself and its checks: ``tests/project/test_chaos.py``)."""

from __future__ import annotations

import asyncio

import pytest

storeless = pytest.mark.storeless  # independent of the store's backend


@storeless
def test_a_failed_rollback_does_not_hide_why_the_schema_failed() -> None:
    """Found by the chaos run: a worker starting while its connection was terminated (a Postgres restart,
    pg_terminate_backend) failed with "Can't reconnect until invalid transaction is rolled back" — the
    rollback's own failure, which hid the cause and so said the outage was not one that may pass."""
    from agentguard.stores._schema import create_schema

    class Terminated:
        async def exec_driver_sql(self, sql: str) -> None:
            if sql == "ROLLBACK":
                raise RuntimeError("Can't reconnect until invalid transaction is rolled back")

        async def run_sync(self, fn: object, **kw: object) -> None:
            raise ConnectionResetError("terminating connection due to administrator command")

    with pytest.raises(ConnectionResetError):
        asyncio.run(create_schema(Terminated(), "BEGIN", None, []))  # type: ignore[arg-type]
