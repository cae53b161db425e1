"""The JSON API's managing routes under /v1: dead letters (list, redrive,
purge), schedules kept by the database and channels' limits, one SQL
function each. Reading needs consume on the queue; changing needs admin."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from ..model import DeadLetterStats
from ._access import ApiError, authorize
from ._models import (
    MAX_BATCH,
    ChannelIn,
    ChannelOut,
    DeadLetterOut,
    Done,
    NextAt,
    PurgeIn,
    PurgeOut,
    RedriveIn,
    RedriveOut,
    ScheduleIn,
    ScheduleOut,
)
from ._v1 import ERRORS, QueueName, SegmentRoute, _at, _client, _queue, _wire, wire_time

router = APIRouter(prefix="/v1", responses=ERRORS, tags=["manage"], route_class=SegmentRoute)
ScheduleName = Annotated[str, Path(min_length=1, max_length=100, description="the schedule")]
ChannelName = Annotated[str, Path(min_length=1, max_length=100, description="the channel")]


@router.get("/queues/{queue}/dead-letters", response_model=list[DeadLetterOut])
async def dead_letters(
    request: Request, queue: QueueName, max: Annotated[int, Query(ge=1, le=MAX_BATCH)] = 100
) -> list[DeadLetterOut]:
    """Up to max dead letters of the queue, oldest failure first (dq_dead_list)."""
    authorize(request, "consume", queue)
    return [_wire(DeadLetterOut, d) for d in await _queue(request, queue).dead_letters(max)]


@router.post("/queues/{queue}/dead-letters/redrive", response_model=RedriveOut)
async def redrive(request: Request, queue: QueueName, body: RedriveIn) -> RedriveOut:
    """Offer the dead letters (key's only, if given) again, fresh (dq_dead_redrive)."""
    authorize(request, "admin", queue)
    due = _at(body.at, body.delay)
    return RedriveOut(redriven=await _queue(request, queue).redrive(body.key, due))


@router.post("/queues/{queue}/dead-letters/purge", response_model=PurgeOut)
async def purge(request: Request, queue: QueueName, body: PurgeIn) -> PurgeOut:
    """Delete key's dead letter, or every one with "all": true (dq_dead_purge)."""
    authorize(request, "admin", queue)
    return PurgeOut(purged=await _queue(request, queue).purge_dead_letters(body.key))


@router.get("/dead-letters", response_model=list[DeadLetterStats])
async def dead_stats(request: Request) -> list[DeadLetterStats]:
    """Every queue's dead-letter count (dq_dead_stats); admin on every queue."""
    authorize(request, "admin", None)
    return await _client(request).dead_stats()


@router.get("/queues/{queue}/schedules", response_model=list[ScheduleOut])
async def schedules(request: Request, queue: QueueName) -> list[ScheduleOut]:
    """The queue's schedules with their next occurrence (dq_schedules)."""
    authorize(request, "consume", queue)
    found = await _queue(request, queue).schedules()
    return [_wire(ScheduleOut, s).model_copy(update={"next_at": wire_time(s.next_at)}) for s in found]


@router.put("/queues/{queue}/schedules/{name}", response_model=NextAt)
async def set_schedule(request: Request, queue: QueueName, name: ScheduleName, body: ScheduleIn) -> NextAt:
    """Create or replace a schedule (dq_schedule_set); its next occurrence."""
    authorize(request, "admin", queue)
    q = _queue(request, queue)
    next_at = await q.schedule(name, body.expression, body.timezone, body.payload, max_missed=body.max_missed)
    return NextAt(next_at=next_at)


@router.delete("/queues/{queue}/schedules/{name}", response_model=Done)
async def remove_schedule(request: Request, queue: QueueName, name: ScheduleName) -> Done:
    """Remove a schedule and its pending occurrences (dq_schedule_remove); 404 if none."""
    authorize(request, "admin", queue)
    if not await _queue(request, queue).unschedule(name):
        raise ApiError(404, f"no schedule {name!r} in queue {queue!r}")
    return Done()


@router.get("/queues/{queue}/channels", response_model=list[ChannelOut])
async def channels(request: Request, queue: QueueName) -> list[ChannelOut]:
    """The queue's channels with limits or messages (dq_channels)."""
    authorize(request, "consume", queue)
    found = await _queue(request, queue).channels()
    return [
        ChannelOut(
            **{f: getattr(c, f) for f in ChannelOut.model_fields if f != "min_interval"},
            min_interval=c.min_interval.total_seconds() if c.min_interval is not None else None,
        )
        for c in found
    ]


@router.put("/queues/{queue}/channels/{channel}", response_model=Done)
async def set_channel(request: Request, queue: QueueName, channel: ChannelName, body: ChannelIn) -> Done:
    """Set a channel's limits, replacing earlier ones (dq_channel_set)."""
    authorize(request, "admin", queue)
    await _queue(request, queue).set_channel(
        channel, max_concurrency=body.max_concurrency, min_interval=body.min_interval
    )
    return Done()


@router.delete("/queues/{queue}/channels/{channel}", response_model=Done)
async def remove_channel(request: Request, queue: QueueName, channel: ChannelName) -> Done:
    """Drop a channel's limits, its messages stay (dq_channel_remove); 404 if it had none."""
    authorize(request, "admin", queue)
    if not await _queue(request, queue).remove_channel(channel):
        raise ApiError(404, f"channel {channel!r} of queue {queue!r} has no limits")
    return Done()
