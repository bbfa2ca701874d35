"""agentguard's benchmark harness: ``python -m benchmarks``; see docs/benchmarks.md.

Modules: ``_harness`` (interleaved, rotated reps; medians; per-rep ratios), ``_common`` (the tool, the stores
passed to ``Guard(store=...)``, the raw drivers' statements and parameters), ``_drivers`` (sqlite3,
aiosqlite, asyncpg), ``_groups`` (the variants measured side by side), ``_counts`` (Postgres durability
counts), ``_pgserver`` (a throwaway cluster), ``_peers`` (DBOS, Powertools), ``_profile`` (``--profile``),
``_report`` (tables, targets, JSON).
"""
