"""``agentguard mcp-proxy --http``: one guarding proxy, run as the real command, served to several hosts over
Streamable HTTP, each a real ``mcp`` Client (handshake-era sessions and 2026-07-28 requests). Every request
needs the bearer token; one without it is refused with 401 and reaches neither the MCP server nor the upstream.
A host that gives up mid-call does not split the call. Side effects are counted in the upstreams' own logs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import full_upstream
import httpx2
import mcp_types as types
import pytest
from http_proxies import ROOT, TOKEN, env, free_socket, host, http_proxy
from mcp import MCPError
from upstream_log import charges

from agentguard.mcp import META_REPLAYED

pytestmark = [pytest.mark.storeless, pytest.mark.anyio, pytest.mark.slow]

PAY = {"order_id": "o-1", "amount_cents": 4900, "task_id": "ticket-9"}


def write_config(tmp: Path, *, upstream: str, tools: str, proxy: str = "") -> Path:
    path = tmp / "agentguard.toml"
    path.write_text(f'[store]\nurl = "{{store}}"\n\n[upstream]\n{upstream}\n\n[proxy]\ngrace = 2\n{proxy}\n\n{tools}')
    return path


def full_config(tmp: Path, store_url: str, proxy: str = "") -> Path:
    path = write_config(
        tmp, upstream=f'command = ["python", "{ROOT / "tests" / "full_upstream.py"}"]\n'
                      f'env = {{ FULL_LOG = "{tmp / "upstream.jsonl"}" }}',
        tools='[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n', proxy=proxy)
    path.write_text(path.read_text().replace("{store}", store_url))
    return path


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_hosts_of_both_eras_share_one_guarding_proxy(tmp_path: Path, store_url: str) -> None:
    """A handshake-era session and 2026-07-28 requests, at once: one payment; the whole surface (resources,
    prompts, progress, the upstream's questions) works for both."""
    log = tmp_path / "upstream.jsonl"
    answered: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        answered.append(params.message)
        return types.ElicitResult(action="accept", content={"card": "visa-42"})

    results: dict[str, list[Any]] = {}
    async with http_proxy(full_config(tmp_path, store_url)) as proxy:

        async def session(mode: str) -> None:
            progress: list[float] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append(done)

            async with host(proxy.url, mode, elicitation_callback=elicit) as client:
                pay = await client.call_tool("pay", PAY, progress_callback=on_progress)
                asked = await client.call_tool("pay_asking", {"order_id": f"o-{mode}"})
                read = await client.read_resource("memo://a")
                prompt = await client.get_prompt("greet", {"name": mode})
                results[mode] = [client.protocol_version, pay, asked, read, prompt, progress]

        async with anyio.create_task_group() as tg:
            tg.start_soon(session, "legacy")
            tg.start_soon(session, "auto")
    assert results["legacy"][0] == "2025-11-25" and results["auto"][0] == "2026-07-28"
    pays = [results[m][1] for m in ("legacy", "auto")]
    assert [e["args"]["order_id"] for e in full_upstream.events(log, "pay") if "card" not in e] == ["o-1"]
    assert pays[0].structured_content == pays[1].structured_content
    assert sorted(bool(p.meta and p.meta[META_REPLAYED]) for p in pays) == [False, True]
    first = next(m for m, p in zip(("legacy", "auto"), pays, strict=True) if p.meta and not p.meta[META_REPLAYED])
    assert results[first][5] == [1, 2]  # the progress of the call that ran
    for mode in ("legacy", "auto"):
        _, _, asked, read, prompt, _ = results[mode]
        assert text(asked) == "paid with visa-42"
        assert [c.text for c in read.contents if isinstance(c, types.TextResourceContents)] == ["contents of memo://a"]
        assert prompt.messages[0].content == types.TextContent(type="text", text=f"Hello, {mode}")
    assert answered == ["Which card?", "Which card?"]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-xxxxxxxxxxxxxxxxxxxx", f"Bearer {TOKEN[:-1]}",
                                           f"Bearer {TOKEN}x", f"Bearer  {TOKEN}", TOKEN, f"Basic {TOKEN}"],
                         ids=["none", "wrong", "prefix", "longer", "two-blanks", "bare", "basic"])
async def test_a_request_without_the_token_gets_401_and_reaches_nothing(
    tmp_path: Path, store_url: str, authorization: str | None
) -> None:
    log = tmp_path / "upstream.jsonl"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "pay", "arguments": PAY, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                                   "io.modelcontextprotocol/clientCapabilities": {}}}}
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tools/call", "Mcp-Name": "pay"}
    if authorization is not None:
        headers["Authorization"] = authorization
    async with http_proxy(full_config(tmp_path, store_url)) as proxy, httpx2.AsyncClient() as http:
        refused = await http.post(proxy.url, json=body, headers=headers)
        listed = await http.get(proxy.url.replace("/mcp", "/"), headers=headers)
        # With the token (the scheme's case does not matter) a request goes through: the refusal was the token's.
        accepted = await http.post(proxy.url, json={**body, "params": {**body["params"], "name": "touch",
                                                                       "arguments": {"uri": "memo://z"}}},
                                   headers={**headers, "Authorization": f"bearer {TOKEN}", "Mcp-Name": "touch"})
    assert refused.status_code == 401 and listed.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert accepted.status_code == 200, accepted.text
    assert [e["tool"] for e in full_upstream.events(log, "call")] == ["touch"]
    assert any("without the right bearer token" in line for line in proxy.stderr)


