"""A primary and a synchronous streaming standby, as an operator sets them up
(initdb, pg_basebackup, pg_ctl), started and stopped by the failover test.

The primary acknowledges a commit only once the standby has flushed it
(synchronous_standby_names names the standby, synchronous_commit on). The
primary can be SIGKILLed with every one of its processes, and the standby
promoted, which then commits alone (it names no synchronous standby)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from http_server import free_port

BINDIR = Path("/usr/lib/postgresql/15/bin")
STANDBY_NAME = "pgdq_standby"


def as_postgres(*command: str) -> list[str]:
    """command, run as user postgres when we are root (initdb and the server refuse root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.getuid() == 0 else list(command)


class Node:
    """One server of the pair: its data directory, socket directory and port."""

    def __init__(self, base: Path, name: str) -> None:
        self.data = base / name
        self.run = base / f"{name}-run"
        self.port = free_port()
        self.log = base / f"{name}.log"

    def conninfo(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user="postgres")

    def configure(self, *lines: str) -> None:
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n".join(
                    [f"port = {self.port}", "listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{self.run}'"]
                    + list(lines)
                )
                + "\n"
            )

    def pg_ctl(self, *args: str) -> None:
        command = as_postgres(
            str(BINDIR / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", *args
        )
        subprocess.run(command, check=True, cwd="/", stdout=subprocess.DEVNULL)

    def running(self) -> bool:
        status = as_postgres(str(BINDIR / "pg_ctl"), "-D", str(self.data), "status")
        done = subprocess.run(status, check=False, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return done.returncode == 0

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started (the machine is gone)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], check=False, capture_output=True, text=True
        ).stdout.split()
        for pid in [postmaster, *map(int, children)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Pair:
    """A primary and its synchronous standby in a directory of their own."""

    def __init__(self, dbname: str, synchronous: bool = True) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="pgdq-ha-", dir="/tmp"))
        self.primary, self.standby = Node(self.base, "primary"), Node(self.base, "standby")
        for directory in (self.primary.run, self.standby.run):
            directory.mkdir()
        if os.getuid() == 0:
            self.base.chmod(0o755)
            subprocess.run(["chown", "-R", "postgres:postgres", str(self.base)], check=True)
        initdb = [str(BINDIR / "initdb"), "-D", str(self.primary.data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
        subprocess.run(as_postgres(*initdb, "--locale=C.UTF-8"), check=True, cwd="/", stdout=subprocess.DEVNULL)
        self.primary.configure("synchronous_commit = on", "wal_level = replica")
        self.primary.pg_ctl("start")
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {dbname}")
            self._start_standby()
            if synchronous:  # from now on a commit waits for the standby (before, it would have waited forever)
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
        self.wait_for_state("sync" if synchronous else "async")

    def _start_standby(self) -> None:
        """pg_basebackup of the primary, streaming under STANDBY_NAME, naming no standby of its own."""
        source = f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        backup = [
            str(BINDIR / "pg_basebackup"),
            "-D",
            str(self.standby.data),
            "-d",
            source,
            "-X",
            "stream",
            "-R",
            "-c",
            "fast",
        ]
        subprocess.run(as_postgres(*backup), check=True, cwd="/")
        self.standby.configure()
        with (self.standby.data / "postgresql.auto.conf").open("a") as auto:  # -R's settings live here
            auto.write(f"primary_conninfo = '{source}'\n")
        self.standby.pg_ctl("start")

    def wait_for_state(self, state: str) -> None:
        """Wait until the standby streams in state (sync or async)."""
        deadline = time.monotonic() + 30
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            while time.monotonic() < deadline:
                if conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone() == (state,):
                    return
                time.sleep(0.1)
        raise AssertionError(f"the standby never streamed in state {state}")

    def signal_receiver(self, sig: signal.Signals) -> None:
        """Signal the standby's WAL receiver: SIGSTOP, and it falls behind (an
        asynchronous standby only); then SIGKILL, and what it had not yet read is gone."""
        postmaster = (self.standby.data / "postmaster.pid").read_text().split()[0]
        found = subprocess.run(
            ["pgrep", "-P", postmaster, "-f", "walreceiver"], check=False, capture_output=True, text=True
        )
        for pid in found.stdout.split():
            os.kill(int(pid), sig)

    def conninfo(self, dbname: str) -> str:
        """Both servers, the one that accepts writes wins: how clients reach the pair."""
        hosts = "127.0.0.1,127.0.0.1"
        ports = f"{self.primary.port},{self.standby.port}"
        return (
            f"host={hosts} port={ports} dbname={dbname} user=postgres target_session_attrs=read-write connect_timeout=2"
        )

    def stop(self) -> None:
        for node in (self.standby, self.primary):
            if node.running():
                node.pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(self.base, ignore_errors=True)
