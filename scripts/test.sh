#!/usr/bin/env bash
# The whole test suite, on a fresh machine: virtualenv, install (uv), lint, type-check (beside the first pass),
# the core suite on the lowest versions pyproject.toml allows (in a second, throwaway virtualenv), Strands and
# CrewAI (a throwaway virtualenv each; these side virtualenvs are made in the background meanwhile), then pytest
# twice — once on embedded SQLite, once on a throwaway PostgreSQL cluster started here and stopped on exit (the
# SQLite pass also model-checks the protocol with spin: tests/whitebox/test_model.py) — and the short chaos run
# (python -m chaos, beside the Postgres pass's serial test).
# Usage: bash scripts/test.sh [pytest args...]
#   With pytest args the floors job, Strands and CrewAI, the other Python versions (scripts/pythons.sh) and the
#   chaos run are skipped (a quick loop); AGENTGUARD_FLOORS=1, AGENTGUARD_FRAMEWORK_VENVS=1,
#   AGENTGUARD_PYTHONS=1 and AGENTGUARD_CHAOS=1 run them anyway, and =0 skips them always.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/agentguard-test.XXXXXX")
PGTMP=""
# Parts run in the background (the other Python versions, the side virtualenvs, mypy, the chaos run): each
# writes its own log, printed when the run waits for it (job_done); a part still running when the run ends early
# is stopped, its children first.
declare -A JOBS=()
start_job() { local name=$1; shift; "$@" > "$SCRATCH/$name.log" 2>&1 & JOBS[$name]=$!; }
job_done() {  # $1: the part, $2: what it is, named if it failed (which fails the run)
  local rc=0
  wait "${JOBS[$1]}" || rc=$?
  unset "JOBS[$1]"
  cat "$SCRATCH/$1.log"
  if [ $rc -ne 0 ]; then echo "$2 failed (exit $rc)" >&2; exit 1; fi
}
cleanup() {
  for pid in "${JOBS[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$PGTMP" ]; then
    as_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PGTMP"
  fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
as_pg() { "$@"; }
# A part's heading, with the seconds the run has taken so far (where the time goes, in every CI log).
say() { echo "== $* [${SECONDS}s]"; }

# Parts that pytest arguments skip unless their variable is 1 (and that 0 skips always).
part() { [ "${1:-}" = 1 ] || { [ "${1:-}" != 0 ] && [ "$2" -eq 0 ]; }; }
FLOORS=0; part "${AGENTGUARD_FLOORS:-}" $# && FLOORS=1
FRAMEWORK_VENVS=0; part "${AGENTGUARD_FRAMEWORK_VENVS:-}" $# && FRAMEWORK_VENVS=1
CHAOS=0; part "${AGENTGUARD_CHAOS:-}" $# && CHAOS=1
PYTHONS=0; part "${AGENTGUARD_PYTHONS:-}" $# && PYTHONS=1

# -- the other Python versions pyproject.toml names: the demo and a core set on each (scripts/pythons.sh), in
# the background from here; its report is printed before the pytest passes
[ "$PYTHONS" = 1 ] && start_job pythons bash scripts/pythons.sh "$PY" "$SCRATCH/pythons"

# -- the side jobs: virtualenvs of their own, made and tested in the background ------------------------------
# The floors' (the lowest versions pyproject.toml allows: the core dependencies and those of the key-forwarding
# extras httpx, httpx2 and stripe, pinned by scripts/floors.py; pytest and the other test tools at their newest;
# no other extra), with the core suite on SQLite; and one each for Strands Agents and CrewAI (see "agent
# frameworks" below), with their tests and examples. Made while the main virtualenv installs, tested while it is
# checked and the first pass starts (each a single process); their report is printed after the SQLite pass. A
# failed install or test fails the run, with its log.
FLOOR_TESTS=(tests/core/test_guard.py tests/core/test_ids.py tests/core/test_operations.py
             tests/core/test_fingerprint_guarded.py tests/core/test_read_first.py tests/core/test_shutdown.py
             tests/core/test_downstream.py tests/core/test_waiters.py tests/stores/test_store_failures.py
             tests/whitebox/test_whitebox_keys.py tests/whitebox/test_whitebox_codec.py tests/whitebox/test_whitebox_ids.py
             tests/whitebox/test_whitebox_cache.py tests/whitebox/test_whitebox_fingerprint_property.py
             tests/whitebox/test_whitebox_sqlite_hops.py tests/whitebox/test_load.py tests/whitebox/test_direct.py
             tests/whitebox/test_key_shapes.py)
