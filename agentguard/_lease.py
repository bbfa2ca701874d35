"""Leases: the tokens that tell claims apart, and the heartbeat that keeps a claim alive while its body runs
(with the claims of sync tools' threads that wait for their first tick: :class:`PendingBeats`).

A lease is not a lock. It only says how long a claim is held without news from its worker; every write after
the claim is fenced anyway, so a worker that stalled past its lease and wakes up can no longer write.

- Owner tokens are unique across every process of a fleet (a claimer recognises its own claim whose reply
  was lost by it): a per-process prefix, renewed in a forked child, and a counter. The prefix names the process
  (``host:pid/``, then random hex: unique whatever the host names), so that a record whose worker went away says
  which process that was (the ledger's ``went_away`` entries: ``stores._attempts.owner_process``).
- Fences only need to start at an unpredictable point per key (they never repeat for a key, not even after a
  release or a sweep): a PRNG seeded from the OS, reseeded in a forked child.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

HOST_MAX = 24  # characters of the host's name in an owner token (whose column holds 64 in all)


def process_name() -> str:
    """``host:pid`` of this process, as the ledger names it: a host name longer than ``HOST_MAX`` is cut to its
    first label (then to ``HOST_MAX``)."""
    host = socket.gethostname()
    if len(host) > HOST_MAX:
        host = host.split(".")[0][:HOST_MAX]
    return f"{host}:{os.getpid()}"


def _prefix() -> str:
    """``host:pid/`` and 8 random hex digits and a dot: at most 42 characters, so that a token with any counter
    fits the record's 64."""
    return f"{process_name()}/{os.urandom(4).hex()}."


_rng = random.Random()
_owner_prefix = _prefix()
_owner_count = itertools.count()


def _after_fork() -> None:
    global _owner_prefix
    _owner_prefix = _prefix()
    _rng.seed(os.urandom(16))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def new_owner() -> str:
    return f"{_owner_prefix}{next(_owner_count):x}"


def new_fence() -> int:
    return _rng.getrandbits(62)


class Renewable(Protocol):
    """What the heartbeat needs of a claim."""

    beat: Heartbeat | None
    renewed: float  # loop time of the claim or of its last renewal
    renewal: asyncio.Task[None] | None


Renew = Callable[[Any], Coroutine[Any, Any, None]]


class Heartbeat:
    """One timer per guard and event loop renews every claim held there whose lease is a third spent.

    A claim costs a dict insert and a dict delete; nothing runs unless some body outlives lease/3. The timer
    ticks every lease/6 while claims are held, so a lease is renewed before half of it is spent.
    """

    __slots__ = ("claims", "lease", "loop", "renew", "timer")

    def __init__(self, lease: float, renew: Renew, loop: asyncio.AbstractEventLoop) -> None:
        self.lease = lease
        self.renew = renew
        self.loop = weakref.ref(loop)  # weak: it is the value of a WeakKeyDictionary keyed by the loop
        self.claims: dict[Any, None] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, claim: Renewable, loop: asyncio.AbstractEventLoop) -> None:
        claim.beat = self
        claim.renewed = loop.time()
        self.resume(claim, loop)

    def resume(self, claim: Renewable, loop: asyncio.AbstractEventLoop) -> None:
        """Renew ``claim`` (again: while a write after its body is retried through an outage), keeping the
        time of its last renewal."""
        self.claims[claim] = None
        if self.timer is None:
            self.timer = loop.call_later(self.lease / 6, self._tick)

    def _tick(self) -> None:
        self.timer = None
        if not self.claims:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now - self.lease / 3
        for claim in list(self.claims):
            if claim.renewed <= due and (claim.renewal is None or claim.renewal.done()):
                claim.renewed = now
                claim.renewal = loop.create_task(self.renew(claim))
        self.timer = loop.call_later(self.lease / 6, self._tick)


class Heartbeats:
    """The heartbeat of each event loop a guard's claims are made on."""

    __slots__ = ("_beats", "_last", "lease", "renew")

    def __init__(self, lease: float, renew: Renew) -> None:
        self.lease = lease
        self.renew = renew
        self._beats: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Heartbeat] = weakref.WeakKeyDictionary()
        self._last: Heartbeat | None = None  # the loop of the last claim: a cheap check for the next one

    def start(self, claim: Renewable) -> None:
        loop = asyncio.get_running_loop()
        beat = self._last
        if beat is None or beat.loop() is not loop:
            beat = self._beats.get(loop)
            if beat is None:
                beat = self._beats[loop] = Heartbeat(self.lease, self.renew, loop)
            self._last = beat
        beat.add(claim, loop)

    @staticmethod
    def stop(claim: Renewable) -> asyncio.Task[None] | None:
        """Stop renewing; returns the renewal still in flight (one statement at most), to be awaited."""
        if claim.beat is not None:
            claim.beat.claims.pop(claim, None)
        renewal = claim.renewal
        return renewal if renewal is not None and not renewal.done() else None


class PendingBeats:
    """Claims made in sync tools' own threads, each handed to the heartbeat on the guard's portal loop at the first
    tick (every lease/6) that finds its body still running, with the time it was claimed: its lease is then
    renewed by half of it, as any other's. A short body wakes no other thread: its claim is taken back
    (:meth:`take`) before any tick. The portal is woken once per loop, to start the ticks."""

    def __init__(self, beats: Heartbeats, loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self._beats = beats
        self._portal_loop = loop
        self._lock = threading.Lock()
        self._claims: dict[Any, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the portal's loop the ticks run on

    def add(self, claim: Renewable) -> None:
        """``claim``, made now, pending its heartbeat."""
        loop = self._portal_loop()
        with self._lock:
            self._claims[claim] = time.monotonic()
            if loop is self._loop:
                return
            self._loop = loop  # (a portal stopped and started again has a new loop)
        loop.call_soon_threadsafe(self._tick, loop, False)

    def take(self, claim: Renewable) -> float | None:
        """When ``claim`` was made, if it was still pending (and is no longer): no heartbeat renews it."""
        with self._lock:
            return self._claims.pop(claim, None)

    def _tick(self, loop: asyncio.AbstractEventLoop, hand_over: bool = True) -> None:
        if loop is not self._loop:
            return
        if hand_over:
            with self._lock:
                claims, self._claims = self._claims, {}
            for claim, at in claims.items():
                self._beats.start(claim)
                claim.renewed = at  # (the loop's clock is time.monotonic)
        loop.call_later(self._beats.lease / 6, self._tick, loop)
