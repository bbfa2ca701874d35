"""Stores: one SQLAlchemy Core async store serves SQLite (embedded default) and Postgres (a fleet)."""

from ._sql import FAILED, RELEASED, RUNNING, SUCCEEDED, Listing, Record, SQLStore

__all__ = ["FAILED", "RELEASED", "RUNNING", "SUCCEEDED", "Listing", "Record", "SQLStore"]
