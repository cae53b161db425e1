"""A real PgBouncer (Debian's) in transaction pooling mode in front of the
test cluster, started and stopped by the tests that need it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from http_server import free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """pgbouncer (pool_mode transaction, trust) listening on 127.0.0.1, forwarding every database to PG*'s server."""

    def __init__(self, pool_size: int = 4) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pgdq-pgbouncer-", dir="/tmp"))
        self.port = free_port()
        user = os.environ.get("PGUSER", "postgres")
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={os.environ['PGHOST']} port={os.environ['PGPORT']}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 200\n"
            f"logfile = {self.dir}/pgbouncer.log\npidfile = {self.dir}/pgbouncer.pid\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        command = [BINARY, str(self.dir / "pgbouncer.ini")]
        if os.getuid() == 0:  # pgbouncer refuses root, like initdb
            self.dir.chmod(0o755)
            shutil.chown(self.dir, "postgres")
            for f in self.dir.iterdir():
                shutil.chown(f, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.process = subprocess.Popen(command, cwd="/", stderr=subprocess.PIPE, text=True)
        self._wait_until_up()

    def conninfo(self, dbname: str) -> str:
        """A conninfo of dbname through this PgBouncer."""
        user = os.environ.get("PGUSER", "postgres")
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=user)

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stderr.read() if self.process.stderr else "exited"
            try:
                with psycopg.connect(self.conninfo("postgres"), connect_timeout=2) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise AssertionError(f"pgbouncer did not start: {(self.dir / 'pgbouncer.log').read_text()}")

    def stop(self) -> None:
        """Stop it and remove its directory."""
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
