"""``confirm = true``: before the first run of a guarded call, and never on a replay, the proxy asks the user
(MCP elicitation: in the handshake era a request to the host, on 2026-07-28 an ``input_required`` answer the
host's retry completes). Only a yes runs the call; anything else refuses it with nothing executed and releases
the claim, so a later, confirmed call runs, once. Real ``mcp`` Client, in process, both host eras; the
payments are counted in the upstream's log."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import full_upstream
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters

from agentguard import Guard
from agentguard.mcp import META_REPLAYED, GuardingProxy, parse_config

pytestmark = [pytest.mark.anyio, pytest.mark.storeless]  # the adapter layer, not the store's SQL: runs once
ROOT = Path(__file__).resolve().parents[2]
CONFIRMED = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\nconfirm = true\n'
PAY = {"order_id": "o-1", "amount_cents": 4900, "task_id": "ticket-7"}
META_CONFIRMATION = "dev.agentguard/confirmation"


@pytest.fixture(params=["legacy", "auto"], ids=["host-legacy", "host-2026"])
def host(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "upstream.jsonl"


PROXIES: dict[int, GuardingProxy] = {}  # each client of ``proxied`` (by its id) and the proxy it talks to


def patient(client: Client) -> None:
    """From now on the proxy waits a minute for an answer: a test whose first question is meant to expire (a
    short ``input_timeout``) asks its later ones in time however slow the machine (questions made from now on
    take the timeout then: ``Exchanges.timeout``)."""
    PROXIES[id(client)].exchanges.timeout = 60.0


@pytest.fixture
def proxied(store_url: str, log: Path, host: str) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def make(tools: str = CONFIRMED, proxy: str = "", **options: Any) -> AsyncIterator[Client]:
        config = parse_config(f'[store]\nurl = "{store_url}"\n\n[upstream]\ncommand = ["unused"]\n\n'
                              f'[proxy]\n{proxy}\n\n{tools}')
        guarding = GuardingProxy(config, upstream=full_upstream.build_server(log), environ={})
        async with guarding.started(), Client(guarding.server, mode=host, **options) as client:
            PROXIES[id(client)] = guarding
            try:
                yield client
            finally:
                del PROXIES[id(client)]

    return make


class User:
    """Answers the proxy's questions from a script, and keeps what it was asked."""

    def __init__(self, *answers: types.ElicitResult | types.ErrorData) -> None:
        self.answers = list(answers)
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params)
        return self.answers.pop(0)


YES = types.ElicitResult(action="accept", content={"confirm": True})


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def paid(log: Path) -> list[dict[str, Any]]:
    return full_upstream.events(log, "pay")


async def test_a_confirmed_call_runs_once_and_its_replay_does_not_ask(
    proxied: Callable[..., Any], log: Path, store_url: str
) -> None:
    user = User(YES)
    async with proxied(elicitation_callback=user) as client:
        first = await client.call_tool("pay", PAY)
        replay = await client.call_tool("pay", PAY)
    [asked] = user.asked
    assert isinstance(asked, types.ElicitRequestFormParams)
    # The question shows the tool, its arguments (never the key the proxy fills in) and the task.
    assert "pay" in asked.message and "'ticket-7'" in asked.message
    assert '"order_id": "o-1"' in asked.message and '"amount_cents": 4900' in asked.message
    assert "idempotency_key" not in asked.message and "task_id" not in asked.message
    assert not first.is_error and first.meta and first.meta[META_REPLAYED] is False
    assert replay.meta and replay.meta[META_REPLAYED] is True and replay.structured_content == first.structured_content
    assert len(paid(log)) == 1
    # Who confirmed, when, and the answer are kept with the recorded result.
    confirmation = first.meta[META_CONFIRMATION]
    assert confirmation["confirmed"] is True and confirmation["by"] == "mcp/0.1.0" and confirmation["at"]
    assert replay.meta[META_CONFIRMATION] == confirmation
    async with Guard(store_url) as guard:  # and beside the record, for a person (agentguard ls)
        (record,) = await guard.records()
    assert record.audit and record.audit["confirmation"] == confirmation


