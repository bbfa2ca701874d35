"""The doctor's pooler line, told by which server session answers a client, never by how long an answer took:
the detection run with no patience at all, as on a machine slower than its two seconds (``detect_pooling``)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from agentguard._doctor import PG, detect_pooling

from pgbouncer import bouncer


@pytest.mark.postgres
@pytest.mark.parametrize(("mode", "pool_size", "told"), [(None, 0, "none"), ("session", 20, "session"),
                                                         ("transaction", 1, "transaction")])
def test_pooling_is_told_by_which_session_answers_never_by_how_long_it_took(
        store_url: str, tmp_path: Path, mode: str | None, pool_size: int, told: str) -> None:
    """No patience at all: B's transaction ends before A's second answer has come, as when a loaded server is
    slower than the doctor's two seconds. The verdict is still the right one, and A's question was never cancelled
    (an earlier doctor cancelled it after two seconds and called a slow session pooler transaction pooling; the
    cancel, behind PgBouncer, could leave asyncpg a result nobody waited for: a traceback from the event loop)."""

    async def tell(url: str) -> tuple[str, str, list[dict[str, Any]]]:
        troubles: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: troubles.append(context))
        verdict = await detect_pooling(PG(url, 10.0).connect, make_url(url).port, patience=0.0)
        await asyncio.sleep(0.2)  # (a stray result would arrive meanwhile)
        return verdict.mode, verdict.evidence, troubles

    with contextlib.ExitStack() as stack:
        url = store_url if mode is None else stack.enter_context(bouncer(tmp_path, store_url, mode, pool_size))
        for _ in range(5):
            pooling, evidence, troubles = asyncio.run(tell(url))
            assert (pooling, troubles) == (told, []), evidence
