"""News of recorded outcomes from other processes (Postgres): one connection per event loop that LISTENs.

A waiter's process marks the record it waits on as watched (``Statements.watch``) after its listener is
up; the completion or release of a watched record announces it with ``pg_notify`` in the same statement,
so the announcement is sent when (and only if) that statement commits. Records nobody watches are never
announced: a notifying commit takes a lock that serialises all notifying commits of the server, so the hot
path of callers that nobody waits on stays as it was.

News only means "look again": the claim still decides everything. If the listener's connection is lost,
every subscriber is told to look again at once (an announcement may have been missed), and the next wait
reconnects; while it cannot, waiters poll. ``generation`` tells a waiter whether its mark was made under the
listener that is up now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentguard.store")

News = Callable[[tuple[str, str] | None], None]  # (scope, key) announced, or None: look at everything again


class Listener:
    """One loop's listening connection. ``connect``: opens a driver connection (asyncpg) on this loop."""

    def __init__(self, channel: str, connect: Callable[[], Any]) -> None:
        self.channel = channel
        self._connect = connect
        self._conn: Any = None
        self._opening: asyncio.Task[None] | None = None
        self.generation = 0  # > 0 while listening; a new number after each reconnect
        self._generations = 0
        self.subscribers: list[News] = []
        self.heard = 0  # announcements received (for tests and the benchmark's counts)

    def subscribe(self, news: News) -> None:
        if news not in self.subscribers:
            self.subscribers.append(news)

    async def up(self) -> int:
        """Listening (connecting first if needed): the generation, or 0 if the connection cannot be made."""
        if self.generation:
            return self.generation
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._open())
        opening = self._opening
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("cannot listen for other processes' outcomes (%s); waiters poll", type(exc).__name__)
        finally:
            if self._opening is opening and opening.done():
                self._opening = None
        return self.generation

    async def _open(self) -> None:
        conn = await self._connect()
        try:
            conn.add_termination_listener(self._terminated)
            await conn.add_listener(self.channel, self._announced)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.terminate()
            raise
        self._conn = conn
        self._generations += 1
        self.generation = self._generations

    def _announced(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            scope, key = json.loads(payload)
        except (ValueError, TypeError):
            return
        self.heard += 1
        self._tell((str(scope), str(key)))

    def _terminated(self, conn: Any) -> None:
        if conn is not self._conn:
            return
        self._conn, self.generation = None, 0
        log.info("the listening connection was lost; waiters look again and poll until it is back")
        self._tell(None)

    def _tell(self, what: tuple[str, str] | None) -> None:
        for news in list(self.subscribers):
            try:
                news(what)
            except Exception:  # a subscriber's failure must not stop the others' news
                log.exception("delivering news of a recorded outcome failed")

    async def close(self) -> None:
        conn, self._conn, self.generation = self._conn, None, 0
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
            conn = conn or self._conn
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), timeout=2.0)
            except Exception:
                conn.terminate()
