"""One background event loop per Guard, for sync tools and in-memory stores.

A sync tool runs in its caller's thread; its store calls are sent here instead of starting a new
``asyncio.run`` per call (which would build and tear down an engine every time). A forked child starts a loop
of its own on first use: the parent's has no thread there (``_fork``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ._errors import GuardError
from ._fork import abandon, on_fork

T = TypeVar("T")


class Portal:
    def __init__(self, name: str = "agentguard-portal") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        on_fork(self)

    def after_fork(self) -> None:
        """In a forked child: the parent's loop runs nowhere here (its thread was not forked); a new one starts on
        first use. The old one is abandoned, never closed: its selector and self-pipe are the parent's too."""
        if self._loop is not None:
            abandon(self._loop)
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)
        self._loop = self._thread = None

    @property
    def started(self) -> bool:
        return self._loop is not None

    @property
    def current(self) -> asyncio.AbstractEventLoop | None:
        """The loop, if one is started (none is started here)."""
        return self._loop

    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                    if self._loop is not loop:  # (let go of by ``end_soon``: nobody else closes it)
                        loop.close()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def in_portal(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the portal loop and block this thread until it finishes. Past ``timeout`` seconds it is
        cancelled there, and TimeoutError raised."""
        if self.in_portal():
            coro.close()
            raise GuardError("a sync guarded call was made from inside the guard's own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the portal loop from another loop."""
        if self.in_portal():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop()))

    def end_soon(self, final: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """From any thread, waiting for nothing (a finaliser's call): run ``final()`` on the loop, then end it (its
        async generators closed, the loop stopped, and closed by its own thread). A later use starts a new one."""
        loop, thread = self._loop, self._thread  # (no lock: a finaliser may run in a thread that holds it)
        if loop is None or thread is None or loop.is_closed():
            return
        self._loop = self._thread = None

        async def last() -> None:
            try:
                with contextlib.suppress(Exception):
                    await final()
                with contextlib.suppress(Exception):
                    await loop.shutdown_asyncgens()
            finally:
                loop.stop()

        with contextlib.suppress(RuntimeError):  # (its loop closed meanwhile)
            asyncio.run_coroutine_threadsafe(last(), loop)

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread is not threading.current_thread():
            # Let async generators bound to this loop (the store's per-loop closer) finish on it.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=10)
            loop.close()
