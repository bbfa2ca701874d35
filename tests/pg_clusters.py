"""Throwaway PostgreSQL clusters of the test's own (``tests/stores/test_failover.py``): a primary made by ``initdb``
and a streaming standby made from it by ``pg_basebackup``, each on a free loopback port, started and stopped with
``pg_ctl`` as ``scripts/test.sh`` starts its server (as the ``postgres`` account when run as root: initdb and pg_ctl
refuse root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks._pgserver import _free_port as free_port
from benchmarks._pgserver import _pg_bin as bindir

USER = "agentguard"  # the clusters' superuser (trust authentication on loopback)


class Cluster:
    """One cluster: its data directory under ``root`` and its port."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.data, self.port = root, root / name, free_port()

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self, *settings: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off " + " ".join(
            f"-c {s}" for s in settings)
        _run("pg_ctl", "-D", str(self.data), "-l", str(self.data) + ".log", "-w", "-t", "60", "start", "-o",
             options)

    def promote(self) -> None:
        _run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def crash(self) -> None:
        """Stop at once, as a machine lost: no checkpoint, no goodbye to clients or standbys."""
        _run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        subprocess.run(_as_pg(str(_bin() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"),
                       capture_output=True, timeout=60, check=False)

    def log(self) -> str:
        path = Path(str(self.data) + ".log")
        return path.read_text(errors="replace") if path.exists() else ""


def make_pair(*primary_settings: str) -> tuple[Cluster, Cluster]:
    """A running primary (with ``primary_settings``) and a hot standby streaming from it."""
    root = Path(tempfile.mkdtemp(prefix="agentguard-clusters."))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    primary, standby = Cluster(root, "primary"), Cluster(root, "standby")
    try:
        _run("initdb", "-D", str(primary.data), "-A", "trust", "-U", USER, "--no-sync")
        primary.start("wal_level=replica", "max_wal_senders=4", *primary_settings)
        # -R: the standby's primary_conninfo and standby.signal
        _run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream", "-c", "fast", "-h", "127.0.0.1",
             "-p", str(primary.port), "-U", USER, "--no-sync")
        standby.start("hot_standby=on")
    except BaseException:
        remove(primary, standby)
        raise
    return primary, standby


def remove(*clusters: Cluster) -> None:
    for c in clusters:
        c.stop()
    if clusters:
        shutil.rmtree(clusters[0].root, ignore_errors=True)


def _bin() -> Path:
    found = bindir()
    if found is None or not (found / "pg_basebackup").exists():
        raise RuntimeError("PostgreSQL's initdb/pg_basebackup/pg_ctl are not installed")
    return found


def _as_pg(*argv: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


def _run(tool: str, *args: str) -> None:
    done = subprocess.run(_as_pg(str(_bin() / tool), *args), capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
