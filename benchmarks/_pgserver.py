"""A throwaway PostgreSQL cluster, started like ``scripts/test.sh`` does and removed on exit.

Unlike the test cluster it keeps ``fsync`` on by default, so the WAL flushes that durability costs can be
counted. Autovacuum is off so that nothing but the benchmark assigns transaction ids while they are counted.
The outage tests use it too, to stop and restart a real server under load.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _pg_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int("0" + "".join(filter(str.isdigit, p))))
    return Path(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """``with PgServer() as url:`` yields ``postgresql+asyncpg://agentguard@127.0.0.1:PORT/postgres``."""

    def __init__(self, *, fsync: bool = True) -> None:
        self.tmp: Path | None = None
        self.bin: Path | None = None
        self._as: list[str] = []
        self._fsync = fsync

    def _run(self, *args: str) -> None:
        assert self.bin is not None
        cmd = [*self._as, str(self.bin / args[0]), *args[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:1])} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> str:
        self.bin = _pg_bin()
        if self.bin is None or not (self.bin / "initdb").exists():
            raise RuntimeError("PostgreSQL's initdb/pg_ctl are not installed; install postgresql or pass --pg-url")
        self.tmp = Path(tempfile.mkdtemp(prefix="agentguard-bench-pg."))
        if os.geteuid() == 0:
            # initdb and pg_ctl refuse to run as root: use an unprivileged account.
            user = "postgres"
            if subprocess.run(["id", user], capture_output=True).returncode != 0:
                subprocess.run(["useradd", "--system", "--no-create-home", user], check=True)
            shutil.chown(self.tmp, user)
            self._as = ["runuser", "-u", user, "--"]
        port = _free_port()
        data = self.tmp / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "agentguard", "--no-sync")
        opts = (
            f"-p {port} -k {self.tmp} -c listen_addresses=127.0.0.1 -c max_connections=300"
            " -c shared_buffers=256MB -c autovacuum=off"
        )
        if not self._fsync:
            opts += " -c fsync=off -c full_page_writes=off"
        self._opts = opts
        self._run("pg_ctl", "-D", str(data), "-l", str(self.tmp / "log"), "-w", "-t", "60", "start", "-o", opts)
        return f"postgresql+asyncpg://agentguard@127.0.0.1:{port}/postgres"

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect every client, as a restart or failover does); keep its data."""
        assert self.tmp is not None
        self._run("pg_ctl", "-D", str(self.tmp / "data"), "-m", mode, "-w", "-t", "60", "stop")

    def start_server(self) -> None:
        """Start the stopped server again, on the same port with the same data."""
        assert self.tmp is not None
        self._run("pg_ctl", "-D", str(self.tmp / "data"), "-l", str(self.tmp / "log"), "-w", "-t", "60", "start",
                  "-o", self._opts)

    def stop(self) -> None:
        if self.tmp is None:
            return
        try:
            if (self.tmp / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.tmp / "data"), "-m", "immediate", "stop")
        except Exception:  # best effort: the directory goes anyway
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
