"""pgdq: a delayed-message queue inside PostgreSQL.

Queue (blocking) and AsyncQueue (asyncio) wrap the SQL API of one queue;
Client and AsyncClient what belongs to no one queue (lock tokens, every
queue's stats and schedules). Each method is one statement calling a dq_*
function. Worker consumes queues with handlers (pgdq.worker).
"""

from ._async_queue import AsyncClient, AsyncDelivery, AsyncQueue
from ._sync_queue import Client, Delivery, Queue
from ._version import VERSION
from .codec import Codec, JsonCodec
from .cron import AsyncCronService, CronService
from .errors import (
    AlreadyInstalled,
    InvalidArgument,
    NullArgument,
    PayloadDecodeError,
    PgdqError,
    SqlMissing,
    StaleToken,
)
from .install import install, uninstall
from .model import (
    ChannelInfo,
    DeadCount,
    DeadLetter,
    DeadLetterStats,
    DeliveryInfo,
    DueHour,
    HistoryBucket,
    HistoryRecord,
    Message,
    MessageInfo,
    OfferOutcome,
    OfferResult,
    PeekedMessage,
    QueueStats,
    Schedule,
)
from .worker import Backoff, HandlerTimeout, Retry, Route, Worker, handler, lease_lost

__version__ = VERSION

__all__ = [
    "AlreadyInstalled",
    "AsyncClient",
    "AsyncDelivery",
    "AsyncCronService",
    "AsyncQueue",
    "Backoff",
    "ChannelInfo",
    "Client",
    "Codec",
    "CronService",
    "DeadLetter",
    "DeadCount",
    "DeadLetterStats",
    "Delivery",
    "DeliveryInfo",
    "DueHour",
    "HandlerTimeout",
    "HistoryBucket",
    "HistoryRecord",
    "InvalidArgument",
    "JsonCodec",
    "Message",
    "MessageInfo",
    "NullArgument",
    "OfferOutcome",
    "OfferResult",
    "PayloadDecodeError",
    "PeekedMessage",
    "PgdqError",
    "Queue",
    "QueueStats",
    "Retry",
    "Route",
    "Schedule",
    "SqlMissing",
    "StaleToken",
    "Worker",
    "handler",
    "install",
    "lease_lost",
    "uninstall",
]
