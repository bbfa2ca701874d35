#!/usr/bin/env bash
# The whole test suite, on a fresh machine: virtualenv, install, lint, type-check, then pytest twice —
# once on embedded SQLite, once on a throwaway PostgreSQL cluster started here and stopped on exit.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[dev,postgres,mcp,integrations]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import agentguard, sqlalchemy, aiosqlite, asyncpg, greenlet" # install really worked

echo "== ruff"
.venv/bin/ruff check agentguard tests servers examples benchmarks
echo "== mypy --strict"
.venv/bin/mypy

# -- a throwaway PostgreSQL ---------------------------------------------------------------------------
find_pg_bin() {
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}
PGBIN=$(find_pg_bin || true)
if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/initdb" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing PostgreSQL from Debian's packages"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null)
    PGBIN=$(find_pg_bin)
  else
    echo "PostgreSQL's initdb/pg_ctl are not installed; install postgresql and re-run" >&2
    exit 1
  fi
fi

PGTMP=$(mktemp -d "${TMPDIR:-/tmp}/agentguard-pg.XXXXXX")
PGPORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg() { "$@"; }
if [ "$(id -u)" = 0 ]; then
  # initdb and pg_ctl refuse to run as root: use an unprivileged account.
  PGUSER_OS=postgres
  id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --no-create-home "$PGUSER_OS"
  chown "$PGUSER_OS" "$PGTMP"
  as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }
fi
cleanup() {
  as_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PGTMP"
}
trap cleanup EXIT
as_pg "$PGBIN/initdb" -D "$PGTMP/data" -A trust -U agentguard --no-sync >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -l "$PGTMP/log" -w -t 60 start -o \
  "-p $PGPORT -k $PGTMP -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c full_page_writes=off" \
  >/dev/null
export AGENTGUARD_TEST_PG_URL="postgresql+asyncpg://agentguard@127.0.0.1:$PGPORT/postgres"

run_pytest() {
  local backend=$1; shift
  echo "== pytest on $backend"
  set +e
  AGENTGUARD_TEST_BACKEND=$backend .venv/bin/python -m pytest "$@"
  local rc=$?
  set -e
  if [ $rc -eq 5 ]; then echo "pytest collected no tests on $backend: failing" >&2; return 1; fi
  return $rc
}
run_pytest sqlite "$@"
run_pytest postgres "$@"
echo "== all tests passed on sqlite and postgres"
