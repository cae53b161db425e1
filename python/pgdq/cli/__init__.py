"""The `pgdq` command.

Installing: install, upgrade, uninstall, version. Messages: offer (one, or
JSON Lines), peek, poll, ack, nack, cancel, purge, stats, channels. Queues:
pause, resume, retain (history on or off), history. channel set|remove;
dead-letters list|redrive|purge; schedules list|set|remove (kept by the
database); worker; serve (HTTP) and token new; shard init (PL/Proxy).

Every command takes --dsn (else PGDQ_DSN, DATABASE_URL or the PG* variables),
--schema (else PGDQ_SCHEMA, else public) and --json (machine-readable output;
for worker: log lines as JSON objects). Tables go to a terminal; into a pipe
the same rows go as tab-separated lines (no title, no header; a tab, line
break or backslash inside a value is written \\t, \\n, \\r or \\\\), so what
one command prints (a lock token, a key) can be pasted into the next whole.

Exit codes: 0 done, 1 an error the message explains (pgdq's or the
server's, or no connection), 2 bad usage (bad arguments, an argument pgdq
refuses, a malformed --dsn or an unusable --schema), 3 pgdq not installed in
the schema (any command that needs it), 4 nothing there to act on: some lock
tokens were stale (ack, nack), no message of the key or id (cancel), no schedule
of the name (schedules remove), no limits on the channel (channel remove).
"""

from __future__ import annotations

import click

from .. import __version__
from ._base import whole_summaries
from ._manage import (
    cancel,
    channel,
    channels,
    dead_letters,
    history,
    pause,
    peek,
    purge,
    resume,
    retain,
    schedules,
    stats,
)
from ._messages import ack, nack, offer, poll
from ._serve import serve, token
from ._setup import install, uninstall, upgrade, version, worker
from ._shard import shard


@click.group()
@click.version_option(__version__, prog_name="pgdq")
def main() -> None:
    """pgdq: a delayed-message queue inside PostgreSQL.

    Every command takes --dsn (else PGDQ_DSN, DATABASE_URL or PG*), --schema
    (else PGDQ_SCHEMA, else public) and --json. Into a pipe, tables become
    tab-separated lines. Exit codes: 0 done, 1 error, 2 bad usage, 3 pgdq not
    installed, 4 nothing to act on (stale token, no such key or schedule).
    """


COMMANDS = (
    install,
    upgrade,
    uninstall,
    version,
    worker,
    serve,
    offer,
    poll,
    ack,
    nack,
    peek,
    cancel,
    purge,
    stats,
    channels,
    pause,
    resume,
    retain,
    history,
)
for command in (*COMMANDS, channel, dead_letters, schedules, token, shard):
    main.add_command(command)
whole_summaries(main)  # `pgdq --help` lists each command's first sentence whole, never cut with "..."
