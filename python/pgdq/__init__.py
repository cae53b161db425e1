"""pgdq: a delayed-message queue inside PostgreSQL.

Queue (blocking) and AsyncQueue (asyncio) wrap the SQL API of one queue; each
method is one statement calling a dq_* function.
"""

from ._async_queue import AsyncDelivery, AsyncQueue
from ._sync_queue import Delivery, Queue
from .codec import Codec, JsonCodec
from .errors import AlreadyInstalled, InvalidArgument, NullArgument, PgdqError, StaleToken
from .install import install, uninstall
from .model import Message, MessageInfo, OfferOutcome, OfferResult, QueueStats

__version__ = "1.0.0"

__all__ = [
    "AlreadyInstalled",
    "AsyncDelivery",
    "AsyncQueue",
    "Codec",
    "Delivery",
    "InvalidArgument",
    "JsonCodec",
    "Message",
    "MessageInfo",
    "NullArgument",
    "OfferOutcome",
    "OfferResult",
    "PgdqError",
    "Queue",
    "QueueStats",
    "StaleToken",
    "install",
    "uninstall",
]