@pytest.mark.parametrize("answer, says", [
    (types.ElicitResult(action="decline"), "declined"),
    (types.ElicitResult(action="accept", content={"confirm": False}), "declined"),
    (types.ElicitResult(action="cancel"), "did not confirm"),
    (types.ElicitResult(action="accept", content={"confirm": "yes please"}), "did not confirm"),
    (types.ElicitResult(action="accept"), "did not confirm"),
], ids=["decline", "no", "cancel", "not-a-boolean", "no-content"])
async def test_a_call_the_user_does_not_confirm_is_refused_and_its_claim_released(
    proxied: Callable[..., Any], log: Path, answer: types.ElicitResult, says: str, store_url: str
) -> None:
    user = User(answer, YES)
    async with proxied(elicitation_callback=user) as client:
        refused = await client.call_tool("pay", PAY)
        assert refused.is_error and text(refused).endswith("Nothing was executed.") and says in text(refused)
        assert paid(log) == []
        async with Guard(store_url) as guard:  # the released record keeps the answer, for a person
            (record,) = await guard.records()
        assert record.state == "released" and record.audit
        assert record.audit["confirmation"]["confirmed"] is False and record.audit["confirmation"]["at"]
        # The claim was released: the same call, confirmed this time, runs (it is not a replay of the refusal).
        later = await client.call_tool("pay", PAY)
    assert not later.is_error and later.meta and later.meta[META_REPLAYED] is False
    assert len(user.asked) == 2 and len(paid(log)) == 1


async def test_a_declined_call_binds_nothing_and_the_corrected_call_runs(
    proxied: Callable[..., Any], log: Path
) -> None:
    """Issue 29, item 4. After "no", then "charge 50 instead", the corrected call was refused as a reuse ("The
    earlier call stands" — which was false: nothing had run). A declined call never started its body, so it
    binds nothing: the corrected call is asked about and runs with its own amount; only then does it bind."""
    user = User(types.ElicitResult(action="decline"), YES)
    async with proxied(elicitation_callback=user) as client:
        refused = await client.call_tool("pay", PAY)
        assert refused.is_error and text(refused).endswith("Nothing was executed.")
        corrected = await client.call_tool("pay", {**PAY, "amount_cents": 5000})
        assert not corrected.is_error, text(corrected)
        again = await client.call_tool("pay", PAY)  # the first amount again: now the charge of 50 stands
    assert again.is_error and "(differing: amount_cents)" in text(again)
    assert "ran and succeeded, and its result stands" in text(again) and text(again).endswith("Nothing was executed.")
    assert [p["args"]["amount_cents"] for p in paid(log)] == [5000] and len(user.asked) == 2


async def test_an_error_for_an_answer_refuses_the_call(proxied: Callable[..., Any], log: Path, host: str) -> None:
    """The host fails the question instead of answering it. In the handshake era the proxy reads that as no
    confirmation at once. On 2026-07-28 the host's own call ends with the error and it never retries: the
    question counts as cancelled after ``input_timeout``, and the next call, which waited for the claim, is
    asked again."""
    user = User(types.ErrorData(code=-32600, message="no UI"), YES)
    async with proxied(elicitation_callback=user, proxy="input_timeout = 0.5") as client:
        if host == "legacy":
            refused = await client.call_tool("pay", PAY)
            assert refused.is_error and text(refused).endswith("Nothing was executed.")
        else:
            with pytest.raises(MCPError, match="no UI"):
                await client.call_tool("pay", PAY)
        assert paid(log) == []
        patient(client)
        later = await client.call_tool("pay", PAY)
    assert not later.is_error and len(paid(log)) == 1 and len(user.asked) == 2


async def test_a_client_without_elicitation_is_refused_unless_the_config_says_run(
    proxied: Callable[..., Any], log: Path
) -> None:
    async with proxied() as client:
        refused = await client.call_tool("pay", PAY)
    assert refused.is_error and "cannot ask its user" in text(refused)
    assert text(refused).endswith("Nothing was executed.") and paid(log) == []
    async with proxied(tools=CONFIRMED + 'confirm_without_elicitation = "run"\n') as client:
        ran = await client.call_tool("pay", PAY)
    assert not ran.is_error and len(paid(log)) == 1
    assert ran.meta and ran.meta[META_CONFIRMATION]["confirmed"] is False
    assert "elicitation" in ran.meta[META_CONFIRMATION]["ran_unconfirmed"]


