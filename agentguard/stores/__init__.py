"""Stores: one SQLAlchemy Core async store serves SQLite (embedded default) and Postgres (a fleet).

What the guard asks of a store is written as three protocols (``ClaimStore``, ``StepStore``,
``AdminStore``; ``Store`` is all three); ``SQLStore`` implements them. Inside, one module per concept:

- ``_schema``      the tables, the one row layout a record is read in, ``Record`` and ``Listing``;
- ``_statements``  every statement, generated from the layout, and the one compiler of them for a driver;
- ``_dialects``    every SQLite/Postgres difference, in one object chosen when the store is made;
- ``_claims``      the claim written once: two plans of statements, sans I/O, that every executor runs;
- ``_verbs``       the hot verbs written once for every executor, and the same verbs in a sync tool's thread;
- ``_aiosqlite``   what the store needs of aiosqlite beyond SQLAlchemy (connections, threads, one hop);
- ``_engines``     one engine per event loop, and letting go;
- ``_lane``        the hot path's connections on a loop: kept while in use, each handed to the longest waiter;
- ``_executor``    running statements and plans: the hot path, the general path, one retry policy, ``StoreError``;
- ``_direct``      SQLite without a hop: sync tools' statements in their thread, async tools' on their loop;
- ``_direct_pg``   Postgres: sync tools' statements in their own thread, over psycopg;
- ``_sweep``       the sweep's pace: batches of about 5 ms, resting five times as long;
- ``_listen``      Postgres: one connection per loop listening for announced outcomes;
- ``_console``     what the console reads, off the hot path;
- ``_attempts``    the ledger of attempts: its table, ``Attempt``, its statements and verbs;
- ``_chain``       the ledger's hash chain per scope: writing in order, the sweep's anchor, ``verify``;
- ``_store``       ``SQLStore``: the verbs;
- ``_protocols``   the interfaces.
"""

from ._attempts import Attempt, RecordDetail
from ._chain import ChainCheck
from ._protocols import AdminStore, ClaimStore, LedgerStore, StepStore, StepTransaction, Store
from ._schema import DONE, FAILED, RELEASED, RUNNING, STARTED, SUCCEEDED, Listing, Record, record_of
from ._store import SQLStore

__all__ = [
    "DONE",
    "FAILED",
    "RELEASED",
    "RUNNING",
    "STARTED",
    "SUCCEEDED",
    "AdminStore",
    "Attempt",
    "ChainCheck",
    "ClaimStore",
    "LedgerStore",
    "Listing",
    "Record",
    "RecordDetail",
    "SQLStore",
    "StepStore",
    "StepTransaction",
    "Store",
    "record_of",
]
