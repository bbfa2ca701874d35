"""Checked first, served second: the proxy opens its store and its upstream and checks the config against
the upstream's tools before it answers anything.

A guard that is not in place must not start: a misspelt tool name would leave the real tool passing through
unguarded. Every problem (the store's, the upstream's, each guarded tool's) is collected side by side and
raised as one :class:`StartupError`. The upstream connection made for the check is the one served.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types

from .._errors import GuardError, StoreError
from .._guard import Guard
from .._redact import redact_text, redact_url
from .._storeconfig import ENV_URL
from ._config import Config, tool_problems
from ._tools import key_warnings, task_problems
from ._transports import TargetFactory, _Unavailable
from ._upstream import Checker, Relay, Upstream

log = logging.getLogger("agentguard.mcp")


class StartupError(Exception):
    """The proxy cannot serve: its store cannot be used or its config does not match the upstream.

    ``problems`` lists each one (store URLs without their passwords); ``agentguard mcp-proxy`` prints them
    on stderr and exits with status 2 before answering anything.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [redact_text(p) for p in problems]
        super().__init__("; ".join(self.problems))


@dataclass
class Runtime:
    """What a started proxy serves on: its guard (the store) and its upstream."""

    guard: Guard
    upstream: Upstream


def tool_check(config: Config) -> Checker:
    """Which guarded tools a tool list breaks, and how."""

    def check(tools: list[types.Tool]) -> dict[str, list[str]]:
        problems = tool_problems(config, {t.name: t.input_schema for t in tools})
        for name, more in task_problems(config, tools).items():
            problems.setdefault(name, []).extend(more)
        return problems

    return check


@asynccontextmanager
async def open_runtime(
    config: Config, store_url: str, *, target: TargetFactory, on_change: Callable[[], Coroutine[Any, Any, None]],
    relay: Relay | None = None,
) -> AsyncIterator[Runtime]:
    """Open the store and connect the upstream, check every guarded tool against the upstream's tools, then
    yield the runtime; the upstream and the store are closed on exit.

    Raises :class:`StartupError` with every problem found, before anything is yielded.
    """
    field = _store_field(config)
    try:
        guard = Guard(store_url, lease=config.store.lease, retention=config.store.retention,
                      wait_timeout=config.proxy.wait_timeout)
    except (ValueError, TypeError, GuardError) as exc:
        raise StartupError([f"{field}: cannot use {redact_url(store_url)}: {exc}"]) from None
    problems: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            upstream = Upstream(tg, target, mode=config.upstream.mode, timeout=config.upstream.timeout,
                                check=tool_check(config), on_change=on_change, relay=relay)
            problems = await _check(config, guard, upstream, field, redact_url(store_url))
            try:
                if not problems:
                    yield Runtime(guard, upstream)
            finally:
                upstream.close()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await guard.aclose()
    if problems:
        raise StartupError(problems)


async def _check(config: Config, guard: Guard, upstream: Upstream, field: str, url: str) -> list[str]:
    """Every startup problem: the store's and the upstream's, checked side by side."""
    store: list[str] = []
    tools: list[str] = []
    offered: list[types.Tool] = []

    async def open_store() -> None:
        problem = await _open_store(config, guard, field, url)
        if problem is not None:
            store.append(problem)

    async def check_upstream() -> None:
        try:
            conn = await upstream.connect()
        except _Unavailable as exc:
            tools.append(f"upstream: the upstream server could not be started or reached: {exc}")
            return
        offered.extend(conn.tools)
        for problems in conn.problems.values():  # in the config's order
            tools.extend(problems)

    async with anyio.create_task_group() as tg:
        tg.start_soon(open_store)
        tg.start_soon(check_upstream)
    if not store and not tools:
        for warning in key_warnings(config, offered):
            log.warning("%s", warning)
        log.info("serving: the store is ready and the upstream offers every guarded tool (%s)",
                 ", ".join(sorted(config.tools)) or "none")
    return store + tools


def _store_field(config: Config) -> str:
    """Where the store's URL came from, for a problem's message."""
    return f"store.url (from ${ENV_URL})" if config.store.url is None else config.where("store", "url")


async def _open_store(config: Config, guard: Guard, field: str, url: str) -> str | None:
    """None once the store is ready, else why it cannot be used. A store that cannot be reached
    (connection refused, timed out) is retried for ``store.startup_wait`` seconds first."""
    wait = config.store.startup_wait
    deadline = anyio.current_time() + wait
    delay = 0.1
    while True:
        try:
            await guard.ensure_schema()
            return None
        except GuardError as exc:
            reason = redact_text(str(exc))
            left = deadline - anyio.current_time()
            if not (isinstance(exc, StoreError) and exc.transient):
                return f"{field}: cannot use the store {url}: {reason}"
            if left <= 0:
                waited = f" (retried for {wait:g}s: store.startup_wait)" if wait else ""
                return f"{field}: cannot reach the store {url}: {reason}{waited}"
            if delay == 0.1:
                log.warning("cannot reach the store %s yet (%s); retrying for up to %gs (store.startup_wait)",
                            url, reason, wait)
            await anyio.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
