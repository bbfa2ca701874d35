"""Stores: one SQLAlchemy Core async store serves SQLite (embedded default) and Postgres (a fleet)."""

from ._sql import DONE, FAILED, RELEASED, RUNNING, STARTED, SUCCEEDED, Listing, Record, SQLStore

__all__ = ["DONE", "FAILED", "RELEASED", "RUNNING", "STARTED", "SUCCEEDED", "Listing", "Record", "SQLStore"]
