"""``agentguard mcp-proxy --config FILE [--http [HOST:]PORT]``: load the config, check everything, then serve
over stdio (one host) or Streamable HTTP (many; ``_http.py``).

Logs go to stderr only (stdout is the protocol), every line without a store password. The protocol's input
is read without a worker thread where it can be (a pipe, a socket, a terminal), so that SIGINT/SIGTERM can
end it: the calls in flight get ``proxy.grace`` seconds, the answers already produced are written, then the
proxy exits. A standard stream the host left closed reads as empty (stdin) or discards (stdout, stderr).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
import typing
from collections.abc import Callable, Sequence

import anyio
from mcp.server.lowlevel.server import NotificationOptions

from .._redact import redact_text
from ._config import ConfigError, load_config
from ._http import http_token, parse_address, serve_http
from ._server import GuardingProxy
from ._startup import StartupError

log = logging.getLogger("agentguard.mcp")


def main(config_path: str, http: str | None = None) -> int:
    """Entry of ``agentguard mcp-proxy --config FILE [--http [HOST:]PORT]``: validate, then serve over stdio,
    or over Streamable HTTP at ``http://HOST:PORT/mcp``. Returns the exit code.

    Exits with 2, having printed every problem on stderr and nothing on stdout, when the config is invalid,
    the store cannot be used, a guarded tool does not match what the upstream offers, or (HTTP) there is no
    bearer token or the address cannot be listened on.
    """
    _open_closed_std_streams()
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        _print_problems(f"invalid config {exc.path}", exc.problems)
        return 2
    _configure_logging()
    try:
        proxy = GuardingProxy(config)
        address = None if http is None else (*parse_address(http), http_token(config, os.environ))
    except (ValueError, TypeError) as exc:
        print(redact_text(f"agentguard mcp-proxy: {exc}"), file=sys.stderr)
        return 2
    try:
        try:
            if address is None:
                anyio.run(_serve, proxy)
            else:
                anyio.run(_serve_over_http, proxy, *address)
        except BaseExceptionGroup as group:
            raise _lone(group) from None  # one error of the proxy's own, raised inside its task groups
    except StartupError as exc:
        _print_problems(f"cannot serve with {config_path}", exc.problems)
        return 2
    except OSError as exc:
        print(f"agentguard mcp-proxy: cannot listen on {http}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _lone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a group (of groups) carries, or the group itself if it carries several."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner


def _print_problems(what: str, problems: Sequence[str]) -> None:
    print(f"agentguard mcp-proxy: {what}:", file=sys.stderr)
    for problem in problems:
        print(redact_text(f"  - {problem}"), file=sys.stderr)
    print("nothing was served; fix the config (or the store, or the upstream) and start again.", file=sys.stderr)


def _open_closed_std_streams() -> None:
    """Stand the null device in for each standard stream the host left closed (``0<&-``).

    A closed stdin then reads as an empty one (the proxy starts, meets the end of its input and exits 0), a
    closed stdout discards. A closed descriptor is taken by the null device too, so that no file or pipe
    opened later (the SQLite store, the upstream's pipes) lands on 0, 1 or 2 and gets read or written as
    the protocol.
    """
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        mode = os.O_RDONLY if fd == 0 else os.O_WRONLY
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)
            if null != fd:  # (a lower descriptor was free too)
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:  # closed when Python started: whatever holds ``fd`` now is not the host's
            setattr(sys, name, open(os.devnull, "r" if fd == 0 else "w", encoding="utf-8"))  # noqa: SIM115


class _RedactingFormatter(logging.Formatter):
    """Every line the proxy logs, tracebacks included, without a store (or upstream) password."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def _configure_logging() -> None:
    level = os.environ.get("AGENTGUARD_LOG", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("agentguard-proxy %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("agentguard")
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))


class _Stdin:
    """The protocol's input: lines from stdin read without a worker thread, so input can be ended at will.

    The SDK reads stdin in a thread blocked in read(); after a signal the host may keep the pipe open, and
    that thread would keep the process alive. Ending our own reader instead is the same as the host hanging
    up: the server loop ends, every answer already produced is flushed, then the lifespan closes.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    @classmethod
    async def open(cls) -> _Stdin | None:
        loop = asyncio.get_running_loop()
        mode = os.fstat(sys.stdin.fileno()).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty()):
            # A regular file or a device such as /dev/null: the event loop cannot watch it (asyncio accepts
            # a device, then never reads it), so the SDK's reader thread reads it.
            return None
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
        pipe = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except (OSError, ValueError):  # only pipes, sockets and terminals can be watched
            pipe.close()
            return None
        return cls(reader)

    def end(self) -> None:
        self._reader.feed_eof()

    def __aiter__(self) -> _Stdin:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


async def _serve(proxy: GuardingProxy) -> None:
    # Checked first, served second: a StartupError leaves before a byte is written on stdout.
    async with proxy.started():
        try:
            await _serve_stdio(proxy)
        except* (BrokenPipeError, ConnectionResetError):
            log.info("the client closed its end of the connection")  # (it died: what is left to say goes nowhere)
        except* Exception:
            log.exception("serving the client failed")  # (logged now: _finish may exit before it propagates)
            raise
        finally:
            await _finish(proxy)


async def _finish(proxy: GuardingProxy) -> None:
    """The host hung up (or a signal ended the input): the calls in flight get ``grace`` seconds. A call still
    running then is never cancelled into a release (the upstream may have acted on it): the proxy exits with
    its claim held, which expires with its lease and is settled by the rule for a worker gone mid-call."""
    with anyio.CancelScope(shield=True):
        if await proxy.wait_idle(proxy.config.proxy.grace):
            return
    log.warning("%d call(s) still in flight %gs after the client hung up; exiting without releasing their claims",
                proxy.inflight, proxy.config.proxy.grace)
    _hard_exit(1)


async def _serve_over_http(proxy: GuardingProxy, host: str, port: int, token: str | None) -> None:
    async with proxy.started(), anyio.create_task_group() as tg:
        tg.start_soon(_on_signals, proxy, tg.cancel_scope.cancel)
        await serve_http(proxy, host, port, token)


async def _on_signals(proxy: GuardingProxy, stop: Callable[[], None]) -> None:
    """SIGINT/SIGTERM: no new guarded calls, ``grace`` seconds for those in flight, then ``stop``; a second
    signal (or calls still in flight then) exits at once, leaving their claims to expire."""
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if proxy.draining:
                    log.warning("second signal: exiting now; claims in flight are left to expire")
                    _hard_exit(1)
                proxy.draining = True
                log.info("%s: finishing %d call(s) in flight, then exiting", signal.Signals(signum).name,
                         proxy.inflight)
                tg.start_soon(_drain, proxy, stop)


async def _drain(proxy: GuardingProxy, stop: Callable[[], None]) -> None:
    if not await proxy.wait_idle(proxy.config.proxy.grace):
        # Never release blind: the upstream may have acted. The claims expire with their lease and the next
        # caller takes over with the same downstream key.
        log.warning("%d call(s) still in flight after %gs; exiting without releasing their claims",
                    proxy.inflight, proxy.config.proxy.grace)
        _hard_exit(1)
    stop()


async def _serve_stdio(proxy: GuardingProxy) -> None:
    from mcp.server.stdio import stdio_server

    stdin = await _Stdin.open()
    async with anyio.create_task_group() as tg:
        # Ending our own reader is as if the host hung up: answers already produced are still written.
        tg.start_soon(_on_signals, proxy, stdin.end if stdin is not None else tg.cancel_scope.cancel)
        async with stdio_server(stdin=typing.cast("anyio.AsyncFile[str] | None", stdin)) as (read, write):
            try:
                options = proxy.server.create_initialization_options(NotificationOptions(tools_changed=True))
                await proxy.server.run(read, write, options)
            finally:
                if proxy.draining and stdin is None:
                    # The SDK's stdin thread stays blocked in read() until the host closes the pipe.
                    _hard_exit(0)
        tg.cancel_scope.cancel()


def _hard_exit(code: int) -> None:
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)
