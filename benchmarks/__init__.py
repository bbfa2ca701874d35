"""agentguard's benchmark harness (issue 7): ``python -m benchmarks``; see docs/benchmarks.md.

Modules: ``_harness`` (interleaved, rotated reps; medians; per-rep ratios), ``_common`` (the tool, the
store's own statements and parameters, the cache probe), ``_seq`` (one caller, either backend), ``_sqlite``
and ``_pg`` (drivers, durability counts, 64 callers), ``_pgserver`` (a throwaway cluster), ``_overhead``
(the guard's Python work with no I/O), ``_profile`` (``--profile``), ``_peers`` and ``_dbos_peer``,
``_report`` (tables, targets, JSON).
"""
