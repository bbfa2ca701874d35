"""``agentguard ls --state``, ``show``, ``timeline``, ``forget`` and ``stats`` as a user runs them (in a
subprocess), on a store a guard filled: what they print, their JSON, and their refusals."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from agentguard import Guard, KeyReuseError, task

from cli_runs import run
from conftest import raw_exec, tid

pytestmark = pytest.mark.slow


def fill(url: str, t: str) -> dict[str, str]:
    """A task's history: a charge run and replayed, a reuse refused, a cached failure; and a claim held (on
    ``hold``) by a thread until the returned guard's ``release`` is set. Returns the keys by order."""
    g = Guard(url)

    @g.once(key=["order"], cache_errors=(ValueError,))
    def charge(order: str, amount: int) -> str:
        if order == "bad":
            raise ValueError("declined")
        return f"ch-{order}"

    with task(t):
        charge("o-1", 5)
        charge("o-1", 5)
        with pytest.raises(KeyReuseError):
            charge("o-1", 6)
        with pytest.raises(ValueError):
            charge("bad", 5)
    g.close()
    return {r["operation"]: r["key"] for r in ls(url, "--task", t)}


def ls(url: str, *args: str) -> list[dict[str, Any]]:
    out = run("ls", "--url", url, "--json", *args, cwd=Path.cwd())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["records"]  # type: ignore[no-any-return]


def test_timeline_show_and_stats_tell_the_tasks_story(store_url: str, tmp_path: Path) -> None:
    t = tid()
    keys = fill(store_url, t)
    ok, bad = keys['charge[order="o-1"]'], keys['charge[order="bad"]']
    assert {(r["key"], r["state"]) for r in ls(store_url, "--state", "failed")} == {(bad, "failed")}
    assert all({"key", "operation", "task_id", "state"} <= r.keys() for r in ls(store_url))
    out = run("timeline", t, "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[2:4] for line in lines] == [
        ["ran", 'charge[order="o-1"]'], ["REPLAY", "replayed"], ["REFUSED", "refused"], ["ran", 'charge[order="bad"]'],
    ]
    js = json.loads(run("timeline", t, "--url", store_url, "--json", cwd=tmp_path).stdout)
    assert [(a["kind"], a["key"]) for a in js["attempts"]] == [("ran", ok), ("replayed", ok), ("refused", ok),
                                                                ("ran", bad)]
    shown = json.loads(run("show", ok, "--url", store_url, "--json", cwd=tmp_path).stdout)
    assert shown["record"]["state"] == "succeeded" and shown["record"]["task_id"] == t
    assert [a["kind"] for a in shown["attempts"]] == ["ran", "replayed", "refused"]
    text = run("show", ok, "--url", store_url, cwd=tmp_path).stdout
    assert "state      succeeded" in text and "attempts (3):" in text
    stats = json.loads(run("stats", "--since", "1h", "--url", store_url, "--json", cwd=tmp_path).stdout)
    assert [(s["tool"], s["calls"], s["replayed"], s["refused"]) for s in stats["tools"]] == [("charge", 4, 1, 1)]
    table = run("stats", "--url", store_url, cwd=tmp_path).stdout.splitlines()
    assert table[0].split()[:3] == ["tool", "calls", "replay"] and table[1].split()[:3] == ["charge", "4", "25%"]


def test_unknown_keys_and_tasks_exit_1(store_url: str, tmp_path: Path) -> None:
    fill(store_url, tid())
    for args in (("show", "ag_nope"), ("timeline", "no-such-task"), ("forget", "ag_nope", "--yes")):
        out = run(*args, "--url", store_url, cwd=tmp_path)
        assert out.returncode == 1 and out.stdout == "", out
        assert out.stderr.startswith("agentguard: no ") and "Traceback" not in out.stderr


def test_forget_asks_refuses_a_running_claim_and_leaves_an_entry(store_url: str, tmp_path: Path) -> None:
    t = tid()
    keys = fill(store_url, t)
    ok = keys['charge[order="o-1"]']
    out = run("forget", ok, "--url", store_url, cwd=tmp_path)  # no terminal to ask on, no --yes
    assert out.returncode == 1 and "confirm with --yes" in out.stderr
    assert ls(store_url, "--task", t)[0]["key"] in keys.values()  # nothing deleted
    # a running claim, held by a sync tool in a thread
    g = Guard(store_url)
    holding, release = threading.Event(), threading.Event()

    @g.once
    def hold() -> str:
        holding.set()
        release.wait(60)
        return "done"

    def call() -> None:
        with task(t):
            hold()

    worker = threading.Thread(target=call)
    worker.start()
    try:
        assert holding.wait(60)
        running = next(r["key"] for r in ls(store_url, "--state", "running"))
        out = run("forget", running, "--url", store_url, "--yes", cwd=tmp_path)
        assert out.returncode == 1 and "refused" in out.stderr and "running claim" in out.stderr
        assert "lease is live" in out.stderr
    finally:
        release.set()
        worker.join()
        g.close()
    out = run("forget", ok, "--url", store_url, "--yes", cwd=tmp_path)
    assert out.returncode == 0 and "its next call runs" in out.stdout, out.stderr
    assert ok not in {r["key"] for r in ls(store_url)}
    kinds = [a["kind"] for a in json.loads(run("timeline", t, "--url", store_url, "--json", cwd=tmp_path).stdout)
             ["attempts"] if a["key"] == ok]
    assert kinds == ["ran", "replayed", "refused", "forgotten"]
    # its record gone, `show` still tells what became of the key, from the ledger
    out = run("show", ok, "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"{ok}  scope=default  task={t}" in out.stdout and "no record: forgotten" in out.stdout, out.stdout
    assert [line.split()[2] for line in out.stdout.splitlines() if line.startswith("  20")] == [
        "ran", "REPLAY", "REFUSED", "FORGOT"]
    shown = json.loads(run("show", ok, "--url", store_url, "--json", cwd=tmp_path).stdout)
    assert shown["record"] is None and shown["steps"] == []
    assert [a["kind"] for a in shown["attempts"]] == ["ran", "replayed", "refused", "forgotten"]
    # ... by its start too, as a key with a record is; and a start it shares lists it as gone
    left = [r["key"] for r in ls(store_url)]
    n = 4
    while any(k.startswith(ok[:n]) for k in left):
        n += 1
    by_start = run("show", ok[:n], "--url", store_url, "--json", cwd=tmp_path)
    assert by_start.returncode == 0 and json.loads(by_start.stdout) == shown, by_start.stderr
    listed = run("show", "ag_", "--url", store_url, cwd=tmp_path)
    assert listed.returncode == 1 and f"  {ok}  scope=default  task={t}  (no record)" in listed.stderr.splitlines()
    assert sorted(line.split()[0] for line in listed.stderr.splitlines()[1:]) == sorted([*left, ok])


def test_a_store_of_an_earlier_version_is_upgraded_by_the_command(store_url: str, tmp_path: Path) -> None:
    import asyncio

    t = tid()
    fill(store_url, t)
    asyncio.run(raw_exec(store_url, "DROP TABLE agentguard_attempts"))  # as an earlier version left it
    out = run("timeline", t, "--url", store_url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no attempts in the ledger" in out.stdout
    assert json.loads(run("stats", "--url", store_url, "--json", cwd=tmp_path).stdout)["tools"] == []
