"""Where a store is, for the ``agentguard`` command and for hints that name a command.

A store is named by ``--url``, by ``--config agentguard.toml`` (its ``[store]`` table: ``url`` and ``scope``,
read here with ``tomllib`` alone, so the command needs no ``mcp`` extra to read the proxy's config), else by
``$AGENTGUARD_URL``, else ``sqlite+aiosqlite:///agentguard.db``. A relative SQLite path in a config file is
relative to the file's folder, exactly as the proxy reads it, so ``agentguard ls --config`` lists what the
proxy recorded from wherever it is run.
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ._redact import redact_url

DEFAULT_URL = "sqlite+aiosqlite:///agentguard.db"
ENV_URL = "AGENTGUARD_URL"
_SQLITE = "sqlite+aiosqlite:///"


@dataclass(frozen=True, slots=True)
class StoreRef:
    """A store as the command line named it: its URL, the scope a config gave (else None), and the config
    file it came from (else None)."""

    url: str
    scope: str | None = None
    config: Path | None = None


def absolute_sqlite(url: str, base: Path) -> str:
    """``url`` with a relative SQLite file path made absolute against ``base`` (other URLs unchanged)."""
    if url.startswith(_SQLITE):
        path = url[len(_SQLITE):]
        db, sep, query = path.partition("?")
        if db and db != ":memory:" and not db.startswith("file:") and not Path(db).is_absolute():
            return f"{_SQLITE}{(base / db).resolve()}{sep}{query}"
    return url


def read_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> StoreRef:
    """The store of a proxy config file: its ``[store]`` ``url`` (relative SQLite paths against the file's
    folder; default ``$AGENTGUARD_URL``, else ``agentguard.db`` beside the file) and ``scope``.

    Raises ValueError naming the file and the problem. Other tables are the proxy's business: not read here.
    """
    environ = os.environ if environ is None else environ
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"no config file at {file}") from None
    except OSError as exc:
        raise ValueError(f"cannot read the config file {file}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{file} is not valid TOML: {exc}") from None
    store = data.get("store", {})
    if not isinstance(store, dict):
        raise ValueError(f"{file}: [store] must be a table")
    url, scope = store.get("url"), store.get("scope")
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ValueError(f"{file}: [store] url must be a non-empty string")
    if scope is not None and (not isinstance(scope, str) or not scope.strip()):
        raise ValueError(f"{file}: [store] scope must be a non-empty string")
    base = file.resolve().parent
    return StoreRef(absolute_sqlite(url or environ.get(ENV_URL) or DEFAULT_URL, base), scope, file.resolve())


def from_arguments(url: str | None, config: str | None, environ: Mapping[str, str] | None = None) -> StoreRef:
    """The store that ``--url`` or ``--config`` names, else ``$AGENTGUARD_URL``, else the default."""
    environ = os.environ if environ is None else environ
    if config is not None:
        return read_config(config, environ)
    return StoreRef(url or environ.get(ENV_URL) or DEFAULT_URL)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store URL (absolute, against the working directory); None for other backends.

    Raises ValueError for an in-memory SQLite URL: it exists only inside the process that opened it.
    """
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:  # malformed: the store reports it with the accepted forms
        return None
    if not u.drivername.startswith("sqlite"):
        return None
    db = u.database or ""
    if db in ("", ":memory:") or "mode=memory" in url:
        raise ValueError(f"{redact_url(url)} is an in-memory store: it exists only inside the process that "
                         "opened it, so there is nothing to read here; give the SQLite file's URL "
                         "(sqlite+aiosqlite:///path/to/file.db)")
    if db.startswith("file:"):  # a SQLite URI filename (?uri=true)
        db = db[len("file:"):].partition("?")[0]
    return Path(db).resolve()


def store_args(ref: StoreRef) -> str:
    """The options that point another ``agentguard`` command at the same store, for a hint a person can
    paste: ``--config /abs/agentguard.toml`` or ``--url '...'`` (a relative SQLite path made absolute, so the
    command works from any folder; a password shown as ``***``, to be put back by whoever pastes it)."""
    if ref.config is not None:
        return f"--config {shlex.quote(str(ref.config))}"
    return f"--url {shlex.quote(redact_url(absolute_sqlite(ref.url, Path.cwd())))}"


def resolve_command(url: str, key: str, scope: str, *, config: str | os.PathLike[str] | None = None) -> str:
    """The ``agentguard resolve`` command that settles operation ``key`` of ``scope`` in the store at
    ``url`` (or the one ``config`` names), for ``OutcomeUnknownError``'s message::

        agentguard resolve ag_3f... --scope acct_42 --url 'sqlite+aiosqlite:////srv/app/agentguard.db' \\
            --result JSON | --retry | --abandon
    """
    ref = StoreRef(url, scope, Path(config).resolve() if config is not None else None)
    return (f"agentguard resolve {shlex.quote(key)} --scope {shlex.quote(scope)} {store_args(ref)} "
            "--result JSON | --retry | --abandon")
