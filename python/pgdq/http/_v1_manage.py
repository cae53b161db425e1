"""The JSON API's managing routes under /v1: dead letters (list, redrive,
purge), schedules kept by the database, channels' limits, pausing and
resuming, and history (retention, records, per-bucket stats), one SQL
function each. Reading needs consume on the queue; changing needs admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    HistoryBucketOut,
    HistoryOut,
    NextAt,
    PauseOut,
    PurgeIn,
    PurgeOut,
    RedriveIn,
    RedriveOut,
    RetentionIn,
    RetentionOut,
    ScheduleIn,
    ScheduleOut,
    Time,
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
            min_interval=_seconds(c.min_interval),
        )
        for c in found
    ]


def _seconds(span: timedelta | None) -> float | None:
    """A duration for JSON: seconds, or None."""
    return None if span is None else span.total_seconds()


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


@router.post("/queues/{queue}/pause", response_model=PauseOut)
async def pause(request: Request, queue: QueueName) -> PauseOut:
    """Pause the queue: polls lease nothing from it until resumed (dq_pause)."""
    authorize(request, "admin", queue)
    return PauseOut(paused=True, changed=await _queue(request, queue).pause())


@router.post("/queues/{queue}/resume", response_model=PauseOut)
async def resume(request: Request, queue: QueueName) -> PauseOut:
    """Resume a paused queue, waking its waiting polls (dq_resume)."""
    authorize(request, "admin", queue)
    return PauseOut(paused=False, changed=await _queue(request, queue).resume())


@router.put("/queues/{queue}/retention", response_model=RetentionOut)
async def retain(request: Request, queue: QueueName, body: RetentionIn) -> RetentionOut:
    """Keep a record of each message that leaves the queue for keep seconds, or stop with null (dq_retain)."""
    authorize(request, "admin", queue)
    await _queue(request, queue).retain(body.keep)
    return RetentionOut(keep=body.keep)


@router.get("/queues/{queue}/history", response_model=list[HistoryOut])
async def history(
    request: Request,
    queue: QueueName,
    key: Annotated[str | None, Query(min_length=1, max_length=200, description="only this key's records")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_BATCH)] = 100,
) -> list[HistoryOut]:
    """Up to limit records of messages that left the queue (key's only), newest finish first (dq_history)."""
    authorize(request, "consume", queue)
    return [_wire(HistoryOut, r) for r in await _queue(request, queue).history(key, limit)]


@router.get("/queues/{queue}/history/stats", response_model=list[HistoryBucketOut])
async def history_stats(
    request: Request,
    queue: QueueName,
    since: Annotated[
        Time | None, Query(description="RFC 3339: from the bucket holding it (default: an hour ago)")
    ] = None,
    bucket: Annotated[
        float, Query(ge=1, le=86400, description="whole seconds (at most 10,000 buckets up to now)")
    ] = 60,
) -> list[HistoryBucketOut]:
    """The queue's records per bucket, oldest first: outcomes, lateness and run-time percentiles (dq_history_stats)."""
    authorize(request, "consume", queue)
    start = since if since is not None else datetime.now(UTC) - timedelta(hours=1)
    found = await _queue(request, queue).history_stats(start, bucket)
    return [
        HistoryBucketOut(
            bucket_at=b.bucket_at,
            acked=b.acked,
            dead=b.dead,
            cancelled=b.cancelled,
            lateness_p50=_seconds(b.lateness_p50),
            lateness_p99=_seconds(b.lateness_p99),
            run_p50=_seconds(b.run_p50),
            run_p99=_seconds(b.run_p99),
        )
        for b in found
    ]
