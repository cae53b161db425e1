"""pgdq: a delayed-message queue inside PostgreSQL.

Queue (blocking) and AsyncQueue (asyncio) wrap the SQL API of one queue; each
method is one statement calling a dq_* function. Worker consumes queues with
handlers (pgdq.worker).
"""

from ._async_queue import AsyncDelivery, AsyncQueue
from ._sync_queue import Delivery, Queue
from ._version import VERSION
from .codec import Codec, JsonCodec
from .cron import AsyncCronService, CronService
from .errors import AlreadyInstalled, InvalidArgument, NullArgument, PayloadDecodeError, PgdqError, StaleToken
from .install import install, uninstall
from .model import DeadLetter, Message, MessageInfo, OfferOutcome, OfferResult, QueueStats, Schedule
from .worker import Backoff, HandlerTimeout, Retry, Route, Worker, handler, lease_lost

__version__ = VERSION

__all__ = [
    "AlreadyInstalled",
    "AsyncDelivery",
    "AsyncCronService",
    "AsyncQueue",
    "Backoff",
    "Codec",
    "CronService",
    "DeadLetter",
    "Delivery",
    "HandlerTimeout",
    "InvalidArgument",
    "JsonCodec",
    "Message",
    "MessageInfo",
    "NullArgument",
    "OfferOutcome",
    "OfferResult",
    "PayloadDecodeError",
    "PgdqError",
    "Queue",
    "QueueStats",
    "Retry",
    "Route",
    "Schedule",
    "StaleToken",
    "Worker",
    "handler",
    "install",
    "lease_lost",
    "uninstall",
]
