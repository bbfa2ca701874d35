"""The ledger writer: entries of attempts queued by callers, written in batches off their path.

A caller appends one small tuple to a bounded queue and goes on: no statement, no commit, no lock, no await on
its path. A writer on the guard's portal loop takes up to ``BATCH`` entries at a time and inserts them in one
transaction. When the queue is full (the store is slower than the callers) an entry is dropped and counted,
never waited for; a batch the store fails to write is dropped and counted too. An entry the store refuses for
its own value costs only itself: every text is written as every store can hold it (``stores._attempts``), and
a batch the database refuses anyway is written again entry by entry, the refused ones dropped and counted. The
count is visible (``Guard.ledger_dropped``, a ``dropped`` entry once the store keeps up again, the
``agentguard.ledger.dropped`` counter) and logged. ``Guard.close()`` / ``aclose()`` flush what is queued.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ._fork import abandon, on_fork
from ._lease import process_name
from ._portal import Portal
from .stores import LedgerStore
from .stores._attempts import DROPPED

log = logging.getLogger("agentguard")

QUEUE_MAX = 10_000  # entries waiting to be written, at most; beyond: dropped and counted
BATCH = 500  # entries per batch (one transaction)
# Seconds the writer gathers entries before a write, unless a full batch is queued as it starts to (batches then go
# back to back; a writer woken as each batch fills measured no better: docs/benchmarks.md, "The ledger's batch in a few
# statements")
INTERVAL = 0.2

_process = ""


def process() -> str:
    """``host:pid`` of this process (after a fork, the child's)."""
    global _process
    if not _process:
        _process = process_name()  # (as an owner token names it: an attempt that went away is named so)
    return _process


def _forked() -> None:
    global _process
    _process = ""


os.register_at_fork(after_in_child=_forked)

Entry = tuple[Any, ...]  # the values of stores._attempts.WRITTEN


class Ledger:
    """One guard's queue of entries and its writer on the guard's portal loop."""

    def __init__(self, store: LedgerStore, portal: Portal, retention: float,
                 on_drop: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.portal = portal
        self.retention = retention
        self.queue: collections.deque[Entry] = collections.deque()
        self.dropped = 0  # entries dropped since the guard was made
        self._unreported = 0  # dropped and not yet written as a ``dropped`` entry
        self._unreported_refused = 0  # ... of those, refused by the store for their own values
        self._writing = False
        self._task: asyncio.Task[None] | None = None  # the writer, on the portal loop
        self._wake: asyncio.Event | None = None  # set to end the writer's gathering at once (a flush)
        self._on_drop = on_drop
        self._warned = 0.0
        self.failure = ""  # why the store last failed to take a batch
        on_fork(self)

    def after_fork(self) -> None:
        """In a forked child: the entries queued before the fork are the parent's to write (its writer does);
        this process's writer starts on its own portal loop with its first entry."""
        if self._task is not None:
            abandon(self._task)  # (a task of the parent's loop: never run here, never collected pending)
        self.queue.clear()
        self._unreported = 0
        self._writing = False
        self._task = self._wake = None

    @property
    def pending(self) -> bool:
        """Entries are queued or being written."""
        return bool(self.queue) or self._writing

    def add(self, scope: str, key: str, task_id: str, operation: str, tool: str, kind: str, detail: str,
            attempt: int, call_id: str | None, guard_ms: float | None, wait_ms: float | None, *,
            about: str | None = None) -> None:
        """Queue one entry; never blocks. (Called from any thread: ``deque.append`` is atomic.) ``about``: the
        ``host:pid`` the entry is about, when it is not this one (an attempt whose worker went away)."""
        queue = self.queue
        if len(queue) >= QUEUE_MAX:
            self._drop(1)
            return
        at = time.time()
        queue.append((scope, key, task_id, operation, tool, kind, detail, attempt, call_id, about or process(), at,
                      guard_ms, wait_ms, at + self.retention))
        if not self._writing:
            self._writing = True
            try:
                loop = self.portal.loop()
                loop.call_soon_threadsafe(self._start, loop)
            except RuntimeError:  # the portal is closing: the entry stays queued for the final flush
                self._writing = False

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._write_soon())

    def _drop(self, n: int, refused: bool = False) -> None:
        self.dropped += n
        self._unreported += n
        if refused:
            self._unreported_refused += n
        if self._on_drop is not None:
            self._on_drop(n)
        now = time.monotonic()
        if not refused and now - self._warned > 60:  # (the store logs each refusal itself)
            self._warned = now
            log.warning("the attempt ledger dropped %d entr%s so far: the store is not keeping up (the calls "
                        "themselves are unaffected)", self.dropped, "y" if self.dropped == 1 else "ies")

    async def _write_soon(self) -> None:
        """The writer: gather for ``INTERVAL`` (or until a batch is full), write, until the queue is empty."""
        wake = self._wake = asyncio.Event()
        try:
            while True:
                if len(self.queue) < BATCH and not wake.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), INTERVAL)
                await self.write_batch()
                if not self.queue:
                    self._writing = False
                    if not self.queue:  # (an entry added meanwhile saw _writing set, so nobody else started)
                        return
                    self._writing = True
        except BaseException:
            self._writing = False
            raise

    async def write_batch(self) -> int:
        """Write up to ``BATCH`` queued entries (and the count of those dropped): how many were written (0: the
        store refused each of them), or minus how many were dropped because the store failed."""
        queue = self.queue
        rows: list[Entry] = []
        while queue and len(rows) < BATCH:
            rows.append(queue.popleft())
        if self._unreported:
            at = time.time()
            refused = self._unreported_refused
            slow = self._unreported - refused
            self._unreported = self._unreported_refused = 0
            for n, why in ((slow, "the store was not keeping up"), (refused, "the store refused them")):
                if n:
                    rows.append(("", "", "", "", "", DROPPED, f"{n} entries dropped ({why})", 0, None, process(), at,
                                 None, None, at + self.retention))
        if not rows:
            return 0
        try:
            left_out = await self.store.write_attempts(rows)
        except Exception as exc:  # the store is down or slow: the entries are lost, counted
            self.failure = str(exc)
            self._drop(len(rows))
            log.debug("writing the attempt ledger failed: %s", exc)
            return -len(rows)
        if left_out:  # refused by the store, each on its own: the others were written
            self._drop(left_out, refused=True)
        return len(rows) - (left_out or 0)

    async def flush(self) -> None:
        """Write everything queued now (on the portal loop; ``Guard.close`` calls it). A write the store
        refuses ends the flush: what is left is dropped and counted, never retried for ever."""
        writer = self._task
        if writer is not None and not writer.done() and writer is not asyncio.current_task():
            if self._wake is not None:
                self._wake.set()  # the writer stops gathering, writes what is queued and ends
            with contextlib.suppress(Exception):
                await writer
        while self.queue and await self.write_batch() >= 0:
            pass
        if self.queue:
            self._drop(len(self.queue))
            self.queue.clear()
        self._writing = False  # (a writer task on a portal loop that is stopping now will not run again)
