"""``agentguard console`` over HTTP, as a browser's requests reach it: the real command in a subprocess, a store
seeded by real guarded calls (a held outcome made by a real SIGKILL inside a step), on both databases.

What the page shows without the token and with it, what an action needs (the token's cookie, the form's
anti-forgery field, this console's own origin and host), settling every kind of held outcome that
``agentguard resolve`` settles, and bad input answered on the page with nothing changed in the store.
(tests/test_console_browser.py drives the same page in headless Chromium.)
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentguard.stores import SQLStore
from agentguard.stores import _views as views

from console_server import Running, console, held, seed, seeded

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """httpx clients a test opens (``anon``, ``signed_in``), closed when it ends."""
    made: list[Any] = []
    yield made
    for client in made:
        client.close()


def anon(made: list[Any], c: Running) -> Any:
    made.append(httpx.Client(base_url=c.base, follow_redirects=False, timeout=60))
    return made[-1]


def signed_in(made: list[Any], c: Running) -> Any:
    client = anon(made, c)
    first = client.get(f"/?token={c.token}")
    assert first.status_code == 303 and first.headers["location"] == "/"
    assert "samesite=strict" in first.headers["set-cookie"].lower()
    assert "httponly" in first.headers["set-cookie"].lower()
    return client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found[1]


def record_state(store_url: str, key: str) -> Any:
    """The record and its steps as the store holds them (values included), to compare before and after."""

    async def go() -> Any:
        store = SQLStore(store_url)
        try:
            _, found = await views.record(store, "default", key)
        finally:
            await store.dispose()
        assert found is not None
        return (found.state, found.attempts, found.held, found.result, [(s.name, s.state, s.result)
                                                                         for s in found.steps])

    return asyncio.run(go())


def resume(store_url: str, mode: str = "resume", task_id: str = "t-held") -> dict[str, Any]:
    out = seed(store_url, mode, task_id)
    assert out.returncode == 0, out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def test_the_pages_show_no_values_until_a_record_is_opened_by_the_tokens_holder(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    keys = seeded(store_url)
    with console(store_url, tmp_path / "console.log") as c:
        reader = anon(clients, c)
        home = reader.get("/")
        assert home.status_code == 200 and "read-only" in home.text
        assert "t-done" in home.text and "t-held" in home.text
        h = held(store_url)["t-held"]
        from agentguard._keys import sub_key

        assert "charge" in home.text and sub_key(h["key"], "charge") in home.text  # the queue: step and sub-key
        record = reader.get("/record", params={"scope": "default", "key": keys["t-held"]})
        assert record.status_code == 200 and "unknown outcome" in record.text
        assert 'action="/settle"' not in record.text and "csrf" not in record.text  # read-only: no action
        done = asyncio.run(_done_key(store_url))
        for client in (reader, signed_in(clients, c)):
            for path, params in (("/", {}), ("/task", {"scope": "default", "id": "t-done"})):
                page = client.get(path, params=params)
                assert page.status_code == 200 and "ch_" not in page.text and "receipt for" not in page.text
        opened = signed_in(clients, c).get("/record", params={"scope": "default", "key": done})
        assert "ch_" in opened.text and "receipt for o-1" in opened.text  # the result, the steps' results
        assert "ch_" not in reader.get("/record", params={"scope": "default", "key": done}).text


async def _done_key(store_url: str) -> str:
    store = SQLStore(store_url)
    try:
        _, rows = await views.task(store, "default", "t-done")
    finally:
        await store.dispose()
    return next(r.key for r in rows if r.operation.startswith("book"))


def test_an_action_needs_the_cookie_the_form_field_and_this_consoles_origin(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    key = seeded(store_url, done=())["t-held"]
    before = record_state(store_url, key)
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        page = client.get("/record", params={"scope": "default", "key": key})
        form = {"csrf": csrf_of(page.text), "scope": "default", "key": key, "how": "retry"}
        reader = anon(clients, c)
        refusals = [
            reader.post("/settle", data=form),  # no cookie
            client.post("/settle", data={**form, "csrf": "0" * 64}),  # a forged field
            client.post("/settle", data={k: v for k, v in form.items() if k != "csrf"}),
            client.post("/settle", data=form, headers={"origin": "http://elsewhere.example"}),
            client.post("/settle", data=form, headers={"sec-fetch-site": "cross-site"}),
            client.post("/settle", data=form, headers={"host": f"rebound.example:{c.base.rsplit(':', 1)[1]}"}),
            reader.get(f"/?token={c.token}x"),  # not the token
        ]
        assert [r.status_code for r in refusals] == [403] * len(refusals)
        assert "token" in refusals[0].text and "anti-forgery" in refusals[1].text and "cross-site" in refusals[3].text
        assert record_state(store_url, key) == before  # nothing changed
        ok = client.post("/settle", data=form, headers={"origin": c.base})
        assert ok.status_code == 303, ok.text
    assert "t-held" not in held(store_url)


@pytest.mark.parametrize("how", ["result", "retry", "abandon"])
def test_settling_each_kind_of_held_outcome_does_what_resolve_does(store_url: str, tmp_path: Path, how: str,
                                                           clients: list[Any]) -> None:
    key = seeded(store_url, done=())["t-held"]
    charge = {"id": "ch_from_the_provider", "amount_cents": 4200}
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        page = client.get("/record", params={"scope": "default", "key": key})
        form = {"csrf": csrf_of(page.text), "scope": "default", "key": key, "how": how}
        if how == "result":
            form["result"] = json.dumps(charge)
        done = client.post("/settle", data=form)
        assert done.status_code == 303
        after = client.get(done.headers["location"])
        assert after.status_code == 200 and 'class="note"' in after.text and 'state held' not in after.text
    assert held(store_url) == {}
    answer = resume(store_url)
    if how == "abandon":
        assert answer["error"] == "OutcomeUnknownError" and "abandoned" in answer["message"]
    else:
        assert answer["ok"]["order"] == "o-2"
        if how == "result":
            assert answer["ok"]["charge"] == charge  # the step's real result, as given, carried on
        else:
            assert answer["ok"]["charge"]["id"].startswith("ch_") and answer["ok"]["charge"] != charge


@pytest.mark.parametrize("how", ["result", "retry"])
def test_an_operation_whose_result_could_not_be_stored_is_settled_on_its_page(
    store_url: str, tmp_path: Path, how: str, clients: list[Any]
) -> None:
    """Issue 29, item 2: held on its body (it ran; its result could not be stored), it is listed as held and its
    page settles it as ``agentguard resolve`` does: a result every later call receives, or a run again."""
    from agentguard import Guard, ResultNotStoredError, task

    runs: list[int] = []

    def count(amount: int) -> int:
        runs.append(amount)
        return "not an int" if len(runs) == 1 else amount  # type: ignore[return-value]

    def call() -> Any:
        with Guard(store_url) as guard, task("t-unstorable"):
            return guard.once(operation="count")(count)(7)

    with pytest.raises(ResultNotStoredError):
        call()
    key = held(store_url)["t-unstorable"]["key"]
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        front = client.get("/")
        assert "its result could not be stored" in front.text
        page = client.get("/record", params={"scope": "default", "key": key})
        assert "record result" in page.text and "retry operation" in page.text
        form = {"csrf": csrf_of(page.text), "scope": "default", "key": key, "how": how}
        if how == "result":
            form["result"] = "42"
        assert client.post("/settle", data=form).status_code == 303
    assert held(store_url) == {}
    assert call() == (42 if how == "result" else 7)
    assert runs == ([7] if how == "result" else [7, 7])


def test_a_released_operation_can_be_abandoned_as_resolve_abandons_it(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    key = seeded(store_url, done=(), hold=(), release=("t-payout",))["t-payout"]
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        page = client.get("/record", params={"scope": "default", "key": key})
        assert "released" in page.text and "record result" not in page.text  # no unknown step: abandon only
        form = {"csrf": csrf_of(page.text), "scope": "default", "key": key, "how": "abandon"}
        assert client.post("/settle", data=form).status_code == 303
    answer = resume(store_url, "repay", "t-payout")
    assert answer["error"] == "OutcomeUnknownError" and "abandoned" in answer["message"]


def test_bad_input_is_answered_on_the_page_and_changes_nothing(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    keys = seeded(store_url)
    key, done = keys["t-held"], asyncio.run(_done_key(store_url))
    before, done_before = record_state(store_url, key), record_state(store_url, done)
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        csrf = csrf_of(client.get("/record", params={"scope": "default", "key": key}).text)
        form = {"csrf": csrf, "scope": "default", "key": key, "how": "result", "result": "{\"id\": \"ch_1\"}"}

        def post(status: int, message: str, **fields: str) -> None:
            answer = client.post("/settle", data={**form, **fields})
            assert answer.status_code == status, answer.text
            assert message in answer.text and "Traceback" not in answer.text, answer.text

        post(400, "the result must be JSON", result="{'id': 'ch_1'")
        post(400, "the result must be JSON", result="")
        post(404, "no record &#x27;ag_nope&#x27;", key="ag_nope")
        post(409, "is held on an unknown outcome", key=done)  # a key that is not held
        post(409, "no held, released or stalled operation", key=done, how="abandon")
        post(400, "how must be one of", how="forget")
        post(400, "scope contains a NUL", scope="a\x00b")
        assert client.post("/settle", content=b"how=retry&how=abandon&csrf=" + csrf.encode(),
                           headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 400
        assert client.post("/settle", json=form).status_code == 415
        assert record_state(store_url, key) == before and record_state(store_url, done) == done_before
        post(303, "", how="retry")  # settled once ...
        cleared = record_state(store_url, key)
        post(409, "is held on an unknown outcome", result='{"id": "ch_1"}')  # ... and not twice
        post(409, "is held on an unknown outcome", how="retry")
        assert record_state(store_url, key) == cleared
        for path, params, status in (("/record", {"scope": "default", "key": "ag_nope"}, 404),
                                     ("/task", {"scope": "default", "id": "nobody"}, 404),
                                     ("/task", {"scope": "default"}, 400),
                                     ("/", {"state": "sideways"}, 400)):
            page = client.get(path, params=params)
            assert page.status_code == status and 'class="error"' in page.text, page.text


def test_the_task_list_filters_by_scope_state_and_operation(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    seeded(store_url, done=("t-done", "t-done-2"))
    with console(store_url, tmp_path / "console.log") as c:
        client = anon(clients, c)

        def tasks(**params: str) -> list[str]:
            page = client.get("/", params=params)
            assert page.status_code == 200
            table = page.text.split('<table class="tasks">')[1] if '<table class="tasks">' in page.text else ""
            return re.findall(r'href="/task\?scope=default&amp;id=([^"]+)"', table)

        assert tasks() == ["t-held", "t-done-2", "t-done"]  # the newest change first
        assert tasks(state="held") == ["t-held"]
        assert tasks(state="failed") == ["t-done-2", "t-done"]  # their refunds
        assert tasks(operation="refund") == ["t-done-2", "t-done"]
        assert tasks(operation="book", state="held") == ["t-held"] and tasks(state="running") == []
        assert tasks(scope="elsewhere") == [] and tasks(operation="Book") == []
        timeline = client.get("/task", params={"scope": "default", "id": "t-done"}).text
        assert timeline.count('class="span ') == 2 and timeline.count('class="mark step"') == 2  # two steps
        # and from the ledger: the booking ran, was replayed, the refund ran (its declined error stored)
        assert timeline.count('class="mark ran"') == 2 and timeline.count('class="mark replayed"') == 1
        assert "3 attempt(s) in the ledger" in timeline


def test_the_command_refuses_to_start_where_it_cannot_serve(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentguard.cli", "console", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    missing = run("--url", f"sqlite+aiosqlite:///{tmp_path / 'none.db'}", "--port", "0")
    assert missing.returncode == 1 and "no store at" in missing.stderr and "Traceback" not in missing.stderr
    assert run("--port", "70000").returncode == 2
    seeded(store_url, hold=())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = run("--url", store_url, "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 1 and "cannot listen on 127.0.0.1:" in busy.stderr, busy.stderr
    down = run("--url", "postgresql+asyncpg://u:hunter2@127.0.0.1:1/db", "--port", "0")
    assert down.returncode == 1 and "cannot read the store" in down.stderr and "hunter2" not in down.stderr
    assert down.stdout == ""  # no URL printed for a console that did not start


def test_what_the_store_holds_is_shown_escaped(store_url: str, tmp_path: Path, clients: list[Any]) -> None:
    sly = "<script>alert('t')</script>\"&"
    seeded(store_url, done=(sly,), hold=())
    with console(store_url, tmp_path / "console.log") as c:
        client = signed_in(clients, c)
        for path, params in (("/", {}), ("/task", {"scope": "default", "id": sly})):
            page = client.get(path, params=params)
            assert page.status_code == 200 and "<script>" not in page.text
            assert "&lt;script&gt;alert(&#x27;t&#x27;)&lt;/script&gt;&quot;&amp;" in page.text
