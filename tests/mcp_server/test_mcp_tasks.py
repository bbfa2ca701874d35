"""An upstream that answers a guarded call with a task (the 2026-07-28 tasks extension): the proxy records the
handle under the call's key, follows the task to its end and records its final result, so that a retry, a
duplicate in flight and a proxy that takes the call over all get that one task, never a second upstream call.
The host sees an ordinary result, in both protocol eras. A handshake-era upstream that answers with a task nobody
asked for is an unknown outcome, never a failure to retry. The real ``mcp`` Client; the upstream counts calls."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import METHOD_NOT_FOUND
from task_upstream import TaskUpstream
from upstream_log import events

import agentguard
from agentguard.mcp import META_REPLAYED, GuardingProxy, parse_config

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent

GUARDED = """
[tools.pay]
key = ["order_id"]
forward_key_to = "idempotency_key"

[tools.pay_asking]
key = ["order_id"]
forward_key_to = "idempotency_key"

[tools.doomed]
key = ["end"]

[tools.pay_legacy]
key = ["order_id"]
"""


def config(store_url: str, *, mode: str = "auto", tools: str = GUARDED) -> str:
    return f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\nmode = "{mode}"\n\n{tools}'


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def until(check: Callable[[], bool]) -> None:
    while not check():  # noqa: ASYNC110 - another task or process makes it true
        await anyio.sleep(0.01)


@contextlib.asynccontextmanager
async def connect(store_url: str, upstream: TaskUpstream, mode: str, *, upstream_mode: str = "auto",
                  tools: str = GUARDED, **options: Any) -> AsyncIterator[Client]:
    proxy = GuardingProxy(parse_config(config(store_url, mode=upstream_mode, tools=tools)), upstream=upstream.server,
                          environ={})
    async with Client(proxy.server, mode=mode, **options) as client:
        yield client


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_task_is_followed_to_its_end_and_its_result_recorded(tmp_path: Path, store_url: str,
                                                                    mode: str) -> None:
    log = tmp_path / "upstream.jsonl"
    upstream = TaskUpstream(log, held=True)
    pay = {"order_id": "o-1", "task_id": "ticket-1"}
    results: list[types.CallToolResult] = []
    async with connect(store_url, upstream, mode) as client:

        async def call() -> None:
            results.append(await client.call_tool("pay", pay))

        async with anyio.create_task_group() as tg:
            for _ in range(3):  # duplicates in flight while the task runs: they wait for its result
                tg.start_soon(call)
            await until(lambda: len(events(log, "get")) >= 2)  # the proxy is following the task
            upstream.release()
        later = await client.call_tool("pay", pay)
    [called] = events(log, "call")
    assert called["tasks"] is True and called["args"]["idempotency_key"]  # asked as a task, with the key
    [paid] = events(log, "pay")
    assert {e["task"] for e in events(log, "get")} == {paid["task"]}  # one task, followed to its end
    # The requestState of each task-bearing answer is echoed on the next request about the task.
    assert {e["state"] for e in events(log, "get")} == {f"state-{paid['task']}"}
    assert all(text(r).endswith("paid #1") for r in [*results, later])
    assert sorted(bool(r.meta and r.meta[META_REPLAYED]) for r in results) == [False, True, True]
    assert later.meta and later.meta[META_REPLAYED] is True and "REPLAY" in text(later)
    assert upstream.tasks[paid["task"]]["result"]["structuredContent"] == results[0].structured_content


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_tasks_question_is_put_to_the_host(tmp_path: Path, store_url: str, mode: str) -> None:
    log = tmp_path / "upstream.jsonl"
    upstream = TaskUpstream(log)
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"card": "visa-42"})

    async with connect(store_url, upstream, mode, elicitation_callback=elicit) as client:
        first = await client.call_tool("pay_asking", {"order_id": "o-1", "task_id": "ticket-2"})
        again = await client.call_tool("pay_asking", {"order_id": "o-1", "task_id": "ticket-2"})
    assert asked == ["Which card?"]  # once, though the task is polled while it waits for the answer
    [update] = events(log, "update")
    assert update["answers"] == {"card": {"action": "accept", "content": {"card": "visa-42"}}}
    assert [e["card"] for e in events(log, "pay")] == ["visa-42"]
    assert text(first) == "paid #1" and again.meta and again.meta[META_REPLAYED] is True


async def test_a_task_cancelled_upstream_is_an_unknown_outcome_and_held(tmp_path: Path, store_url: str) -> None:
    log = tmp_path / "upstream.jsonl"
    async with connect(store_url, TaskUpstream(log), "auto") as client:
        first = await client.call_tool("doomed", {"end": "cancelled", "task_id": "ticket-3"})
        again = await client.call_tool("doomed", {"end": "cancelled", "task_id": "ticket-3"})
    assert first.is_error and "cancelled its task" in text(first) and "the provider gave up" in text(first)
    assert again.is_error and "Nothing was executed" in text(again) and "cancelled its task" in text(again)
    assert len(events(log, "call")) == 1  # held (its key does not reach the provider): never sent again


async def test_a_task_that_failed_is_released_and_called_again(tmp_path: Path, store_url: str) -> None:
    log = tmp_path / "upstream.jsonl"
    async with connect(store_url, TaskUpstream(log), "auto") as client:
        first = await client.call_tool("doomed", {"end": "failed", "task_id": "ticket-4"})
        again = await client.call_tool("doomed", {"end": "failed", "task_id": "ticket-4"})
    for res in (first, again):
        assert res.is_error and "refused doomed: no such account" in text(res), text(res)
    # A JSON-RPC error, as if the call had been answered with it: the claim is released and the task it ended
    # forgotten, so the retry is a new call, not the old task followed again.
    calls = events(log, "call")
    assert len(calls) == 2 and len({e["task"] for e in events(log, "get")}) == 2


async def test_a_task_past_its_time_to_live_is_not_followed_on(tmp_path: Path, store_url: str) -> None:
    """The upstream may drop a task once its ``ttlSeconds`` passed: the proxy stops following it, its outcome
    unknown. The key reaches the provider, so the claim is released and the retry calls again, with that key."""
    log = tmp_path / "upstream.jsonl"
    upstream = TaskUpstream(log, held=True, ttl=0.2)
    async with connect(store_url, upstream, "auto") as client:
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": "ticket-7"})
        upstream.release()
        again = await client.call_tool("pay", {"order_id": "o-1", "task_id": "ticket-7"})
    assert first.is_error and "did not end within its time to live (0.2s)" in text(first), text(first)
    assert not again.is_error
    calls = events(log, "call")
    assert len(calls) == 2 and calls[0]["args"]["idempotency_key"] == calls[1]["args"]["idempotency_key"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_handshake_upstream_that_answers_with_a_task_nobody_asked_for(tmp_path: Path, store_url: str,
                                                                             mode: str) -> None:
    """A 2025-11-25 task is asked for with the call, and the proxy never asks: a task handle in answer is not a
    result. The call was sent and the upstream may be acting on it, so its outcome is unknown: held (its key
    does not reach the provider), never released for a retry that would act again."""
    log = tmp_path / "upstream.jsonl"
    async with connect(store_url, TaskUpstream(log), mode, upstream_mode="legacy") as client:
        first = await client.call_tool("pay_legacy", {"order_id": "o-1", "task_id": "ticket-5"})
        again = await client.call_tool("pay_legacy", {"order_id": "o-1", "task_id": "ticket-5"})
    assert first.is_error and "task handle, which the proxy did not ask for" in text(first), text(first)
    assert again.is_error and "Nothing was executed" in text(again)
    assert len(events(log, "pay")) == 1


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_task_passed_through_is_cancelled_with_its_hosts_request(tmp_path: Path, store_url: str,
                                                                        mode: str) -> None:
    log = tmp_path / "upstream.jsonl"
    upstream = TaskUpstream(log, held=True)
    async with connect(store_url, upstream, mode, tools='[tools.pay_asking]\nkey = ["order_id"]\n') as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "pay", {"order_id": "o-1"})
            await until(lambda: bool(events(log, "get")))  # the proxy follows the task
            tg.cancel_scope.cancel()  # and the host gives up on its request
        await until(lambda: bool(events(log, "cancel")))
    [cancelled] = events(log, "cancel")
    [paid] = events(log, "pay")
    assert cancelled["task"] == paid["task"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_host_is_never_handed_a_task(tmp_path: Path, store_url: str, mode: str) -> None:
    """The proxy follows every task itself, so it offers its hosts none: no tasks capability, and ``tasks/*``
    are not methods of the proxy (they would name tasks the host was never given)."""
    log = tmp_path / "upstream.jsonl"
    requests: list[Any] = [
        types.GetTaskRequest(params=types.GetTaskRequestParams(task_id="t-1")),
        types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id="t-1")),
        types.ListTasksRequest(params=types.PaginatedRequestParams()),
        types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id="t-1")),
    ]
    async with connect(store_url, TaskUpstream(log), mode) as client:
        caps = client.server_capabilities
        for request in requests:
            with pytest.raises(MCPError) as refused:
                await client.session.send_request(request, types.EmptyResult)
            assert refused.value.code == METHOD_NOT_FOUND, request.method
    assert caps is not None and caps.tasks is None and "io.modelcontextprotocol/tasks" not in (caps.extensions or {})
    assert not events(log, "get") and not events(log, "cancel")


@pytest.mark.slow
async def test_a_proxy_killed_while_following_a_task_is_taken_over_on_the_same_task(
    tmp_path: Path, store_url: str
) -> None:
    """The upstream runs on its own (Streamable HTTP), so its task outlives the proxy that asked for it. The
    proxy is killed while it follows the task; a new proxy takes the call over when the lease expires and
    follows the same task (``tasks/get``, never a second ``tools/call``), and its result is recorded. Every
    request reached the upstream with the revision's routing headers: ``Mcp-Method``, and ``Mcp-Name`` (the
    tool, then the task id)."""
    from http_proxies import serve_asgi

    log, release = tmp_path / "upstream.jsonl", tmp_path / "release"
    upstream = TaskUpstream(log, held=True, release_file=release)
    config_path = tmp_path / "agentguard.toml"
    pay = {"order_id": "o-1", "task_id": "ticket-6"}
    async with serve_asgi(upstream.server.streamable_http_app(host="127.0.0.1")) as url:
        config_path.write_text(f'[store]\nurl = "{store_url}"\nlease = 1\n\n[upstream]\nurl = "{url}"\n\n'
                               '[proxy]\ngrace = 0.5\n\n' + GUARDED)
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "agentguard.cli", "mcp-proxy", "--config", str(config_path)], env={"PYTHONPATH": str(PACKAGE_ROOT)})
        failures: list[BaseException] = []
        async with Client(params, mode="auto") as client:

            async def first() -> None:
                try:
                    await client.call_tool("pay", pay)
                except MCPError as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await until(lambda: len(events(log, "get")) >= 1)  # following the task
                [pid] = _pids(f"--config\0{config_path}")
                os.kill(pid, signal.SIGKILL)
        assert failures
        async with Client(params, mode="auto") as client:
            async with anyio.create_task_group() as tg:
                results: list[types.CallToolResult] = []

                async def retry() -> None:
                    results.append(await client.call_tool("pay", pay))

                tg.start_soon(retry)
                seen = len(events(log, "get"))
                await until(lambda: len(events(log, "get")) > seen)  # the new proxy follows the same task
                release.touch()
            again = await client.call_tool("pay", pay)
    [called] = events(log, "call")
    [paid] = events(log, "pay")
    assert {e["task"] for e in events(log, "get")} == {paid["task"]}
    assert not results[0].is_error and text(results[0]) == "paid #1"
    assert again.meta and again.meta[META_REPLAYED] is True
    assert (called["mcp-method"], called["mcp-name"]) == ("tools/call", "pay")
    assert {(e["mcp-method"], e["mcp-name"]) for e in events(log, "get")} == {("tasks/get", paid["task"])}


def _pids(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found