class Released(logging.Handler):
    """Set when the guard released a claim because the call was not confirmed (its ``released`` event, logged
    once the proxy gave up on the answer): from then on, an answer is late."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.args and record.args[0] == "released" and record.args[-1] == "NotConfirmed":
            self.seen.set()


@pytest.fixture
def released() -> Iterator[Released]:
    handler = Released()
    logger = logging.getLogger("agentguard")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


TIMEOUT = 0.2


@pytest.mark.parametrize("late", ["soon", "after-the-window"])
async def test_a_confirmation_answered_late_is_refused_once_never_asked_again(
    proxied: Callable[..., Any], log: Path, released: Released, late: str, store_url: str
) -> None:
    """The user answers yes after ``input_timeout``: the question has expired, its claim was released, and
    the call is refused with that said (nothing was executed), never asked again. In the handshake era the
    host's request gets the refusal at the expiry (and the host is told the question is cancelled: this client
    answers anyway); on 2026-07-28 the host's retry carries the late yes and gets the refusal, also after the
    proxy's window for a retry (twice ``input_timeout``), after which the retry was once served as a new call,
    asked again, answered late again, round after round until the client gave up. A later call asks again and
    runs, once."""
    asked: list[str] = []

    async def answer_late(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if len(asked) > 1:  # (a later call, answered in time)
            return YES
        with anyio.CancelScope(shield=True):  # (a handshake-era host is told to cancel: this one answers anyway)
            await released.seen.wait()
            if late == "after-the-window":
                await anyio.sleep(2 * TIMEOUT)
        return YES

    async with proxied(elicitation_callback=answer_late, proxy=f"input_timeout = {TIMEOUT}") as client:
        with anyio.fail_after(30):
            refused = await client.call_tool("pay", PAY)
        assert refused.is_error and "the question expired" in text(refused), text(refused)
        assert text(refused).endswith("Nothing was executed.") and "within 0.2 s" in text(refused)
        assert len(asked) == 1 and paid(log) == []
        async with Guard(store_url) as guard:  # released, the expiry kept beside it for a person
            (record,) = await guard.records()
        assert record.state == "released" and record.audit
        assert record.audit["confirmation"]["answer"] == "expired"
        patient(client)
        later = await client.call_tool("pay", PAY)  # the model retries: asked again, answered in time
    assert not later.is_error and later.meta and later.meta[META_REPLAYED] is False
    assert len(asked) == 2 and len(paid(log)) == 1


@pytest.mark.slow
async def test_over_stdio_a_confirmation_answered_late_is_refused_not_asked_round_after_round(
    tmp_path: Path, log: Path, host: str, store_url: str
) -> None:
    """As a host runs it: ``agentguard mcp-proxy`` as a subprocess over stdio. The user answers yes after the
    question expired and after the proxy's window for a retry: the call is refused with that said, asked once
    (it was asked round after round until the client gave up after ten), and nothing is paid."""
    config = tmp_path / "agentguard.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n\n'
        f'[upstream]\ncommand = ["python", "{ROOT / "tests" / "full_upstream.py"}"]\nenv = {{ FULL_LOG = "{log}" }}\n\n'
        f"[proxy]\ninput_timeout = {TIMEOUT}\n\n{CONFIRMED}")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentguard.cli", "mcp-proxy", "--config", str(config)],
        env={"PYTHONPATH": str(ROOT)}, cwd=str(tmp_path))
    asked = 0

    async def answer_late(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        nonlocal asked
        asked += 1
        with anyio.CancelScope(shield=True):
            async with Guard(store_url) as guard:
                # Polled: the claim is released by another process, and no event crosses that boundary.
                while [r.state for r in await guard.records()] != ["released"]:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            await anyio.sleep(2 * TIMEOUT)  # past the window in which the proxy keeps a question's exchange
        return YES

    async with Client(params, mode=host, elicitation_callback=answer_late) as client:
        with anyio.fail_after(60):
            refused = await client.call_tool("pay", PAY)
    assert refused.is_error and "the question expired" in text(refused), text(refused)
    assert text(refused).endswith("Nothing was executed.")
    assert asked == 1 and paid(log) == []