# -- agent frameworks (issue 20, part a): smolagents, agno and LlamaIndex live in the main virtualenv (the
# frameworks-a extra) and their tests run in both pytest passes (AGENTGUARD_TEST_FRAMEWORKS, below). Strands Agents
# and CrewAI cannot live there (strands-agents pins mcp<2.2, crewai mcp 1.x; the mcp extra needs mcp 2): each has
# a throwaway virtualenv of its own, where its tests and its example run on SQLite.
framework_tests() {  # extra, its module, then the -k expression choosing its tests and example
  say "$1 in its own virtualenv (SQLite)"
  AGENTGUARD_TEST_BACKEND=sqlite AGENTGUARD_TEST_FRAMEWORKS=$2 "$SCRATCH/$1/bin/python" -m pytest -q -p no:cacheprovider \
    tests/integrations/test_integration_"$1".py tests/project/test_examples.py -k "$3"
}
side_jobs() {
  set -euo pipefail
  if [ "$FLOORS" = 1 ]; then
    "$UV" venv -q -p "$PY" "$SCRATCH/floors"
    uv_install "$SCRATCH/floors" packaging
    "$SCRATCH/floors/bin/python" scripts/floors.py httpx httpx2 stripe > "$SCRATCH/floors.txt"
    uv_install "$SCRATCH/floors" -c "$SCRATCH/floors.txt" -e ".[httpx,httpx2,stripe]" \
      pytest anyio pytest-timeout hypothesis openai
  fi
  if [ "$FRAMEWORK_VENVS" = 1 ]; then
    for extra in strands crewai; do
      "$UV" venv -q -p "$PY" "$SCRATCH/$extra"
      uv_install "$SCRATCH/$extra" -e ".[$extra]" pytest anyio pytest-timeout
    done
  fi
  if [ "$FLOORS" = 1 ]; then
    say "the core suite on the lowest versions pyproject.toml allows (SQLite)"
    sed 's/^/   /' "$SCRATCH/floors.txt"
    # (no framework is installed there, so importing an adapter rightly raises MissingExtraError)
    AGENTGUARD_TEST_BACKEND=sqlite "$SCRATCH/floors/bin/python" -m pytest -q -p no:cacheprovider "${FLOOR_TESTS[@]}" \
      --deselect tests/core/test_downstream.py::test_importing_agentguard_and_its_adapters_imports_no_framework
  fi
  if [ "$FRAMEWORK_VENVS" = 1 ]; then
    framework_tests strands strands "test_integration_strands or strands_agent"
    framework_tests crewai crewai "test_integration_crewai or crewai_crew"
  fi
}
# -- installs: uv (from PyPI, into the main virtualenv) resolves and installs every virtualenv of the run; pip
# took 80 s for the main one alone, uv 20 s. Compiled at install (--compile-bytecode): where
# PYTHONDONTWRITEBYTECODE is set (this machine), nothing would be later, and every process of the run would
# compile what it imports. Its cache is the run's own (a fresh machine has none either).
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q "uv>=0.9" 2>&1 | grep -v "^WARNING: Location" || true
UV=.venv/bin/uv
export UV_CACHE_DIR=${UV_CACHE_DIR:-$SCRATCH/uv-cache} UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1
uv_install() { local venv=$1; shift; "$UV" pip install -q -p "$venv/bin/python" "$@"; }  # into the virtualenv $1

if [ "$FLOORS" = 1 ] || [ "$FRAMEWORK_VENVS" = 1 ]; then
  start_job side side_jobs
fi
side_jobs_done() {
  [ "$FLOORS" = 1 ] || say "(the floors job is skipped: pytest arguments were given; AGENTGUARD_FLOORS=1 runs it)"
  [ "$FRAMEWORK_VENVS" = 1 ] || say "(Strands and CrewAI in their own virtualenvs are skipped: pytest arguments were given; AGENTGUARD_FRAMEWORK_VENVS=1 runs them)"
  if [ -n "${JOBS[side]:-}" ]; then job_done side "the side jobs (the floors' and the frameworks' own virtualenvs)"; fi
}

