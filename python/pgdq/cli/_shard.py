"""`pgdq shard init`: route pgdq's functions over partitions with PL/Proxy."""

from __future__ import annotations

import click
import psycopg

from .._words import count as _count
from ..errors import InvalidArgument, PgdqError
from ..shard import init as init_router
from ._base import BadInput, _connect, _emit, _reason, json_option, schema_option


@click.group()
def shard() -> None:
    """Spread queues over several PostgreSQL servers (PL/Proxy)."""


@shard.command("init")
@click.option("--router", required=True, help="conninfo of the router database (PL/Proxy installed, not pgdq)")
@click.option(
    "--partitions",
    "partition_list",
    help="the partitions' conninfos, comma-separated, in order: 1, 2, 4, ... of them, pgdq installed on each",
)
@click.option("--partition", "partition_each", multiple=True, help="a partition's conninfo (one with a comma in it)")
@schema_option
@json_option
def init(router: str, partition_list: str | None, partition_each: tuple[str, ...], schema: str, as_json: bool) -> None:
    """Make the router database run pgdq's functions on the partition owning each queue.

    Numbers each partition's new messages so that lock tokens can be routed,
    then (re)creates the router's functions in one transaction. Run it again
    after upgrading pgdq on the partitions, or after restoring one from a dump:
    the foreign server's grants and user mappings are kept. Warns when a
    conninfo names a user (every role would act as that user on the partitions).
    """
    partitions = [p.strip() for p in (partition_list or "").split(",") if p.strip()] + list(partition_each)
    if not partitions:
        raise BadInput("give the partitions: --partitions DSN,DSN,... or --partition DSN (repeated)")
    with _connect(router) as conn:
        try:
            warnings = init_router(conn, partitions, schema)
        except InvalidArgument as e:
            raise BadInput(str(e)) from e
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"shard init failed: {_reason(e)}") from e
    for warning in warnings:
        click.echo(f"WARNING: {warning}", err=True)
    n = len(partitions)
    _emit(
        {"router": True, "partitions": n, "schema": schema, "warnings": warnings},
        as_json,
        lambda: click.echo(f"the router now runs pgdq's functions in schema {schema} on {_count(n, 'partition')}"),
    )
