"""A real PgBouncer (Debian's ``pgbouncer``) started in front of the test Postgres, on a free loopback port.

``bouncer(tmp_path, mode, pool_size)`` starts one for a test and stops it after; the store URL is the test's own
database through it. Skipped (with the reason) only where the binary is absent; scripts/test.sh installs it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

BINARY = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def bouncer(tmp_path: Path, store_url: str, mode: str, pool_size: int = 20) -> Iterator[str]:
    """PgBouncer in ``mode`` (``transaction`` or ``session``) with ``pool_size`` server connections per database
    and user, in front of ``store_url``'s server: yields ``store_url`` through it."""
    if BINARY is None:
        if os.environ.get("AGENTGUARD_REQUIRE_PGBOUNCER") == "1":  # (scripts/test.sh: installed, never skipped)
            pytest.fail("pgbouncer is not installed, and AGENTGUARD_REQUIRE_PGBOUNCER=1")
        pytest.skip("pgbouncer is not installed (Debian package pgbouncer; scripts/test.sh installs it)")
    u = make_url(store_url)
    port = _free_port()
    # PgBouncer refuses to run as root: then it runs as nobody, in a folder of its own (pytest's are private).
    user = "nobody" if os.getuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix=f"pgbouncer-{mode}-", dir=tmp_path if user is None else None))
    (folder / "users.txt").write_text(f'"{u.username}" ""\n')
    (folder / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={u.host} port={u.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / 'users.txt'}
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 1000
logfile = {folder / 'pgbouncer.log'}
pidfile = {folder / 'pgbouncer.pid'}
server_login_retry = 1
query_wait_timeout = 60
""")
    if user is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, pwd.getpwnam(user).pw_uid, -1)
    proc = subprocess.Popen([BINARY, str(folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, user=user)
    try:
        for _ in range(500):  # until it accepts connections
            if proc.poll() is not None:
                log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
                raise RuntimeError(f"pgbouncer exited ({proc.returncode}): {log[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("pgbouncer did not start listening")
        yield u.set(port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