# the distribution was called agentguard before: a virtualenv made then would hold both names
"$UV" pip uninstall -q -p .venv/bin/python agentguard 2>/dev/null || true
# One resolution for everything the main virtualenv holds: the test tools (the dev group), the frameworks of
# "integrations" and of "frameworks-a" (smolagents, agno, LlamaIndex; see "agent frameworks" below) and
# "frameworks-b" (Google ADK, AG2, the Claude Agent SDK, whose wheel bundles the Claude Code CLI its tests
# drive against a fake Messages API on loopback, and the Anthropic SDK), so their tests run on both databases.
uv_install .venv -e ".[postgres,mcp,integrations,frameworks-a,frameworks-b]" --group dev
.venv/bin/python -c "import agentguard, sqlalchemy, aiosqlite, asyncpg, greenlet" # install really worked
# frameworks B's tests import their framework at module level: one missing fails the run, never a skip
.venv/bin/python -c "import google.adk, ag2, claude_agent_sdk, anthropic"

# The frameworks the main virtualenv's passes must have: one named here and not installed fails the run
# (tests/conftest.py), none is skipped silently. (Set after the side jobs started: the floors have none.)
export AGENTGUARD_TEST_FRAMEWORKS="smolagents agno llama_index"

say "ruff"
.venv/bin/ruff check agentguard tests servers examples benchmarks scripts chaos
# mypy runs on one core: in the background, beside the first pass (its report is printed after that pass)
say "mypy --strict (in the background)"
start_job mypy .venv/bin/mypy

# -- a throwaway PostgreSQL ---------------------------------------------------------------------------
find_pg_bin() {
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}
# A Debian package a part of the suite needs: installed where this run may (as root, with apt-get), else the run
# stops saying what to install. $1: a test that it is there; $2: the packages; $3: what needs them.
need() {
  eval "$1" && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing $2 from Debian's packages"
    # shellcheck disable=SC2086 # (the packages, one word each)
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $2 >/dev/null)
  else
    echo "$2 is not installed ($3 needs it); install it and re-run" >&2
    exit 1
  fi
}
# strace counts SQLite's syncs in tests/stores/test_durability.py (which skips without it: installed where it may be)
if ! command -v strace >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need false strace "tests/stores/test_durability.py"
fi
# Chromium (Debian's, headless): tests/console/test_console_browser.py drives the console's page in it
need "command -v chromium >/dev/null 2>&1" chromium "the console's browser tests"
export AGENTGUARD_REQUIRE_BROWSER=1  # tests/console/test_console_browser.py fails rather than skips without it
need 'PGBIN=$(find_pg_bin || true); [ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ]' postgresql "the Postgres pass (initdb, pg_ctl)"
PGBIN=$(find_pg_bin)
# PgBouncer, in front of the throwaway PostgreSQL in tests/whitebox/test_pgbouncer.py (and agentguard doctor's tests)
# (Debian's package starts a pgbouncer service of its own: the tests start theirs on free ports, it is not used)
need "command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]" pgbouncer "the tests behind a pooler"
export AGENTGUARD_REQUIRE_PGBOUNCER=1  # tests/pgbouncer.py fails rather than skips without it
# spin, the model checker of tests/whitebox/test_model.py, and a C compiler for the verifiers it generates
need "command -v spin >/dev/null 2>&1 && { command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; }" \
  "spin gcc" "the model checker's test"
export AGENTGUARD_REQUIRE_SPIN=1  # tests/whitebox/test_model.py fails rather than skips without it

PGTMP=$(mktemp -d "${TMPDIR:-/tmp}/agentguard-pg.XXXXXX")
PGPORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ "$(id -u)" = 0 ]; then
  # initdb and pg_ctl refuse to run as root: use an unprivileged account.
  PGUSER_OS=postgres
  id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --no-create-home "$PGUSER_OS"
  chown "$PGUSER_OS" "$PGTMP"
  as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }
fi
as_pg "$PGBIN/initdb" -D "$PGTMP/data" -A trust -U agentguard --no-sync >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -l "$PGTMP/log" -w -t 60 start -o \
  "-p $PGPORT -k $PGTMP -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off -c full_page_writes=off" \
  >/dev/null
