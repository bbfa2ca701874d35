"""After a fork: what a child inherits of its parent's guards and stores is made its own.

A process that forks after its guard was used (multiprocessing's ``fork``, gunicorn's ``--preload``, Celery's
prefork pool) hands the child every guard as it was, without its threads: the portal's loop thread, aiosqlite's
connection threads. Left so, the child would run a sync tool's body with no heartbeat (it runs on the portal),
wait for ever for a write after a body that raised, and share its parent's connections. One hook per process,
run in the child right after the fork, tells every live object holding such state (:func:`on_fork`) to start
afresh: a new portal loop on first use, new connections, heartbeats and waiters of its own, an empty ledger
queue (what was queued is the parent's to write).

The parent's connections (and the loops and pools holding them) are never closed in the child, only abandoned
(:func:`abandon`): kept referenced for the child's lifetime and never used. Closing them there would end the
parent's sessions (Postgres' goodbye goes down the socket both processes share) or have SQLite clean up under
the parent (its rule: a connection opened before a fork is neither used nor closed after it), and letting them
be collected would do the same through their finalisers.

One thing a child cannot make its own: SQLite's file locks, which are per process and whose account the child
inherits, so its connections take no lock its parent held at the fork. A SQLite store open in the parent at
the fork says so in the child (``SQLStore.after_fork``): the cure is to close the guard before forking.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Protocol

log = logging.getLogger("agentguard")


class Forkable(Protocol):
    def after_fork(self) -> None:
        """(In a forked child, right after the fork, with no other thread running.) Start afresh."""


_live: weakref.WeakSet[Forkable] = weakref.WeakSet()
_abandoned: list[Any] = []  # the parent's connections, pools and loops, kept (never closed) in a forked child


def on_fork(obj: Forkable) -> None:
    """Have ``obj.after_fork()`` called in every child this process forks (for as long as ``obj`` lives)."""
    _live.add(obj)


def abandon(*objs: Any) -> None:
    """Keep ``objs`` (the parent's, in a forked child) referenced and unused for the rest of this process."""
    _abandoned.extend(objs)


def _after_fork_in_child() -> None:
    for obj in list(_live):
        try:
            obj.after_fork()
        except Exception:  # one object's failure must not leave the others the parent's
            log.exception("agentguard could not make %r its own after a fork", obj)


if hasattr(os, "register_at_fork"):  # (not on Windows, which never forks)
    os.register_at_fork(after_in_child=_after_fork_in_child)
