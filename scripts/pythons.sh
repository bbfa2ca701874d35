#!/usr/bin/env bash
# Each Python version pyproject.toml's classifiers name, besides the one the main suite runs on: a throwaway
# virtualenv per interpreter found on this machine (on PATH, or installed by pyenv), this checkout installed
# into it with the test tools only (no extra), then `agentguard demo` and a small core set of tests on SQLite.
# It says which versions ran and which could not; it fails if any run fails, or if no other version could run
# at all (then nothing but the main one was tested: say so with AGENTGUARD_PYTHONS=0 to skip this step).
# Usage: bash scripts/pythons.sh MAIN_PYTHON WORKDIR   (scripts/test.sh runs it in the background, and prints
# its log before the pytest passes)
set -uo pipefail
cd "$(dirname "$0")/.."
MAIN=$1
WORK=$2
mkdir -p "$WORK"

main_version=$("$MAIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# the versions the package says it supports, read from pyproject.toml (one source)
mapfile -t versions < <(grep -oE '"Programming Language :: Python :: 3\.[0-9]+"' pyproject.toml | grep -oE '3\.[0-9]+')
CORE=(tests/core/test_guard.py tests/core/test_ids.py tests/core/test_injected.py tests/core/test_cli_start.py
      tests/whitebox/test_whitebox_keys.py tests/whitebox/test_whitebox_codec.py tests/whitebox/test_whitebox_ids.py
      tests/whitebox/test_whitebox_shortcuts.py)
# Known to fail from a Python version on, each for a reason of that version, named here and printed with
# every run until the code is fixed (FROM|TEST|WHY): none now (3.12's protocol checks and 3.13's recursion
# limit are handled by the code: stores._protocols.is_claim_store, _codec.MAX_DEPTH).
KNOWN=()

find_python() {  # an interpreter of version $1 that really runs, else nothing
  local v=$1 c
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  command -v pyenv >/dev/null 2>&1 && root=$(pyenv root)
  for c in $(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r) \
           "/usr/local/bin/python$v" "/usr/bin/python$v" "$(command -v "python$v" 2>/dev/null)"; do
    if [ -x "$c" ] && "$c" -c "import sys, venv; sys.exit(sys.version_info[:2] != tuple(map(int, '$v'.split('.'))))" \
        >/dev/null 2>&1; then
      echo "$c"; return
    fi
  done
}

ran=("$main_version (the whole suite, in the main virtualenv)")
missing=()
failed=()
notes=()
for v in "${versions[@]}"; do
  [ "$v" = "$main_version" ] && continue
  py=$(find_python "$v")
  if [ -z "$py" ]; then
    missing+=("$v"); continue
  fi
  full=$("$py" -c 'import platform; print(platform.python_version())')
  log="$WORK/python$v.log"
  echo "-- Python $full ($py)" >"$log"
  deselect=()
  for k in "${KNOWN[@]}"; do
    IFS='|' read -r -d '' from test why <<<"$k"
    if [ "$(printf '%s\n' "$from" "$v" | sort -V | head -n 1)" = "$from" ]; then
      deselect+=(--deselect "$test")
      notes+=("$full: $test left out: $(echo $why)")
    fi
  done
  if "$py" -m venv "$WORK/py$v" >>"$log" 2>&1 \
     && "$WORK/py$v/bin/python" -m pip install -q -e . pytest anyio pytest-timeout >>"$log" 2>&1 \
     && (cd "$WORK" && env -u AGENTGUARD_URL "$WORK/py$v/bin/agentguard" demo) >>"$log" 2>&1 \
     && AGENTGUARD_TEST_BACKEND=sqlite "$WORK/py$v/bin/python" -m pytest -q -p no:cacheprovider "${CORE[@]}" \
        "${deselect[@]}" >>"$log" 2>&1; then
    ran+=("$full (the demo and $(grep -oE '[0-9]+ passed' "$log" | tail -n 1) of the core set)")
  else
    failed+=("$full"); cat "$log"
  fi
done

echo "== Python versions tested:"
printf '   %s\n' "${ran[@]}"
[ ${#notes[@]} -eq 0 ] || { echo "== KNOWN FAILURES, left out until fixed:"; printf '   %s\n' "${notes[@]}"; }
[ ${#missing[@]} -eq 0 ] || echo "== Python versions NOT tested (no interpreter of theirs found here): ${missing[*]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "== failed on Python ${failed[*]} (its log is above)"; exit 1
fi
if [ ${#ran[@]} -eq 1 ] && [ ${#versions[@]} -gt 1 ]; then
  echo "== no Python besides $main_version could be tested here: install one (pyenv install 3.12) or skip" \
       "this step with AGENTGUARD_PYTHONS=0"
  exit 1
fi
