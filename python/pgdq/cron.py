"""Recurring messages from Python: CronService (blocking, a daemon thread per
schedule) and AsyncCronService (an asyncio task per schedule).

A schedule is a plan (pgdq._cron_plans): a key prefix, a config hash derived
from its whole configuration, how often to run, and a generator of (time,
payload) occurrences ahead of now. Each run installs them with
dq_cron_install, so an occurrence is one message with an occurrence key:
however many processes run the same schedule, each occurrence exists once; a
changed configuration (a new hash) replaces the old one's pending
occurrences; restarting with the same one creates nothing new. The first run
may update occurrences (can_update true), later runs only add (false), as
the SQL API intends (docs/sql-reference.md).

    cron = CronService(Queue("reports", pool))
    cron.install_cron("daily-report", "0 2 * * *", "Europe/Bucharest", {"kind": "daily"})

AsyncCronService is written in pgdq/_async_cron.py; CronService is generated
from it (pgdq/_sync_cron.py). Schedules stored in the database, which need no
Python process, are Queue.schedule (dq_schedule).
"""

from ._async_cron import RETRY_CAP, AsyncCronHandle, AsyncCronService
from ._cron_plans import EPOCH, Generator, Occurrences, Plan, config_hash, cron_plan, daily_plan, periodic_plan
from ._sync_cron import CronHandle, CronService

__all__ = [
    "EPOCH",
    "RETRY_CAP",
    "AsyncCronHandle",
    "AsyncCronService",
    "CronHandle",
    "CronService",
    "Generator",
    "Occurrences",
    "Plan",
    "config_hash",
    "cron_plan",
    "daily_plan",
    "periodic_plan",
]
