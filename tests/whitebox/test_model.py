"""The protocol, model-checked: ``model/agentguard.pml`` under the spin model checker.

The model is the claim / heartbeat / completion / release / takeover / sweep / step protocol of
``agentguard/stores/_statements.py`` and ``agentguard/_machine.py``, with workers that crash, pause past their
lease (and past retention) and wake, one database clock, a sweeper, and a provider that honours keys. At each
claim a worker follows either claim plan (insert first, for a key likely free; read first, for a key likely
taken), chosen nondeterministically. spin explores every interleaving, exhaustively, for each configuration
below and proves its assertions (no stale fence lands a write, one body per live claim, a body only under a
claim granted to its worker, no claim granted while another is live, every caller gets the one stored result,
one charge per key, a step's result stays with its operation) and the liveness formula (a crashed claim is
eventually taken over, under weak fairness). Deliberately broken variants must be refuted, so the checker
provably checks something; their counterexamples are printed as the sequence of store statements that breaks
the property.

``AGENTGUARD_MODEL_FULL=1`` adds the larger configurations (a minute or two, a few GB of memory). spin and a C
compiler are needed: ``scripts/test.sh`` installs them (``apt-get install spin``) and sets
``AGENTGUARD_REQUIRE_SPIN=1``, so CI fails rather than skips without them. The model does not depend on the
database, so it runs in the SQLite pass only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agentguard import stores
from agentguard._machine import Machine
from agentguard.stores import SQLStore
from agentguard.stores._protocols import AdminStore, ClaimStore, StepStore
from agentguard.stores._statements import Statements

from conftest import ROOT

MODEL = ROOT / "model" / "agentguard.pml"
FULL = os.environ.get("AGENTGUARD_MODEL_FULL") == "1"

# (name, the model's sizes): each proved exhaustively (every assertion, every reachable state).
SAFETY = [
    ("2 workers, 1 key, crashes, a retry after a release", ["-DW=2", "-DK=1", "-DCALLS=2", "-DMAXCRASH=1"]),
    ("2 workers, 1 multi-step key, crashes", ["-DW=2", "-DK=1", "-DSTEPKEY=0", "-DCALLS=1", "-DMAXCRASH=1"]),
    ("3 workers, 1 key", ["-DW=3", "-DK=1", "-DCALLS=1", "-DMAXCRASH=0"]),
    ("2 workers, 2 keys (the second multi-step)", ["-DW=2", "-DK=2", "-DSTEPKEY=1", "-DCALLS=1", "-DMAXCRASH=0"]),
]
SAFETY_FULL = [
    ("2 workers, 2 keys, crashes", ["-DW=2", "-DK=2", "-DCALLS=1", "-DMAXCRASH=1"]),
    ("3 workers, 1 multi-step key", ["-DW=3", "-DK=1", "-DSTEPKEY=0", "-DCALLS=1", "-DMAXCRASH=0"]),
    ("2 workers, 1 key, longer lease and retention", ["-DW=2", "-DK=1", "-DSTEPKEY=0", "-DCALLS=1",
                                                       "-DLEASE=2", "-DRETENTION=3"]),
]
# Liveness: no sweeper (a retention longer than the outage), so only a takeover can end an orphaned claim.
LIVENESS = [
    ("2 workers, 1 key, a crash", ["-DW=2", "-DK=1", "-DCALLS=1", "-DMAXCRASH=1", "-DNOSWEEP"]),
    ("2 workers, 1 multi-step key, a crash", ["-DW=2", "-DK=1", "-DSTEPKEY=0", "-DCALLS=1", "-DMAXCRASH=1",
                                               "-DNOSWEEP"]),
]
# (name, sizes, what spin must report): each a protocol with one rule taken out.
BROKEN = [
    ("fences restart with a new row (a release that deletes it, or a sweep)",
     ["-DW=3", "-DK=1", "-DCALLS=1", "-DMAXCRASH=0", "-DBROKEN_FENCE_RESTART"], "holder"),
    ("the completion is not fenced", ["-DW=2", "-DK=1", "-DCALLS=1", "-DMAXCRASH=0", "-DBROKEN_UNFENCED_COMPLETE"],
     "holder"),
    ("a takeover without reset admits a completed record past retention (the predicate before this proof)",
     ["-DW=2", "-DK=1", "-DSTEPKEY=0", "-DCALLS=1", "-DMAXCRASH=0", "-DBUG_TAKEOVER_COMPLETED"], "myinc"),
    ("read first runs the body after reading 'absent', whatever the insert answered",
     ["-DW=2", "-DK=1", "-DCALLS=1", "-DMAXCRASH=0", "-DBROKEN_READ_FIRST"], "myfence!=0"),
    ("read first claims with an upsert after reading 'absent' (the read decides, the write checks nothing)",
     ["-DW=2", "-DK=1", "-DCALLS=1", "-DMAXCRASH=0", "-DBROKEN_READ_FIRST_UPSERT"], "lease>0"),
]
BROKEN_LIVENESS = [
    ("leases never expire", ["-DW=2", "-DK=1", "-DCALLS=1", "-DMAXCRASH=1", "-DNOSWEEP", "-DBROKEN_NO_EXPIRY"]),
]

pytestmark = pytest.mark.storeless  # the model does not depend on the database


def _tools() -> tuple[str, str]:
    spin, cc = shutil.which("spin"), shutil.which("cc") or shutil.which("gcc")
    if spin is None or cc is None:
        if os.environ.get("AGENTGUARD_REQUIRE_SPIN") == "1":
            pytest.fail("spin and a C compiler are required (apt-get install spin gcc)")
        pytest.skip("spin or a C compiler is not installed (apt-get install spin gcc)")
    return spin, cc


def _check(tmp: Path, defines: list[str], *, liveness: bool, refuted: bool = False) -> str:
    """Generate, compile and run the verifier for ``defines``; its report. ``refuted``: a broken variant, whose
    counterexample is found in a small corner of the state space: its verifier is compiled unoptimised (the
    compiler's optimisation would cost several times the search)."""
    spin, cc = _tools()
    shutil.copy(MODEL, tmp / MODEL.name)
    subprocess.run([spin, "-a", *defines, MODEL.name], cwd=tmp, check=True, capture_output=True, timeout=120)
    flags = ["-DCOLLAPSE", "-DMEMLIM=3072"] + (["-DNFAIR=3"] if liveness else ["-DNOCLAIM"])
    subprocess.run([cc, "-O0" if refuted else "-O2", "-w", *flags, "-o", "pan", "pan.c"], cwd=tmp, check=True,
                   capture_output=True, timeout=300)
    args = ["-a", "-f", "-N", "taken_over", "-w22"] if liveness else ["-w24"]
    done = subprocess.run(["./pan", "-m300000", *args], cwd=tmp, capture_output=True, text=True, timeout=900)
    return done.stdout + done.stderr


def _complete(report: str) -> None:
    """The search covered every reachable state: nothing cut it short."""
    for sign in ("max search depth too small", "reached -DMEMLIM bound", "Search not completed", "out of memory"):
        assert sign not in report, report[-3000:]


def _counterexample(tmp: Path, defines: list[str]) -> list[str]:
    """The trail spin wrote, replayed: the statements of the counterexample, as the model prints them."""
    spin, _ = _tools()
    shown = subprocess.run([spin, "-t", *defines, MODEL.name], cwd=tmp, capture_output=True, text=True, timeout=120)
    story: list[str] = []
    for line in shown.stdout.splitlines():
        line = line.strip()
        if line.startswith("MSC: "):
            event = line[5:]
            if story and story[-1].split(" (x")[0] == event:
                n = int(story[-1].rsplit("(x", 1)[1][:-1]) + 1 if "(x" in story[-1] else 2
                story[-1] = f"{event} (x{n})"
            else:
                story.append(event)
        elif "violated" in line or "acceptance cycle" in line:
            story.append(line)
    return story


@pytest.mark.parametrize(("name", "defines"), SAFETY + (SAFETY_FULL if FULL else []), ids=[
    n for n, _ in SAFETY + (SAFETY_FULL if FULL else [])
])
def test_every_interleaving_keeps_every_property(name: str, defines: list[str], tmp_path: Path) -> None:
    report = _check(tmp_path, defines, liveness=False)
    assert "errors: 0" in report, report[-3000:]
    _complete(report)
    # The search reached the paths the properties are about (the model is not vacuous): a statement it never
    # reached is listed, with the line it prints when it runs.
    worker = report.split("unreached in proctype Worker", 1)[1].split("unreached in", 1)[0]
    must = ["take_over k%d (seen fence %d, reset", "take_over k%d (seen fence %d): refused",
            "complete k%d fence %d: result", "complete k%d fence %d: refused", "release k%d fence %d\\n", "crashed",
            "read first k%d: absent, insert"]  # (both claim plans: insert first's statements are the ones above)
    if "-DSTEPKEY=0" not in defines:  # a plain body renews its lease (a step's writes renew it themselves)
        must.append("renew k%d fence %d\\n")
    if "-DSTEPKEY=0" in defines or "-DSTEPKEY=1" in defines:
        must += ["put_step k%d fence %d origin", "put_step k%d fence %d: refused", "load_steps"]
    for event in must:
        if event == "crashed" and "-DMAXCRASH=0" in defines:
            continue
        assert event not in worker, f"never reached: {event}"
    sweeper = report.split("unreached in proctype Sweeper", 1)[1].split("unreached in", 1)[0]
    assert "sweep k%d: deleted\\n',0)" not in sweeper


@pytest.mark.parametrize(("name", "defines"), LIVENESS, ids=[n for n, _ in LIVENESS])
def test_a_crashed_claim_is_eventually_taken_over(name: str, defines: list[str], tmp_path: Path) -> None:
    report = _check(tmp_path, defines, liveness=True)
    assert "errors: 0" in report and "acceptance   cycles \t+ (fairness enabled)" in report, report[-3000:]
    _complete(report)


@pytest.mark.parametrize(("name", "defines", "violated"), BROKEN, ids=[n for n, _, _ in BROKEN])
def test_a_broken_protocol_is_refuted(name: str, defines: list[str], violated: str, tmp_path: Path) -> None:
    report = _check(tmp_path, [*defines], liveness=False, refuted=True)
    assert "errors: 1" in report and "assertion violated" in report, report[-3000:]
    # The shortest counterexample, for the reader (pytest -rA shows it).
    shortest = subprocess.run(["./pan", "-i", "-m2000", "-w24"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300).stdout
    which = [line for line in shortest.splitlines() if "assertion violated" in line][-1]
    story = _counterexample(tmp_path, defines)
    print(f"counterexample ({name}): {which}\n  " + "\n  ".join(story))
    assert violated in which and any("violated" in event for event in story), (which, story)


@pytest.mark.parametrize(("name", "defines"), BROKEN_LIVENESS, ids=[n for n, _ in BROKEN_LIVENESS])
def test_a_protocol_without_expiry_never_takes_over(name: str, defines: list[str], tmp_path: Path) -> None:
    report = _check(tmp_path, defines, liveness=True, refuted=True)
    assert "acceptance cycle" in report and "errors: 1" in report, report[-3000:]
    story = _counterexample(tmp_path, defines)
    print(f"counterexample ({name}):\n  " + "\n  ".join(story))
    assert any("crashed" in event for event in story), story


# -- the model names what the code names ------------------------------------------------------------------


def _model() -> str:
    return MODEL.read_text()


def _mtype(name: str) -> set[str]:
    found = re.search(rf"mtype:{name} = \{{([^}}]*)\}}", _model())
    assert found, name
    return {v.strip() for v in found.group(1).split(",")}


def test_the_models_states_are_the_stores() -> None:
    assert _mtype("record_state") - {"absent"} == {stores.RUNNING, stores.SUCCEEDED, stores.FAILED, stores.RELEASED}
    assert _mtype("step_state") - {"none"} == {stores.STARTED, stores.DONE}


def _verbs() -> list[str]:
    text = _model()
    section = text.split("/* -- the store's verbs", 1)[1].split("/* -- end of the store's verbs", 1)[0]
    return re.findall(r"^inline (\w+)\(", section, re.M)


# The store's verbs the model leaves out, and why.
NOT_MODELLED = {
    "ensure_schema": "creates the tables; no protocol state",
    "dispose": "lets go of connections; no protocol state",
    "release_owned": "a claimer cancelled mid-claim releases by owner token: the model has no cancellation",
    "step_transaction": "op.transaction: put_step's fenced transaction with the caller's statements in it",
}


def test_the_models_verbs_are_the_stores() -> None:
    verbs = _verbs()
    statements = Statements("0")
    protocol = {
        name for proto in (ClaimStore, StepStore, AdminStore) for name in vars(proto)
        if not name.startswith("_") and callable(getattr(proto, name))
    }
    for verb in verbs:
        assert hasattr(statements, verb), f"the model's {verb} is no statement of the store"
        assert verb == "sweep_steps" or (verb in protocol and callable(getattr(SQLStore, verb))), verb
    hot = {
        name for proto in (ClaimStore, StepStore) for name in vars(proto)
        if not name.startswith("_") and callable(getattr(proto, name))
    }
    assert hot - set(verbs) == set(NOT_MODELLED), "a verb of the hot path is neither modelled nor excused"
    assert "sweep" in verbs


def test_the_models_worker_is_the_engine() -> None:
    worker = _model().split("proctype Worker", 1)[1].split("init {", 1)[0]
    labels = set(re.findall(r"^(\w+):", worker, re.M))
    engine_steps = {"begin", "claimed", "replayed", "succeed", "fail", "lease_lost", "in_progress"}
    assert engine_steps <= labels
    for name in engine_steps:
        assert callable(getattr(Machine, name)), name
