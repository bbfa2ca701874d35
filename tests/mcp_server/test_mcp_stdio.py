"""The proxy as a host runs it: ``agentguard mcp-proxy --config FILE`` as a subprocess over stdio, with the
payments demo as its own stdio upstream, driven by the real ``mcp`` Client in both protocol eras. Crashes are
real signals to real processes; every test counts the charges in the demo's SQLite ledger."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters

import agentguard
from agentguard.mcp import META_KEY, META_REPLAYED

from conftest import BACKEND

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import full_upstream
import shifting_upstream

pytestmark = [pytest.mark.storeless, pytest.mark.anyio, pytest.mark.slow, pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="finds the processes to signal through /proc"
)]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(agentguard.__file__).resolve().parent.parent
CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-8812"}


class Setup:
    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.tmp, self.store_url = tmp_path, store_url
        self.hold = tmp_path / "release"
        self.hold.touch()

    def config(self, name: str = "agentguard.toml", *, ledger: str = "payments.db", lease: float = 30,
               grace: float = 2, forward: bool = True) -> Path:
        path = self.tmp / name
        path.write_text(
            f'[store]\nurl = "{self.store_url}"\nlease = {lease}\n\n'
            f'[upstream]\ncommand = ["python", "{ROOT / "servers" / "payments_demo.py"}"]\n'
            f'env = {{ PAYMENTS_DEMO_DB = "{self.tmp / ledger}", PAYMENTS_DEMO_HOLD_FILE = "{self.hold}" }}\n\n'
            f'[proxy]\ngrace = {grace}\n\n'
            '[tools.create_charge]\nkey = ["order_id"]\n'
            + ('forward_key_to = "idempotency_key"\n' if forward else "")
        )
        return path

    def proxy(self, config: Path) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable, args=["-m", "agentguard.cli", "mcp-proxy", "--config", str(config)],
            env={"PYTHONPATH": str(PACKAGE_ROOT)}, cwd=str(self.tmp),
        )

    def charges(self, ledger: str = "payments.db") -> list[tuple[str, str | None]]:
        db = self.tmp / ledger
        if not db.exists():
            return []
        with sqlite3.connect(db) as conn:
            try:
                return conn.execute("SELECT id, idempotency_key FROM charges ORDER BY created").fetchall()
            except sqlite3.OperationalError:  # the demo is still creating its tables
                return []

    async def charged(self) -> None:
        # Polled: the row is written by another process, and no event crosses that boundary.
        while not self.charges():  # noqa: ASYNC110
            await anyio.sleep(0.02)

    def release(self) -> None:
        self.hold.touch()

    def block(self) -> None:
        self.hold.unlink()


@pytest.fixture
def setup(tmp_path: Path, store_url: str) -> Setup:
    return Setup(tmp_path, store_url)


def pids(marker: str, where: str) -> list[int]:
    """Processes of ours whose cmdline or environ contains ``marker``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker.encode() in (d / where).read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_repeat_is_replayed_and_a_second_process_replays_too(setup: Setup) -> None:
    async with Client(setup.proxy(setup.config()), mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"  # how Codex connects
        tools = {t.name: t for t in (await client.list_tools()).tools}
        first = await client.call_tool("create_charge", CHARGE)
        second = await client.call_tool("create_charge", CHARGE)
    [(charge_id, upstream_key)] = setup.charges()
    assert "task_id" in tools["create_charge"].input_schema["required"]
    assert first.structured_content and first.structured_content["id"] == charge_id
    assert second.structured_content == first.structured_content
    assert first.meta and second.meta and first.meta[META_REPLAYED] is False and second.meta[META_REPLAYED] is True
    assert first.meta[META_KEY] == upstream_key
    assert "REPLAY" in text(second)
    # Another proxy process on the same store, in front of a fresh ledger (a forwarded call would show
    # there), over the 2026-07-28 era as Claude Code speaks it.
    async with Client(setup.proxy(setup.config("second.toml", ledger="fresh.db")), mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        third = await client.call_tool("create_charge", CHARGE)
    assert len(setup.charges()) == 1 and setup.charges("fresh.db") == []
    assert third.meta and third.meta[META_REPLAYED] is True
    assert third.structured_content == first.structured_content


async def test_five_concurrent_calls_make_one_charge(setup: Setup) -> None:
    setup.block()
    results: list[types.CallToolResult] = []
    async with Client(setup.proxy(setup.config()), mode="2026-07-28") as client:

        async def call() -> None:
            results.append(await client.call_tool("create_charge", CHARGE))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(call)
            await setup.charged()
            setup.release()
    [(charge_id, _)] = setup.charges()
    assert {r.structured_content["id"] for r in results if r.structured_content} == {charge_id}
    assert sum(1 for r in results if r.meta and r.meta[META_REPLAYED] is False) == 1
    assert len(results) == 5 and not any(r.is_error for r in results)


async def test_proxy_sigkilled_mid_call_then_restarted_makes_one_charge(setup: Setup) -> None:
    config = setup.config(lease=1.5)
    setup.block()
    failures: list[BaseException] = []
    async with Client(setup.proxy(config), mode="legacy") as client:

        async def first() -> None:
            try:
                await client.call_tool("create_charge", CHARGE)
            except MCPError as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await setup.charged()  # the provider charged; the proxy has not recorded the answer yet
            [pid] = pids(f"--config\0{config}", "cmdline")
            os.kill(pid, signal.SIGKILL)
    assert failures, "the call in flight must fail when the proxy dies"
    setup.release()  # let the orphaned upstream finish and exit
    # A restarted proxy finds the claim held by the dead one, takes it over when its lease expires and goes
    # upstream with the same key: the provider deduplicates.
    async with Client(setup.proxy(config), mode="legacy") as client:
        retry = await client.call_tool("create_charge", CHARGE)
        again = await client.call_tool("create_charge", CHARGE)
    [(charge_id, upstream_key)] = setup.charges()
    assert not retry.is_error and retry.structured_content and retry.structured_content["id"] == charge_id
    assert retry.meta and retry.meta[META_KEY] == upstream_key
    assert again.meta and again.meta[META_REPLAYED] is True


class Host:
    """A host process (``tests/mcp_host.py``) making one call through its own proxy; the proxy's stderr is its."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.stderr: list[str] = []
        self.stdout = b""

    async def read(self) -> None:
        async def out() -> None:
            assert self.process.stdout is not None
            async for chunk in self.process.stdout:
                self.stdout += chunk

        async def err() -> None:
            assert self.process.stderr is not None
            buffer = b""
            async for chunk in self.process.stderr:  # the proxy's too: its write end outlives a killed host
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                self.stderr.extend(line.decode(errors="replace") for line in lines)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(out)
                tg.start_soon(err)
        finally:
            with anyio.CancelScope(shield=True):
                await self.process.aclose()

    async def saying(self, text: str) -> None:
        while not any(text in line for line in self.stderr):  # noqa: ASYNC110 - another process logs it
            await anyio.sleep(0.02)

    async def result(self) -> types.CallToolResult:
        with anyio.fail_after(60):
            code = await self.process.wait()
            while not self.stdout.endswith(b"\n"):  # noqa: ASYNC110 - the reader drains what is left
                await anyio.sleep(0.02)
        assert code == 0, "\n".join(self.stderr)
        return types.CallToolResult.model_validate_json(self.stdout)


async def start_host(tg: anyio.abc.TaskGroup, config: Path, mode: str) -> Host:
    cmd = [sys.executable, str(ROOT / "tests" / "mcp_host.py"), str(config), mode, "create_charge", json.dumps(CHARGE)]
    process = await anyio.open_process(cmd, env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT),
                                                 "AGENTGUARD_LOG": "DEBUG"}, cwd=config.parent)
    host = Host(process)
    tg.start_soon(host.read)
    return host


# The proxy's end of input, whatever the store: its claims' waits and takeovers are proven on both stores above
# and in test_mcp_http (a dropped stream) and test_mcp_replicas (a killed replica).
@pytest.mark.storeless
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_host_killed_mid_call_then_started_again_gets_the_one_charge(setup: Setup, mode: str) -> None:
    """The host process dies mid-call (SIGKILL): its proxy meets the end of its input and finishes the call in
    flight within ``grace``. The host, started again, re-issues the call (a new process, a new proxy): it waits
    for the call the first proxy is finishing and gets its charge, labelled as a replay."""
    config = setup.config(grace=30)
    setup.block()
    async with anyio.create_task_group() as tg:
        first = await start_host(tg, config, mode)
        await setup.charged()
        first.process.kill()
        again = await start_host(tg, config, mode)
        await again.saying("waiting create_charge")  # its proxy waits for the call in flight
        setup.release()
        result = await again.result()
    [(charge_id, _)] = setup.charges()
    assert not result.is_error and result.structured_content and result.structured_content["id"] == charge_id
    assert result.meta and result.meta[META_REPLAYED] is True and "REPLAY" in text(result)


@pytest.mark.storeless
@pytest.mark.parametrize("forward", [True, False], ids=["key-forwarded", "key-not-forwarded"])
async def test_a_host_and_its_proxy_gone_mid_call(setup: Setup, forward: bool) -> None:
    """The host dies mid-call and its proxy, past ``grace``, exits with the call still in flight: it never
    cancels the call into a release (the provider may have charged). The claim expires with its lease, and the
    restarted host's re-issue is settled by the rule for a worker that died inside the call: taken over with
    the same key where the key reaches the provider (which deduplicates: one charge, the first one's), held
    for a person otherwise (refused, nothing run: one charge)."""
    config = setup.config(grace=0.3, lease=1, forward=forward)
    setup.block()
    async with anyio.create_task_group() as tg:
        first = await start_host(tg, config, "auto")
        await setup.charged()
        first.process.kill()
        with anyio.fail_after(30):  # its proxy exits on its own, saying so
            await first.saying("exiting without releasing their claims")
            while pids(f"--config\0{config}", "cmdline"):  # noqa: ASYNC110 - another process
                await anyio.sleep(0.02)
        setup.release()  # (the orphaned upstream's answer goes nowhere)
        result = await (await start_host(tg, config, "auto")).result()
    [(charge_id, upstream_key)] = setup.charges()
    if forward:
        assert not result.is_error and result.structured_content and result.structured_content["id"] == charge_id
        assert result.meta and result.meta[META_KEY] == upstream_key
    else:
        assert result.is_error and "unknown" in text(result) and "Nothing was executed" in text(result), text(result)


async def test_client_timeout_then_upstream_death_in_one_session(setup: Setup) -> None:
    setup.block()
    ledger = f"PAYMENTS_DEMO_DB={setup.tmp / 'payments.db'}"
    async with Client(setup.proxy(setup.config()), mode="auto") as client:
        # A client-side timeout on the first call: the retry gets the recorded result, one charge.
        with pytest.raises(MCPError):
            await client.call_tool("create_charge", CHARGE, read_timeout_seconds=0.5)
        await setup.charged()
        setup.release()
        retry = await client.call_tool("create_charge", CHARGE)
        [(charge_id, _)] = setup.charges()
        assert retry.structured_content and retry.structured_content["id"] == charge_id
        assert retry.meta and retry.meta[META_REPLAYED] is True  # recorded although the first caller gave up

        # The upstream dies between calls: reported as a tool error at worst, then the proxy reconnects.
        [upstream] = pids(ledger, "environ")
        os.kill(upstream, signal.SIGKILL)
        results = [await client.call_tool("list_charges", {}) for _ in range(2)]
        again = await client.call_tool("create_charge", CHARGE)
    assert all(not r.is_error or "upstream" in text(r) for r in results) and not results[-1].is_error
    assert results[-1].structured_content == {"result": [retry.structured_content]}
    assert again.meta and again.meta[META_REPLAYED] is True and len(setup.charges()) == 1
    assert pids(ledger, "environ") != [upstream]


async def test_sigterm_lets_the_call_in_flight_finish_and_exits_cleanly(setup: Setup) -> None:
    config = setup.config()
    setup.block()
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config)]
    async with await anyio.open_process(cmd, env=env, cwd=str(setup.tmp)) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        lines = proc.stdout

        async def send(msg: dict[str, Any]) -> None:
            assert proc.stdin is not None
            await proc.stdin.send((json.dumps({"jsonrpc": "2.0", **msg}) + "\n").encode())

        buffer = b""

        async def receive() -> dict[str, Any]:
            nonlocal buffer
            while b"\n" not in buffer:
                buffer += await lines.receive()
            line, buffer = buffer.split(b"\n", 1)
            return dict(json.loads(line))

        await send({"id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
        assert (await receive())["id"] == 1
        await send({"method": "notifications/initialized"})
        await send({"id": 2, "method": "tools/call", "params": {"name": "create_charge", "arguments": CHARGE}})
        await setup.charged()
        proc.send_signal(signal.SIGTERM)
        setup.release()  # the call in flight completes within the grace period
        reply = await receive()
        assert reply["id"] == 2 and not reply["result"].get("isError")
        await proc.stdin.aclose()
        assert await proc.wait() == 0
    [(charge_id, _)] = setup.charges()
    assert reply["result"]["structuredContent"]["id"] == charge_id


async def test_guarded_native_server_over_stdio(setup: Setup) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(ROOT / "servers" / "guarded_payments.py")],
        env={"PYTHONPATH": str(PACKAGE_ROOT), "AGENTGUARD_URL": setup.store_url,
             "PAYMENTS_DEMO_DB": str(setup.tmp / "payments.db")},
    )
    async with Client(params, mode="auto") as client:
        first = await client.call_tool("create_charge", CHARGE)
        second = await client.call_tool("create_charge", CHARGE)
        other = await client.call_tool("create_charge", {**CHARGE, "amount_cents": 1})
    [(charge_id, upstream_key)] = setup.charges()
    assert first.structured_content and first.structured_content["id"] == charge_id
    assert second.structured_content == first.structured_content
    assert second.meta and second.meta[META_REPLAYED] is True and "REPLAY" in text(second)
    assert first.meta and first.meta[META_KEY] == upstream_key
    assert other.is_error and "amount_cents" in text(other) and "Nothing was executed." in text(other)


async def test_an_upstream_restarted_with_other_tools_is_not_passed_through(setup: Setup) -> None:
    """The upstream dies and the proxy reconnects to a new process that offers ``pay`` without the
    ``order_id`` the config keys on: the call is refused (nothing runs upstream), ``tools/list`` leaves it
    out, and the upstream was spawned once at startup (the connection checked is the one served), once after."""
    shape, log = setup.tmp / "shape", setup.tmp / "log.jsonl"
    shifting_upstream.set_shape(shape, "ok")
    config = setup.tmp / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{setup.store_url}"\n\n'
        f'[upstream]\ncommand = ["python", "{ROOT / "tests" / "shifting_upstream.py"}"]\n'
        f'env = {{ SHIFTING_SHAPE = "{shape}", SHIFTING_LOG = "{log}" }}\n\n'
        '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    )
    pay = {"order_id": "o-1", "amount_cents": 100, "task_id": "t"}
    async with Client(setup.proxy(config), mode="legacy") as client:
        first = await client.call_tool("pay", pay)
        [started] = shifting_upstream.events(log, "start")
        shifting_upstream.set_shape(shape, "renamed")  # what the upstream offers when it starts again
        os.kill(started["pid"], signal.SIGKILL)
        while started["pid"] in pids(f"SHIFTING_LOG={log}", "environ"):  # noqa: ASYNC110 - another process
            await anyio.sleep(0.02)
        # A call that meets the dead connection reports it; the proxy then reconnects.
        for _ in range(100):
            try:
                listed = {t.name for t in (await client.list_tools()).tools}
                break
            except MCPError:
                await anyio.sleep(0.02)
        else:
            pytest.fail("the proxy did not reconnect to the upstream")
        refused = await client.call_tool("pay", {**pay, "order_id": "o-2"})
    assert not first.is_error
    assert "pay" not in listed and "reshape" in listed
    assert refused.is_error and text(refused).endswith("Nothing was executed."), text(refused)
    assert [e["args"]["order_id"] for e in shifting_upstream.events(log, "pay")] == ["o-1"]
    assert len(shifting_upstream.events(log, "start")) == 2


@pytest.mark.parametrize("how", ["exits-at-once", "command-gone"])
async def test_an_upstream_that_cannot_be_restarted_is_a_setup_error(setup: Setup, how: str) -> None:
    """The upstream dies and cannot be started again: its process exits at once, or its command is gone.
    Neither a guarded call nor a passed-through one reaches it, and neither tells the model to retry shortly:
    the text says the proxy cannot reach its upstream and a person must fix the proxy's configuration. Once
    that is done, the same call runs, once."""
    shape, log = setup.tmp / "shape", setup.tmp / "log.jsonl"
    shifting_upstream.set_shape(shape, "ok")
    command = setup.tmp / "upstream.sh"  # the upstream's command, a path a person may get wrong
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "shifting_upstream.py"}"\n')
    command.chmod(0o755)
    config = setup.tmp / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{setup.store_url}"\n\n'
        f'[upstream]\ncommand = ["{command}"]\n'
        f'env = {{ SHIFTING_SHAPE = "{shape}", SHIFTING_LOG = "{log}" }}\n\n'
        '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'
    )
    pay = {"order_id": "o-1", "amount_cents": 100, "task_id": "t"}
    script = command.read_text()
    async with Client(setup.proxy(config), mode="legacy") as client:
        first = await client.call_tool("pay", pay)
        [started] = shifting_upstream.events(log, "start")
        if how == "exits-at-once":
            shifting_upstream.set_shape(shape, "broken")
        else:
            command.unlink()
        os.kill(started["pid"], signal.SIGKILL)
        while started["pid"] in pids(f"SHIFTING_LOG={log}", "environ"):  # noqa: ASYNC110 - another process
            await anyio.sleep(0.02)
        # A listing that meets the dead connection reports it; the next one tries to start the upstream again.
        for _ in range(100):
            with pytest.raises(MCPError) as listing:
                await client.list_tools()
            if "cannot reach its upstream server" in listing.value.error.message:
                break
        else:
            pytest.fail("the proxy never tried to start its upstream again")
        guarded = await client.call_tool("pay", {**pay, "order_id": "o-2"})
        passed = await client.call_tool("reshape", {"shape": "gone"})
        assert shape.read_text() == ("broken" if how == "exits-at-once" else "ok")  # reshape never ran
        if how == "exits-at-once":
            shifting_upstream.set_shape(shape, "ok")
        else:
            command.write_text(script)
            command.chmod(0o755)
        fixed = await client.call_tool("pay", {**pay, "order_id": "o-2"})
    assert not first.is_error and not fixed.is_error, text(fixed)
    for refused in (guarded, passed):
        assert refused.is_error and text(refused).endswith("Nothing was executed."), text(refused)
        assert "cannot reach its upstream server" in text(refused), text(refused)
        assert "a person must fix the proxy's configuration" in text(refused)
        assert "retry the same call" not in text(refused).lower()
    assert [e["args"]["order_id"] for e in shifting_upstream.events(log, "pay")] == ["o-1", "o-2"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_whole_surface_of_an_upstream_over_stdio(setup: Setup, mode: str) -> None:
    """The command in front of ``full_upstream.py`` over stdio: resources, prompts, completions, progress, the
    upstream's questions, its log lines and its announced changes all reach the host (the in-process tests
    cover every pairing of eras; this is the one a host runs)."""
    log = setup.tmp / "upstream.jsonl"
    config = setup.tmp / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{setup.store_url}"\n\n'
        f'[upstream]\ncommand = ["python", "{ROOT / "tests" / "full_upstream.py"}"]\nenv = {{ FULL_LOG = "{log}" }}\n\n'
        '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n')
    heard: list[Any] = []
    changed = anyio.Event()

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        heard.append(params.message)
        return types.ElicitResult(action="accept", content={"card": "amex-7"})

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params.data)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.PromptListChangedNotification):
            changed.set()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        heard.append(done)

    async with Client(setup.proxy(config), mode=mode, elicitation_callback=elicit, logging_callback=logged,
                      message_handler=on_message, log_level="info") as client, anyio.create_task_group() as tg:
        if mode == "legacy":  # log lines at a level the host sets (2026-07-28: each request's log_level)
            await client.session.send_request(types.SetLevelRequest(
                params=types.SetLevelRequestParams(level="info")), types.EmptyResult)
        else:
            async def listen(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with client.listen(prompts_list_changed=True) as events:
                    task_status.started()
                    async for _ in events:
                        changed.set()

            await tg.start(listen)
        paid = await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"}, progress_callback=on_progress)
        asked = await client.call_tool("pay_asking", {"order_id": "o-2"})
        await client.call_tool("log", {"level": "warning", "message": "careful now"})
        read = await client.read_resource("memo://b")
        prompt = await client.get_prompt("greet", {"name": "ada"})
        done = await client.complete(types.PromptReference(type="ref/prompt", name="greet"),
                                     {"name": "name", "value": "b"})
        await client.call_tool("add", {"kind": "prompt", "name": "new"})
        with anyio.fail_after(10):
            await changed.wait()
        tg.cancel_scope.cancel()
    assert not paid.is_error and text(asked) == "paid with amex-7"
    assert heard == [1, 2, "Which card?", "careful now"]
    assert [c.text for c in read.contents if isinstance(c, types.TextResourceContents)] == ["contents of memo://b"]
    assert prompt.messages[0].content == types.TextContent(type="text", text="Hello, ada")
    assert done.completion.values == ["bob"]
    assert [e["args"]["order_id"] for e in full_upstream.events(log, "pay")] == ["o-1", "o-2"]


def readme_config() -> str:
    """The README's ``agentguard.toml``, as written."""
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    [block] = [b for b in blocks if b.startswith("# agentguard.toml")]
    return block


@pytest.mark.skipif(BACKEND != "sqlite", reason="the README's config names its own SQLite store")
async def test_the_readme_config_works_from_an_empty_folder(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    config = readme_config()
    # As written: the demo server ships in the package, so the config runs from any folder.
    assert '"-m", "agentguard.servers.payments_demo"' in config
    (folder / "agentguard.toml").write_text(config)
    assert [p.name for p in folder.iterdir()] == ["agentguard.toml"]
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentguard.cli", "mcp-proxy", "--config", "agentguard.toml"],
        env={"PYTHONPATH": str(PACKAGE_ROOT)}, cwd=str(folder),
    )
    charge = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-8812"}
    async with Client(params) as client:
        first = await client.call_tool("create_charge", {**charge, "memo": "Order o-1"})
        second = await client.call_tool("create_charge", {**charge, "memo": "Order o-1, retried"})  # ignored
    assert not first.is_error, text(first)
    assert second.meta and second.meta[META_REPLAYED] is True and "REPLAY" in text(second)
    assert second.structured_content == first.structured_content
    with sqlite3.connect(folder / "payments.db") as conn:  # the README's PAYMENTS_DEMO_DB, in the folder
        assert conn.execute("SELECT id, memo FROM charges").fetchall() == [(first.structured_content["id"],
                                                                            "Order o-1")]