export AGENTGUARD_TEST_PG_URL="postgresql+asyncpg://agentguard@127.0.0.1:$PGPORT/postgres"

# Each pass on a few workers (pytest-xdist): every test has a store of its own (a SQLite file, an emptied
# Postgres database) and binds no fixed port, and most of a test's time is spent waiting (leases, processes,
# a server: a sample of the suite spent 18 s of CPU in 35 s), so 2 cores keep 4 of them busy. Work-stealing: a
# worker with nothing left takes tests queued on another, so no pass ends on one worker's queue (with the default
# a quarter of the tests were queued up front, and a pass's last minute ran on one or two workers).
# AGENTGUARD_TEST_WORKERS=0 runs a pass in one process.
WORKERS=${AGENTGUARD_TEST_WORKERS:-4}
# Line and branch coverage of agentguard/ across both passes (and the processes tests start, where they load
# coverage: .coveragerc-less, pyproject's [tool.coverage]), printed at the end; AGENTGUARD_COVERAGE=0 skips it.
COVERAGE=${AGENTGUARD_COVERAGE:-1}
export COVERAGE_FILE="$SCRATCH/coverage"
# -- the chaos run: a fleet of workers under SIGKILL, SIGSTOP, cut connections and a restart of a throwaway
# Postgres of its own. Started in the background once the parallel Postgres pass is over, beside the serial test.
start_chaos() {
  if [ "$CHAOS" = 1 ] && [ -z "${JOBS[chaos]:-}" ] && [ ! -e "$SCRATCH/chaos.log" ]; then
    say "the chaos run (short; python -m chaos --long for the long one), in the background"
    start_job chaos .venv/bin/python -m chaos --short
  fi
}
# A test marked serial needs the database server to itself (cluster-wide counters): on Postgres it runs after the
# parallel pass, alone (SQLite has no server, and no test is marked so there). Exit 5 (no tests) of one part is
# fine; of both, a failure.
run_pytest() {
  local backend=$1; shift
  say "pytest on $backend"
  local cov=()
  [ "$COVERAGE" = 0 ] || cov=(--cov=agentguard --cov-branch --cov-append --cov-report=)
  local rc=0 rc_serial=5
  set +e
  if [ "$WORKERS" = 0 ]; then
    AGENTGUARD_TEST_BACKEND=$backend .venv/bin/python -m pytest "${cov[@]}" "$@"; rc=$?
  else
    AGENTGUARD_TEST_BACKEND=$backend .venv/bin/python -m pytest -n "$WORKERS" --dist worksteal -m "not serial" --durations=15 "${cov[@]}" "$@"; rc=$?
    if [ "$backend" = postgres ]; then
      start_chaos  # (its own cluster: the serial test needs only the test server to itself)
      say "pytest on $backend: the tests that need the server to themselves"
      AGENTGUARD_TEST_BACKEND=$backend .venv/bin/python -m pytest -m serial "${cov[@]}" "$@"; rc_serial=$?
    fi
  fi
  set -e
  if [ $rc -eq 5 ] && [ $rc_serial -eq 5 ]; then echo "pytest collected no tests on $backend: failing" >&2; return 1; fi
  [ $rc -eq 5 ] && rc=0
  [ $rc_serial -eq 5 ] && rc_serial=0
  [ $rc -eq 0 ] && [ $rc_serial -eq 0 ]
}
if [ -n "${JOBS[pythons]:-}" ]; then
  job_done pythons "the other Python versions"
else
  say "(the other Python versions are skipped: pytest arguments were given; AGENTGUARD_PYTHONS=1 runs them)"
fi
run_pytest sqlite "$@"
say "mypy --strict"
job_done mypy "mypy --strict"
side_jobs_done
run_pytest postgres "$@"
say "all tests passed on sqlite and postgres"
if [ "$COVERAGE" != 0 ]; then
  say "coverage of agentguard/ (lines and branches, both passes)"
  .venv/bin/python -m coverage report --skip-covered --sort=cover | tail -n 40
  .venv/bin/python scripts/executors_covered.py "$COVERAGE_FILE"
fi

if [ "$CHAOS" = 1 ]; then
  start_chaos
  say "the chaos run"
  job_done chaos "the chaos run"
else
  say "(the chaos run is skipped: pytest arguments were given; AGENTGUARD_CHAOS=1 runs it)"
fi
say "done"
