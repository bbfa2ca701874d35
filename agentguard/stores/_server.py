"""What a Postgres server and the store's role allow, asked of the server itself: whether it takes writes (a hot
standby in recovery, a read-only default), which of the store's objects are missing, and which privileges the
role lacks on those that exist. Names resolve through the session's search path, as the store's statements
resolve them (never through ``current_schema()``, which names the first schema of the path that exists, not the
one the tables are in).

The schema's creation asks them first (:func:`prepare`): a standby is refused before any body, what is missing
is made only if it is missing, so a role that owns nothing, or may create nothing, works on a schema someone else
made (``agentguard migrate --sql``), and a role that may not write what a call writes is refused before the first
body rather than at its completion.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from ._attempts import ATTEMPTS, KEYS, KEYS_TRIGGER
from ._chain import CHAINS
from ._schema import OLD_TASK_INDEX, STEPS, TABLE, TASK_INDEX, TASK_REPLACEMENT, Replacement, create_schema

log = logging.getLogger("agentguard")

# The column a store made by an earlier version may lack (``_statements.WATCHED_DDL``).
WATCHED = "watched"
# What the store's verbs do to each table: the records and steps are claimed, completed, released and swept;
# the ledger's entries are written (COPY: INSERT), read and swept. The ledger's ids come from its sequence.
PRIVILEGES = {
    TABLE: ("SELECT", "INSERT", "UPDATE", "DELETE"),
    STEPS: ("SELECT", "INSERT", "UPDATE", "DELETE"),
    ATTEMPTS: ("SELECT", "INSERT", "DELETE"),
    CHAINS: ("SELECT", "INSERT", "UPDATE", "DELETE"),  # each scope's head, moved by every batch and sweep
    # a deleted record's key (the records' trigger writes it, in the deleting role's name), swept with the ledger
    KEYS: ("SELECT", "INSERT", "UPDATE", "DELETE"),
}
SEQUENCE = (ATTEMPTS, "id")  # the table and column whose sequence numbers the ledger's entries


async def read_only(conn: AsyncConnection) -> str | None:
    """Why the server takes no writes, or None if it does."""
    standby, default = tuple((await conn.exec_driver_sql(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")).one())
    if standby:
        return ("the server is a hot standby in recovery: point the store's URL at the primary (or list every host,"
                " with target_session_attrs=read-write)")
    if default == "on":
        return "default_transaction_read_only is on for this database or role"
    return None


async def missing_objects(conn: AsyncConnection) -> list[str]:
    """The store's tables (and the columns and the trigger an earlier version lacks) that the search path does not
    find."""
    names = (TABLE, STEPS, ATTEMPTS, CHAINS, KEYS)
    columns = ((TABLE, WATCHED), (ATTEMPTS, "seq"))
    found = tuple((await conn.exec_driver_sql(
        "SELECT " + ", ".join(f"to_regclass('{name}') IS NOT NULL" for name in names) + "".join(
            f", EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{table}')"
            f" AND attname = '{column}' AND NOT attisdropped)" for table, column in columns)
        + f", EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('{TABLE}') AND tgname = '{KEYS_TRIGGER}')"
    )).one())
    tables, there = dict(zip(names, found, strict=False)), found[len(names):]
    missing = [f"table {name}" for name, ok in tables.items() if not ok]
    missing += [f"column {table}.{column}" for (table, column), ok in zip(columns, there, strict=False)
                if tables[table] and not ok]
    if tables[TABLE] and not there[-1]:
        missing.append(f"trigger {KEYS_TRIGGER} on {TABLE}")
    return missing


async def outdated(conn: AsyncConnection, index: Replacement) -> bool:
    """Whether the store has the index ``index`` replaces, or lacks the new one (valid: a concurrent build
    interrupted leaves it invalid)."""
    return bool((await conn.exec_driver_sql(
        f"SELECT to_regclass('{index.old}') IS NOT NULL OR NOT COALESCE((SELECT indisvalid FROM pg_index"
        f" WHERE indexrelid = to_regclass('{index.name}')), false)")).scalar())


async def replace_index(conn: AsyncConnection, index: Replacement) -> bool:
    """On ``conn`` (autocommit): the new index built without blocking writes (``CONCURRENTLY``; one left invalid by
    an interrupted build is dropped and built again), then the one it replaces dropped so too. Whether anything was
    done (nothing, on a store made with it)."""
    if not await outdated(conn, index):
        return False
    valid = f"SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('{index.name}')"
    if (await conn.exec_driver_sql(valid)).scalar() is False:
        await conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
    await conn.exec_driver_sql(index.create(concurrently=True))
    await conn.exec_driver_sql(index.drop_old(concurrently=True))
    return True


async def missing_privileges(conn: AsyncConnection) -> list[str]:
    """The privileges the session's role lacks on the store's objects that exist, each as ``PRIVILEGE on
    OBJECT`` (what ``GRANT`` names); empty if it has them all (a superuser, the owner, or granted)."""
    checks = [(f"{privilege} on table {table}",
               f"has_table_privilege(to_regclass('{table}'), '{privilege}')", f"to_regclass('{table}') IS NULL")
              for table, privileges in PRIVILEGES.items() for privilege in privileges]
    table, column = SEQUENCE
    sequence = f"pg_get_serial_sequence(CAST(to_regclass('{table}') AS text), '{column}')"
    checks.append((f"USAGE on sequence {table}_{column}_seq", f"has_sequence_privilege({sequence}, 'USAGE')",
                   f"to_regclass('{table}') IS NULL OR {sequence} IS NULL"))
    row = (await conn.exec_driver_sql(
        "SELECT " + ", ".join(f"CASE WHEN {absent} THEN true ELSE {has} END" for _, has, absent in checks))).one()
    return [what for (what, _, _), has in zip(checks, row, strict=True) if not has]


def grants(role: str) -> list[str]:
    """The statements that give ``role`` what every call needs on a schema someone else made (``PRIVILEGES``);
    ``role`` is quoted as an identifier."""
    who = '"' + role.replace('"', '""') + '"'
    table, column = SEQUENCE
    return [f"GRANT {', '.join(privileges)} ON {name} TO {who}" for name, privileges in PRIVILEGES.items()] + [
        f"GRANT USAGE ON SEQUENCE {table}_{column}_seq TO {who}"]


async def current_role(conn: AsyncConnection) -> str:
    return str((await conn.exec_driver_sql("SELECT current_user")).scalar())


# SQLSTATE insufficient_privilege: no CREATE on the schema, or not the owner of a table to alter.
_NOT_ALLOWED = "42501"


async def prepare(conn: AsyncConnection, begin: str, lock: str | None, more: Sequence[str],
                  upgrade: Callable[[AsyncConnection], Awaitable[None]] | None = None) -> None:
    """Make the store usable on ``conn`` (autocommit) or refuse, before any body: refused on a server that takes no
    writes; the missing objects made (``_schema.create_schema``; ``begin`` must read committed, so that a worker
    that waited for ``lock`` sees the tables made meanwhile); refused if the role may not make them or lacks a
    privilege a call needs (a completion refused after the body ran would leave the claim for a takeover)."""
    reason = await read_only(conn)
    if reason:
        raise StoreError(f"the store is read-only: {reason}")
    missing = await missing_objects(conn)
    if missing:
        try:
            await create_schema(conn, begin, lock, more, upgrade)
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != _NOT_ALLOWED:
                raise
            raise StoreError(
                f"the role {await current_role(conn)} may not create the store's {', '.join(missing)} "
                f"({str(exc.orig).strip().splitlines()[0]}): have an administrator run the DDL that "
                "`agentguard migrate --sql` prints, or use a role that may create tables") from None
    elif await outdated(conn, TASK_REPLACEMENT):
        # Never built here: a build that blocks writes would hold every worker's completions and renewals for as
        # long as it takes, their leases running out meanwhile.
        log.warning("the store's records have the task index of an earlier version (%s, the scope first), through "
                    "which Postgres may read a whole scope for one record: run `agentguard migrate` to replace it "
                    "with %s (built without blocking writes)", OLD_TASK_INDEX, TASK_INDEX)
    lacking = await missing_privileges(conn)
    if lacking:
        raise StoreError(f"the role {await current_role(conn)} lacks privileges every call needs: "
                         f"{'; '.join(lacking)} (GRANT them, or `agentguard migrate --sql --grant ROLE` prints the "
                         "statements)")
