"""``agentguard console`` over HTTP, as a browser's requests reach it: the real command in a subprocess, a store
seeded by real guarded calls (a held outcome made by a real SIGKILL inside a step), on both databases.

What the page shows without the token and with it, what an action needs (the token's cookie, the form's
anti-forgery field, this console's own origin and host), settling every kind of held outcome that
``agentguard resolve`` settles, on the revision the page showed, and bad input answered on the page with
nothing changed in the store; finding anything (a task or a key by its start, an operation, a scope), long
lists a page at a time with how long they are, a task's attempts beside its timeline, marks of one moment
that do not cover one another. (tests/console/test_console_browser.py drives the same pages in headless Chromium.)
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
from agentguard.stores import _console as views

from console_server import Running, console, held, many, seed, seeded

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


def revision_of(page: str) -> str:
    """The revision a record's page shows, which its settle forms carry."""
    found = re.search(r'name="revision" value="([^"]+)"', page)
    assert found, page
    return found[1]


def form_of(page: str, key: str, how: str) -> dict[str, str]:
    """The fields of a record page's settle form (what a browser posts)."""
    return {"csrf": csrf_of(page), "scope": "default", "key": key, "revision": revision_of(page), "how": how}


def revision_now(store_url: str, key: str) -> str:
    async def go() -> str:
        store = SQLStore(store_url)
        try:
            _, found = await views.record(store, "default", key)
        finally:
            await store.dispose()
        assert found is not None
        return found.revision

    return asyncio.run(go())


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
        rows = (await views.task(store, "default", "t-done")).rows
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
        form = form_of(page.text, key, "retry")
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
        form = form_of(page.text, key, how)
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
        form = form_of(page.text, key, how)
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
        form = form_of(page.text, key, "abandon")
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
        page = client.get("/record", params={"scope": "default", "key": key}).text
        csrf = csrf_of(page)
        form = {**form_of(page, key, "result"), "result": "{\"id\": \"ch_1\"}"}
        done_revision = revision_now(store_url, done)

        def post(status: int, message: str, **fields: str) -> None:
            answer = client.post("/settle", data={**form, **fields})
            assert answer.status_code == status, answer.text
            assert message in answer.text and "Traceback" not in answer.text, answer.text

        post(400, "the result must be JSON", result="{'id': 'ch_1'")
        post(400, "the result must be JSON", result="")
        post(404, "no record &#x27;ag_nope&#x27;", key="ag_nope")
        post(409, "is held on an unknown outcome", key=done, revision=done_revision)  # a key that is not held
        post(409, "no held, released or stalled operation", key=done, how="abandon", revision=done_revision)
        post(400, "how must be one of", how="forget")
        post(400, "the form lacks the record&#x27;s revision", revision="")
        post(400, "is not a record&#x27;s revision", revision="7.12.sideways.-.-")
        post(400, "scope contains a NUL", scope="a\x00b")
        assert client.post("/settle", content=b"how=retry&how=abandon&csrf=" + csrf.encode(),
                           headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 400
        assert client.post("/settle", json=form).status_code == 415
        assert record_state(store_url, key) == before and record_state(store_url, done) == done_before
        post(303, "", how="retry")  # settled once ...
        cleared = record_state(store_url, key)
        # ... and not twice: another decision on the same revision is refused, the same one is made once
        post(409, "another operator cleared its step for a retry", result='{"id": "ch_1"}')
        post(303, "", how="retry")
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
        assert "Attempts (3)" in timeline and timeline.count("<tr id=\"a") == 3  # a line for each mark


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


def task_ids(page: str, table: str = "tasks") -> list[str]:
    """The task ids the page's table lists, in order."""
    if f'<table class="{table}">' not in page:
        return []
    body = page.split(f'<table class="{table}">')[1].split("</table>")[0]
    return re.findall(r'href="/task\?scope=[^&]+&amp;id=([^"&]+)"', body)


def count_of(page: str) -> str:
    found = re.search(r'<span class="count">([^<]+)</span>', page)
    assert found, page
    return found[1]


def test_the_task_list_comes_a_page_at_a_time_with_how_many_there_are(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    tasks = [f"p-{i:03d}" for i in range(250)]
    many(store_url, tasks)
    many(store_url, ["p-elsewhere"], scope="acct-2")
    with console(store_url, tmp_path / "console.log") as c:
        client = anon(clients, c)
        listed: list[str] = []
        page = client.get("/", params={"scope": "default"}).text
        for number, (first, last) in enumerate(((1, 100), (101, 200), (201, 250)), 1):
            assert count_of(page) == f"tasks {first}–{last} of 250"
            ids = task_ids(page)
            assert len(ids) == last - first + 1 and ("next ›" in page) == (number < 3)
            listed += ids
            follow = re.search(r'href="([^"]+)" rel="next">next', page)
            if follow is not None:  # the link to the next page keeps the filter
                assert "scope=default" in follow[1] and f"page={number + 1}" in follow[1]
                page = client.get(follow[1].replace("&amp;", "&")).text
        assert sorted(listed) == tasks  # every task once, on one page
        assert count_of(client.get("/").text) == "tasks 1–100 of 251"  # every scope
        assert count_of(client.get("/", params={"task": "p-1"}).text) == "tasks 1–100 of 100"
        beyond = client.get("/", params={"scope": "default", "page": "4"})
        assert beyond.status_code == 200 and count_of(beyond.text) == "no tasks on page 4: there are 250"
        assert "« first" in beyond.text and "last »" not in beyond.text
        for bad in ("0", "x", "-1", "99999999999"):
            answer = client.get("/", params={"page": bad})
            assert answer.status_code == 400 and "page must be a whole number" in answer.text


def test_anything_is_found_by_its_task_id_its_key_its_operation_or_its_scope(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    keys = many(store_url, ["find-alpha", "find-beta"], operations=2)
    other = many(store_url, ["find-alpha"], scope="acct-2")["find-alpha"][0]
    key = keys["find-beta"][1]
    with console(store_url, tmp_path / "console.log") as c:
        client = anon(clients, c)

        def found(**params: str) -> list[str]:
            page = client.get("/", params=params)
            assert page.status_code == 200
            return task_ids(page.text)

        assert found(task="find-al") == ["find-alpha", "find-alpha"]  # in both scopes
        assert found(task="find-al", scope="acct-2") == ["find-alpha"] and found(task="find-b") == ["find-beta"]
        assert found(task="Find") == [] and sorted(found(operation="pay")) == ["find-alpha", "find-alpha", "find-beta"]
        assert sorted(found(operation="pay[n=1")) == ["find-alpha", "find-beta"] and found(operation="paid") == []
        # a key by its start, as `agentguard show` takes it: the one record it names, else those it may name
        start = next(key[:n] for n in range(4, 52) if not any(k.startswith(key[:n]) for k in
                                                             [*keys["find-alpha"], keys["find-beta"][0], other]))
        to = client.get("/", params={"key": start})
        assert to.status_code == 303 and to.headers["location"] == f"/record?scope=default&key={key}"
        assert client.get(to.headers["location"]).status_code == 200
        to_other = client.get("/", params={"key": other[:20], "scope": "acct-2"})
        assert to_other.headers["location"] == f"/record?scope=acct-2&key={other}"
        several = client.get("/", params={"key": "ag_"})
        assert several.status_code == 200 and "Several records' keys start with" in several.text
        listed = re.findall(r'<td class="key"><a href="/record\?scope=([^&]+)&amp;key=(ag_\w+)"', several.text)
        assert sorted(listed) == sorted([("default", k) for ks in keys.values() for k in ks] + [("acct-2", other)])
        none = client.get("/", params={"key": "ag_zzz"})
        assert none.status_code == 200 and "No record's key starts with" in none.text


def test_a_task_of_many_operations_is_shown_a_page_at_a_time_with_its_attempts(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    keys = many(store_url, ["big"], operations=250)["big"]
    with console(store_url, tmp_path / "console.log") as c:
        client = anon(clients, c)
        pages = [client.get("/task", params={"scope": "default", "id": "big", **({"page": str(n)} if n > 1 else {})})
                 for n in (1, 2, 3)]
        seen: list[str] = []
        for page, (first, last) in zip(pages, ((1, 100), (101, 200), (201, 250)), strict=True):
            text = page.text
            assert page.status_code == 200 and count_of(text) == f"operations {first}–{last} of 250"
            assert len(text) < 400_000  # a page of a task, never the whole task
            records = text.split('<table class="records">')[1].split("</table>")[0]
            shown = re.findall(r'<td class="key">(ag_\w+)</td>', records)
            attempts = text.split('<table class="attempts">')[1].split("</table>")[0]
            lines = re.findall(r'<tr id="(a\d+)"><td>\d+</td><td>([^<]+)</td>.*?<td>(\d+)</td><td><span class="kind">'
                               r"([^<]+)</span>: ([^<]*)</td><td>([^<]+)</td><td>([^<]*)</td>"
                               r'<td class="key">(ag_\w+)</td>', attempts)
            # one attempt of each operation on this page: when, which attempt, what happened, who, how long, the key
            assert len(shown) == len(lines) == last - first + 1 and {line[7] for line in lines} == set(shown)
            assert all(line[3] == "ran" and line[4] == "succeeded" and ":" in line[5] and "guard" in line[6]
                       for line in lines)
            marks = re.findall(r'<a href="#(a\d+)"><circle', text)  # each attempt's mark links to its line
            assert sorted(marks) == sorted(line[0] for line in lines)
            seen += shown
        assert sorted(seen) == sorted(keys)
        beyond = client.get("/task", params={"scope": "default", "id": "big", "page": "4"})
        assert beyond.status_code == 200 and count_of(beyond.text) == "no operations on page 4: there are 250"
        assert "« first" in beyond.text and "next ›" not in beyond.text


def _marks(svg: str) -> list[tuple[float, float]]:
    """Where the marks of attempts are drawn (not the legend's)."""
    return [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"[^>]* class="mark', svg)]


def test_marks_of_the_same_moment_do_not_cover_one_another(
    store_url: str, tmp_path: Path, clients: list[Any]
) -> None:
    many(store_url, ["burst"], replays=12)  # one call, then twelve replays at once: within a millisecond or so
    with console(store_url, tmp_path / "console.log") as c:
        page = anon(clients, c).get("/task", params={"scope": "default", "id": "burst"}).text
    svg = page.split("<svg")[1].split("</svg>")[0]
    marks = _marks(svg)
    more = sum(int(n) for n in re.findall(r'class="more">\+(\d+)<', svg))
    assert len(marks) + more == 13  # every attempt is drawn, or counted where it would be
    assert len({y for _, y in marks}) > 1  # they were stacked
    for i, (x1, y1) in enumerate(marks):
        for x2, y2 in marks[i + 1:]:
            assert abs(x1 - x2) >= 12 or abs(y1 - y2) >= 12, (x1, y1, x2, y2)  # no mark covers another
    assert page.count('<tr id="a') == 13  # and each is a line of the table
