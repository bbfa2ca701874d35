"""Which SHA-256 a call's identity should take: OpenSSL's (``hashlib.sha256``) or CPython's own built-in one.

    python -m benchmarks.digests [--calls N] [--reps R]

A call's identity takes a SHA-256 for its key, one for its fingerprint and one per argument
(``agentguard._keys.sha``). CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before) sets up less per
digest than OpenSSL's; OpenSSL's uses the CPU's SHA instructions where it has them. This times the identity of
calls no memo has seen (``Spec.call`` of a decorated tool, each rep a new task) with either digest in place,
interleaved within each rep, for a short argument and for long ones (a refund's reason, an e-mail's body), and
prints each median and their ratio, after checking that both give the same digests. agentguard takes
``hashlib``'s (measured on the project's machine: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from agentguard import Guard, _keys, task

from ._common import pin_one_cpu

LENGTHS = (20, 300, 2000)  # characters of the tool's second argument


def builtin_sha256() -> Callable[[bytes], Any] | None:
    """CPython's own SHA-256, or None where it is not built in."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            return None
    return sha256  # type: ignore[no-any-return]


def measure(calls: int, reps: int) -> dict[tuple[int, str], list[float]]:
    builtin = builtin_sha256()
    digests: dict[str, Callable[[bytes], Any]] = {"hashlib (OpenSSL)": hashlib.sha256}
    if builtin is not None:
        digests["CPython's own"] = builtin
        data = os.urandom(3000)
        for n in (0, 1, 55, 56, 64, 300, 3000):
            assert builtin(data[:n]).hexdigest() == hashlib.sha256(data[:n]).hexdigest()
    guard = Guard("sqlite+aiosqlite:///:memory:", cache_size=0, ledger=False)

    @guard.once(key=["order_id"], operation="send")
    def send(order_id: str, text: str) -> None:  # never called: only its identity is made
        raise AssertionError

    spec: Any = getattr(send, "__agentguard__")  # noqa: B009
    kept = _keys._sha256
    out: dict[tuple[int, str], list[float]] = {}
    try:
        for rep in range(reps):
            for length in LENGTHS:
                for name, digest in digests.items():
                    _keys._sha256 = digest
                    spec.flat._memo.clear()  # (calls no memo has seen: a resumed agent's)
                    args = [(f"o-{rep}-{i}", (f"{i}:" * length)[:length]) for i in range(calls)]
                    with task(f"digests-{rep}-{length}-{name}"):
                        started = time.perf_counter()
                        for a in args:
                            spec.call(a, {})
                        out.setdefault((length, name), []).append((time.perf_counter() - started) / calls * 1e6)
    finally:
        _keys._sha256 = kept
        guard.close()
    return out


def report(out: dict[tuple[int, str], list[float]]) -> str:
    lines = ["== A call's identity (unseen calls: key, fingerprint, per-argument hashes), µs a call",
             f"{'argument':<28}{'hashlib (OpenSSL)':>20}{'CPython own':>14}{'own ÷ hashlib':>16}"]
    for length in LENGTHS:
        ssl = statistics.median(out[(length, "hashlib (OpenSSL)")])
        own = out.get((length, "CPython's own"))
        if own is None:
            lines.append(f"{length:>6} characters{'':<12}{ssl:>20.2f}{'—':>14}{'—':>16}")
            continue
        mine = statistics.median(own)
        lines.append(f"{length:>6} characters{'':<12}{ssl:>20.2f}{mine:>14.2f}{mine / ssl:>15.2f}×")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    pin_one_cpu()
    print(report(measure(args.calls, args.reps)))


if __name__ == "__main__":
    main()
