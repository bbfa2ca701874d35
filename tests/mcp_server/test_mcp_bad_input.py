"""Bad input on either side never changes a guarded call's outcome, which is decided once: an upstream that sends
garbage mid-call (``raw_upstream.py``, written without the SDK), a host that answers the proxy's confirmation
with garbage, a host that cancels a guarded call (it finishes, is recorded, and the cancellation is logged).
The hosts here are hand-written JSON-RPC over the real command's stdio, so nothing tidies what they send."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import full_upstream
import mcp_types as types
import pytest
import raw_upstream
from mcp import Client
from upstream_log import charges

import agentguard
from agentguard.mcp import META_REPLAYED, GuardingProxy, parse_config

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent


@pytest.mark.parametrize("host", ["legacy", "auto"])
async def test_garbage_from_the_upstream_mid_call_does_not_change_the_outcome(
    store_url: str, tmp_path: Path, host: str
) -> None:
    log = tmp_path / "raw.jsonl"
    config = parse_config(
        f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["python", "{ROOT / "tests" / "raw_upstream.py"}"]\n'
        f'env = {{ RAW_LOG = "{log}" }}\n\n[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n')
    asked: list[Any] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="cancel")

    proxy = GuardingProxy(config, environ={})
    async with proxy.started(), Client(proxy.server, mode=host, elicitation_callback=elicit) as client:
        first = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"})
        replay = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"})
    assert not first.is_error and first.structured_content == {"n": 1}
    assert replay.meta and replay.meta[META_REPLAYED] is True and replay.structured_content == first.structured_content
    assert len(raw_upstream.events(log, "pay")) == 1
    # Its malformed elicitation request was answered with an error and never reached the host.
    [answered] = raw_upstream.events(log, "answered")
    assert answered["message"]["id"] == "ask-1" and "error" in answered["message"] and asked == []


class RawHost:
    """A host written by hand: JSON-RPC lines on the command's stdin and stdout (handshake era)."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self._buffer = b""

    async def send(self, **message: Any) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())

    async def receive(self) -> dict[str, Any]:
        """The next request or response (notifications are skipped)."""
        assert self.process.stdout is not None
        while True:
            while b"\n" not in self._buffer:
                self._buffer += await self.process.stdout.receive()
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "id" in message:
                return dict(message)

    async def start(self, capabilities: dict[str, Any]) -> None:
        await self.send(id=1, method="initialize", params={"protocolVersion": "2025-11-25",
                                                           "capabilities": capabilities,
                                                           "clientInfo": {"name": "raw", "version": "0"}})
        assert (await self.receive())["id"] == 1
        await self.send(method="notifications/initialized")


@contextlib.asynccontextmanager
async def raw_host(config: Path, stderr: list[str]) -> AsyncIterator[RawHost]:
    cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    async with await anyio.open_process(cmd, env=env, cwd=config.parent) as proc, anyio.create_task_group() as tg:

        async def drain() -> None:
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                stderr.extend(chunk.decode().splitlines())

        tg.start_soon(drain)
        yield RawHost(proc)
        assert proc.stdin is not None
        await proc.stdin.aclose()
        with anyio.fail_after(30):
            await proc.wait()
        tg.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_confirmation_answered_with_garbage_runs_nothing(store_url: str, tmp_path: Path) -> None:
    log = tmp_path / "upstream.jsonl"
    config = tmp_path / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["python", "{ROOT / "tests" / "full_upstream.py"}"]\n'
        f'env = {{ FULL_LOG = "{log}" }}\n\n[tools.pay]\nkey = ["order_id"]\nconfirm = true\n')
    pay = {"name": "pay", "arguments": {"order_id": "o-1", "task_id": "t-1"}}
    stderr: list[str] = []
    async with raw_host(config, stderr) as host:
        await host.start({"elicitation": {}})
        replies = []
        for call_id, answer in ((2, {"action": "maybe", "content": "??"}), (3, {"action": "accept",
                                                                                "content": {"confirm": True}})):
            await host.send(id=call_id, method="tools/call", params=pay)
            question = await host.receive()
            assert question["method"] == "elicitation/create" and "pay" in question["params"]["message"]
            await host.send(id=question["id"], result=answer)
            replies.append(await host.receive())
            if call_id == 2:
                assert full_upstream.events(log, "pay") == []  # nothing ran on a garbage answer
    refused, ran = (r["result"] for r in replies)
    assert refused["isError"] and refused["content"][-1]["text"].endswith("Nothing was executed.")
    assert not ran.get("isError") and len(full_upstream.events(log, "pay")) == 1


@pytest.mark.slow
async def test_a_guarded_call_the_host_cancels_finishes_and_is_recorded(store_url: str, tmp_path: Path) -> None:
    hold, ledger = tmp_path / "release", tmp_path / "payments.db"
    config = tmp_path / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["python", "{ROOT / "servers" / "payments_demo.py"}"]\n'
        f'env = {{ PAYMENTS_DEMO_DB = "{ledger}", PAYMENTS_DEMO_HOLD_FILE = "{hold}" }}\n\n'
        '[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n')
    charge = {"name": "create_charge", "arguments": {"order_id": "o-1", "amount_cents": 100, "task_id": "t-1"}}


    stderr: list[str] = []
    async with raw_host(config, stderr) as host:
        await host.start({})
        await host.send(id=2, method="tools/call", params=charge)
        while not charges(ledger):  # noqa: ASYNC110 - written by another process
            await anyio.sleep(0.02)
        await host.send(method="notifications/cancelled", params={"requestId": 2, "reason": "the user pressed stop"})
        while not any("cancelled its request" in line for line in stderr):  # noqa: ASYNC110 - another process
            await anyio.sleep(0.02)
        hold.touch()
        await host.send(id=3, method="tools/call", params=charge)
        reply = await host.receive()  # no answer comes for the cancelled request (the spec's rule)
    [(charge_id,)] = charges(ledger)
    assert reply["id"] == 3 and reply["result"]["structuredContent"]["id"] == charge_id
    assert reply["result"]["_meta"][META_REPLAYED] is True  # recorded, although nobody waited for it
    assert any("cancelled its request for tools/call create_charge" in line for line in stderr)