@pytest.mark.parametrize("token, says", [(None, "needs a bearer token"), ("short", "at least 16 characters")])
async def test_without_a_usable_token_it_does_not_start(tmp_path: Path, store_url: str, token: str | None,
                                                        says: str) -> None:
    config = full_config(tmp_path, store_url)
    extra = {"AGENTGUARD_PROXY_TOKEN": token} if token is not None else {}
    cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config), "--http", "0"]
    with anyio.fail_after(60):
        out = await anyio.run_process(cmd, env=env(**extra), cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    stderr = out.stderr.decode()
    assert out.returncode == 2 and says in stderr and out.stdout == b"", stderr
    assert not (tmp_path / "upstream.jsonl").exists()  # nothing was started


async def test_an_address_that_cannot_be_listened_on_stops_it(tmp_path: Path, store_url: str) -> None:
    config = full_config(tmp_path, store_url)
    with free_socket() as busy:
        busy.listen()
        cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config), "--http",
               f"127.0.0.1:{busy.getsockname()[1]}"]
        with anyio.fail_after(60):
            out = await anyio.run_process(cmd, env=env(AGENTGUARD_PROXY_TOKEN=TOKEN), cwd=tmp_path,
                                          stdin=subprocess.DEVNULL, check=False)
    stderr = out.stderr.decode()
    assert out.returncode == 2 and "cannot listen on 127.0.0.1:" in stderr and "Traceback" not in stderr, stderr


async def test_it_listens_on_loopback_unless_told_otherwise_and_takes_the_token_from_the_config(
    tmp_path: Path, store_url: str
) -> None:
    config = full_config(tmp_path, store_url, proxy=f'token = "{TOKEN}"')
    async with http_proxy(config, address="0", token=None) as proxy:
        assert proxy.url.startswith("http://127.0.0.1:")
        async with host(proxy.url, "legacy") as client:
            listed = {t.name for t in (await client.list_tools()).tools}
    assert "pay" in listed


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_dropped_stream_then_the_call_reissued_makes_one_charge(tmp_path: Path, store_url: str,
                                                                     mode: str) -> None:
    """The host's read timeout fires while the provider holds its answer: the handshake-era client cancels
    the request (``notifications/cancelled``), the 2026-07-28 one drops its HTTP request (the revision's
    cancellation). The call runs to its end all the same. The same call is then re-issued while it is still in
    flight, with a new JSON-RPC id on the same connection and from a new connection: each waits for the call
    in flight and gets its one charge, labelled as a replay."""
    hold, ledger = tmp_path / "release", tmp_path / "payments.db"
    config = write_config(
        tmp_path, upstream=f'command = ["python", "{ROOT / "servers" / "payments_demo.py"}"]\n'
                           f'env = {{ PAYMENTS_DEMO_DB = "{ledger}", PAYMENTS_DEMO_HOLD_FILE = "{hold}" }}',
        tools='[tools.create_charge]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n')
    config.write_text(config.read_text().replace("{store}", store_url))
    charge = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-3"}
    reissued: list[types.CallToolResult] = []

    async with http_proxy(config, log_level="DEBUG") as proxy, host(proxy.url, mode) as client:
        with pytest.raises(MCPError):
            await client.call_tool("create_charge", charge, read_timeout_seconds=0.5)
        while not charges(ledger):  # noqa: ASYNC110 - written by another process
            await anyio.sleep(0.02)
        await proxy.saying("cancelled its request for tools/call create_charge")  # the proxy saw the drop

        async def again(client: Any) -> None:
            reissued.append(await client.call_tool("create_charge", charge))

        async def from_a_new_connection() -> None:
            async with host(proxy.url, mode) as other:
                await again(other)

        async with anyio.create_task_group() as tg:
            tg.start_soon(again, client)
            tg.start_soon(from_a_new_connection)
            await proxy.saying("waiting create_charge", times=2)  # both wait for the call in flight
            hold.touch()
    [(charge_id,)] = charges(ledger)
    for retry in reissued:
        assert not retry.is_error and retry.structured_content and retry.structured_content["id"] == charge_id
        assert retry.meta and retry.meta[META_REPLAYED] is True and "REPLAY" in text(retry)
    assert len(reissued) == 2


async def test_sigterm_ends_the_http_proxy_cleanly(tmp_path: Path, store_url: str) -> None:
    async with http_proxy(full_config(tmp_path, store_url)) as proxy:
        async with host(proxy.url, "auto") as client:
            await client.call_tool("pay", PAY)
        proxy.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            code = await proxy.process.wait()
    assert code == 0
