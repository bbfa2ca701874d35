"""Three replicas of ``agentguard mcp-proxy --http`` on one Postgres store, behind a round-robin balancer on
loopback (``tests/balancer.py``), each in front of its own payments demo (one ledger: the provider's books).
The same task's call sent to each replica, at once and in turn, makes one charge. A replica killed mid-call
leaves the call to the rule for a worker gone inside it: the re-issued call, on another replica, takes it over
with the same key where the key reaches the provider (which deduplicates), and is held for a person otherwise.
2026-07-28 requests are stateless: any replica serves any of them. Postgres-only: the replicas share a store
as separate machines would."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from balancer import Balancer
from http_proxies import ROOT, Proxy, host, http_proxies, serve_asgi
from mcp import MCPError
from upstream_log import charges

from agentguard.mcp import META_KEY, META_REPLAYED

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

CHARGE = {"order_id": "o-1", "amount_cents": 4900, "currency": "usd", "task_id": "ticket-77"}


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, store_url: str, *, forward: bool = True, lease: float = 30
                   ) -> AsyncIterator[tuple[str, Balancer, tuple[Proxy, ...]]]:
    """Three replicas and the balancer in front of them; yields the balancer's URL, the balancer, the replicas.
    The demo holds back its answer to a new charge until the test releases it."""
    ledger, hold = tmp_path / "payments.db", tmp_path / "release"
    configs = []
    for n in range(3):
        config = tmp_path / f"replica-{n}.toml"
        config.write_text(
            f'[store]\nurl = "{store_url}"\nlease = {lease}\n\n'
            f'[upstream]\ncommand = ["python", "{ROOT / "servers" / "payments_demo.py"}"]\n'
            f'env = {{ PAYMENTS_DEMO_DB = "{ledger}", PAYMENTS_DEMO_HOLD_FILE = "{hold}" }}\n\n'
            '[proxy]\ngrace = 1\n\n[tools.create_charge]\nkey = ["order_id"]\n'
            + ('forward_key_to = "idempotency_key"\n' if forward else ""))
        configs.append(config)
    try:
        async with http_proxies(configs, log_level="DEBUG") as proxies:
            balancer = Balancer([p.url.removesuffix("/mcp") for p in proxies])
            async with serve_asgi(balancer) as url:
                yield url, balancer, proxies
    finally:
        hold.touch()  # (a demo orphaned by a killed replica finishes, and exits)


async def charged(ledger: Path) -> None:
    while not charges(ledger):  # noqa: ASYNC110 - written by another process
        await anyio.sleep(0.02)


async def kill_mid_call(url: str, balancer: Balancer, proxies: tuple[Proxy, ...], ledger: Path,
                        charge: dict[str, object]) -> tuple[types.CallToolResult, int, int]:
    """A call whose replica is killed (SIGKILL) while the provider holds its answer, then re-issued by the same
    host (a new JSON-RPC id): the re-issue's result, the replica killed and the one the re-issue went to."""
    failed: list[MCPError] = []
    before, calls = len(charges(ledger)), len(balancer.calls())
    async with host(url, "auto") as client:

        async def call() -> None:
            try:
                await client.call_tool("create_charge", charge)
            except MCPError as exc:  # the replica serving it died: the host's request fails
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            while len(charges(ledger)) == before:  # noqa: ASYNC110 - written by another process
                await anyio.sleep(0.02)
            [replica] = balancer.calls()[calls:]
            proxies[replica].process.send_signal(signal.SIGKILL)
            await proxies[replica].process.wait()
        assert failed
        reissued = await client.call_tool("create_charge", charge)
    killed_on, retried_on = balancer.calls()[calls:]
    return reissued, killed_on, retried_on


async def test_the_same_call_on_each_replica_makes_one_charge_and_a_killed_replicas_call_is_taken_over(
    tmp_path: Path, store_url: str
) -> None:
    ledger, hold = tmp_path / "payments.db", tmp_path / "release"
    # (A lease of 3 s: the killed replica's call is taken over soon, and a live replica briefly starved of the CPU
    # on a loaded machine keeps its claim; with 1 s, a stall of two thirds of a second let a waiting replica take it.)
    async with replicas(tmp_path, store_url, lease=3) as (url, balancer, proxies):
        at_once: list[types.CallToolResult] = []

        async def call() -> None:
            async with host(url, "auto") as client:
                at_once.append(await client.call_tool("create_charge", CHARGE))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(call)
            await charged(ledger)
            while sum(p.said("waiting create_charge") for p in proxies) < 2:  # noqa: ASYNC110 - other processes
                await anyio.sleep(0.02)
            hold.touch()
        in_turn = []
        for _ in range(3):
            async with host(url, "auto") as client:
                in_turn.append(await client.call_tool("create_charge", CHARGE))
        async with host(url, "legacy") as client:  # a handshake-era session stays on the replica it opened
            in_turn.append(await client.call_tool("create_charge", CHARGE))
        [(charge_id,)] = charges(ledger)
        routed = list(balancer.routed)
        # A replica killed mid-call: the re-issue, on another replica, waits for the dead one's lease and takes
        # the call over with the same key, which the provider deduplicates.
        hold.unlink()
        other = {**CHARGE, "order_id": "o-2"}
        reissued, killed_on, retried_on = await kill_mid_call(url, balancer, proxies, ledger, other)
        hold.touch()
    assert sorted(balancer.calls()[:3]) == [0, 1, 2]  # at once: one call on each replica
    assert sorted(balancer.calls()[3:6]) == [0, 1, 2]  # in turn: likewise
    for result in [*at_once, *in_turn]:
        assert not result.is_error and result.structured_content and result.structured_content["id"] == charge_id
    assert sorted(bool(r.meta and r.meta[META_REPLAYED]) for r in at_once) == [False, True, True]
    assert all(r.meta and r.meta[META_REPLAYED] is True for r in in_turn)
    # Stateless: no 2026-07-28 request carried a session, and each went where the turn sent it.
    assert all(r.session is None for r in routed[:6] if r.method == "tools/call")
    assert killed_on != retried_on and proxies[retried_on].said("takeover create_charge")
    [(_, ), (second_id, )] = charges(ledger)
    assert not reissued.is_error and reissued.structured_content and reissued.structured_content["id"] == second_id
    assert reissued.meta and reissued.meta[META_KEY]


async def test_a_killed_replicas_call_whose_key_does_not_reach_the_provider_is_held(tmp_path: Path,
                                                                                   store_url: str) -> None:
    ledger = tmp_path / "payments.db"
    async with replicas(tmp_path, store_url, forward=False, lease=1) as (url, balancer, proxies):
        reissued, killed_on, retried_on = await kill_mid_call(url, balancer, proxies, ledger, CHARGE)
    assert killed_on != retried_on
    assert len(charges(ledger)) == 1  # held for a person: nothing was run again
    assert reissued.is_error and "unknown" in text(reissued) and "Nothing was executed" in text(reissued)
