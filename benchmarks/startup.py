"""How long the ``agentguard`` command and ``import agentguard`` take to start, beside the bare interpreter.

    python -m benchmarks.startup [--runs N] [--python PYTHON]

Runs each command ``N`` times (default 20) in a fresh process, as a person or a shell script would, and
prints the median and the fastest wall time of each, and the third-party top-level modules it loaded. The
target (issue 33): ``agentguard --help`` and ``--version`` under 150 ms on the project's machine; ``import
agentguard`` loads no dependency (optional or not) until a public name is used. ``--python`` times another
interpreter or virtualenv (one where only the wheel is installed, say); by default this one, with this
checkout first on the path. Nothing is timed inside a test: tests/core/test_cli_start.py asserts what is imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
COMMANDS = (  # (what, argv after the interpreter, under the target?)
    ("python -c pass (the floor)", ["-c", "pass"], False),
    ("agentguard --help", ["-m", "agentguard", "--help"], True),
    ("agentguard --version", ["-m", "agentguard", "--version"], True),
    ("agentguard help show", ["-m", "agentguard", "help", "show"], False),
    ("import agentguard", ["-c", "import agentguard"], False),
    ("from agentguard import Guard", ["-c", "from agentguard import Guard"], False),
)
STDLIB = set(sys.stdlib_module_names) | {"agentguard", "encodings", "_distutils_hack", "sitecustomize"}


# Runs a command as ``python ARGV`` would, then names the top-level modules it left loaded (on stderr).
_WRAP = """import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write("\\nMODULES " + " ".join({m.split(".")[0] for m in sys.modules}) + "\\n"))
argv = sys.argv[1:]
if argv[0] == "-m":
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
else:
    exec(argv[1])
"""


def loaded(python: str, argv: list[str], env: dict[str, str], cwd: str) -> list[str]:
    """The third-party top-level modules the command leaves loaded."""
    out = subprocess.run([python, "-c", _WRAP, *argv], env=env, cwd=cwd, capture_output=True, text=True)
    tops = out.stderr.rsplit("\nMODULES ", 1)[1].split()
    return sorted(t for t in tops if t not in STDLIB and not t.startswith("_"))


def time_ms(python: str, argv: list[str], env: dict[str, str], cwd: str, runs: int) -> list[float]:
    subprocess.run([python, *argv], env=env, cwd=cwd, capture_output=True, check=True)  # warm: bytecode, caches
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, *argv], env=env, cwd=cwd, capture_output=True, check=True)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=20, help="processes per command (default: 20)")
    p.add_argument("--python", help="the interpreter to time (default: this one, this checkout first on the path)")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTGUARD_URL", "PYTHONPATH")}
    python = args.python or sys.executable
    if args.python is None:
        env["PYTHONPATH"] = str(ROOT)
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"startup of the agentguard command: Python {version} ({python}), {args.runs} runs each, {os.cpu_count()}"
          f" CPUs")
    print(f"{'command':<32}{'median ms':>10}{'min ms':>9}  {'target':<12}third-party modules loaded")
    with tempfile.TemporaryDirectory() as cwd:  # no agentguard.db or agentguard.toml to find
        for what, argv, targeted in COMMANDS:
            times = time_ms(python, argv, env, cwd, args.runs)
            median = statistics.median(times)
            verdict = ""
            if targeted:
                verdict = f"<{TARGET_MS:.0f}: " + ("PASS" if median < TARGET_MS else "FAIL")
            mods = loaded(python, argv, env, cwd)
            print(f"{what:<32}{median:>10.1f}{min(times):>9.1f}  {verdict:<12}{', '.join(mods) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
