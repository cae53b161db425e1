"""The classic delay-queue protocol at POST /command: add, pop, finish and
delete jobs by id, each answered {"success", "error", "id", "value"}.

A job is a pgdq message: topic = queue, id = key, its payload the envelope
{"body": body, "ttr": TTR}, so that a pop leases it for its own TTR. Ids are
unique across topics, as that protocol requires: an add whose id another
topic holds is refused, and finish and delete find the id's topic
(dq_key_queues) unless the request names it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, JsonValue, StrictInt

from .. import AsyncDelivery
from ._access import CLASSIC_PATH, ApiError, authorize
from ._models import MAX_BATCH, MAX_WAIT, Body, Key, LeaseSeconds, Number, Seconds
from ._v1 import _at, _client, _queue, poll_waiting

DEFAULT_TTR = 60.0  # seconds a pop leases a job that names no TTR
Topic = Annotated[str, Field(min_length=1, max_length=100, description="the queue")]


class Add(Body):
    """Add a job (or replace the job of that id), due in delay seconds."""

    command: Literal["add"]
    topic: Topic
    id: Key
    delay: Seconds = 0
    TTR: LeaseSeconds = Field(DEFAULT_TTR, description="seconds a pop of this job leases it for")
    body: JsonValue = None


class Pop(Body):
    """Lease a due job of topic for its TTR (count: up to that many); wait: seconds to wait for one."""

    command: Literal["pop"]
    topic: Topic
    wait: Number = Field(0, ge=0, le=MAX_WAIT)
    count: StrictInt | None = Field(None, ge=1, le=MAX_BATCH, description="answer a list of up to count jobs")


class Finish(Body):
    """A popped job is done: remove it."""

    command: Literal["finish"]
    id: Key
    topic: Topic | None = Field(None, description="needed only if several topics hold the id")


class Delete(Body):
    """Remove a job, popped or not."""

    command: Literal["delete"]
    id: Key
    topic: Topic | None = Field(None, description="needed only if several topics hold the id")


Command = Annotated[Add | Pop | Finish | Delete, Field(discriminator="command")]


class Answer(BaseModel):
    """Every answer, success or not."""

    success: bool
    error: str | None = None
    id: str | None = None
    value: JsonValue = None


class Job(BaseModel):
    """One popped job (in a pop with count)."""

    id: str
    value: JsonValue
    TTR: float


ANSWERS: dict[int | str, dict[str, Any]] = {code: {"model": Answer} for code in (400, 401, 403, 404, 409, 413, 503)}
router = APIRouter(tags=["classic protocol"])


@router.post(CLASSIC_PATH, response_model=Answer, responses=ANSWERS)
async def command(request: Request, body: Command) -> Answer:
    """One command of the classic protocol: add, pop, finish or delete."""
    if isinstance(body, Add):
        return await _add(request, body)
    if isinstance(body, Pop):
        return await _pop(request, body)
    return await _remove(request, body)


async def _add(request: Request, job: Add) -> Answer:
    """Offer the job under an advisory lock on its id, refused if another topic holds the id."""
    authorize(request, "produce", job.topic)
    async with request.app.state.pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%s, 0))", (job.id,))
        elsewhere = [t for t in await _client(request).key_queues(job.id, conn=conn) if t != job.topic]
        if elsewhere:
            raise ApiError(409, f"id {job.id!r} is taken by topic {elsewhere[0]!r}; ids are unique across topics")
        due = _at(None, job.delay or None)  # no delay: due at the database's now
        outcome = await _queue(request, job.topic).offer(job.id, {"body": job.body, "ttr": job.TTR}, due, conn=conn)
    return Answer(success=True, id=job.id, value=outcome.value)


def _body_and_ttr(payload: Any) -> tuple[Any, float]:
    """A job's body and TTR from its envelope; a message offered otherwise is all body."""
    if isinstance(payload, dict) and payload.keys() == {"body", "ttr"} and isinstance(payload["ttr"], int | float):
        return payload["body"], float(payload["ttr"])
    return payload, DEFAULT_TTR


async def _pop(request: Request, pop: Pop) -> Answer:
    """Lease up to count jobs, each for its own TTR (a second statement for those not of the default)."""
    authorize(request, "consume", pop.topic)
    deliveries = await poll_waiting(request, pop.topic, pop.count or 1, DEFAULT_TTR, pop.wait)
    jobs = [await _lease_for_ttr(request, d) for d in deliveries]
    if pop.count is None:
        return Answer(success=True, id=jobs[0].id, value=jobs[0].value) if jobs else Answer(success=True)
    return Answer(success=True, value=[j.model_dump() for j in jobs])


async def _lease_for_ttr(request: Request, delivery: AsyncDelivery) -> Job:
    """The job of a delivery, its lease made its TTR long."""
    body, ttr = _body_and_ttr(delivery.raw_payload)
    if ttr != DEFAULT_TTR:
        await _client(request).extend(delivery.lock_token, ttr)
    return Job(id=delivery.key, value=body, TTR=ttr)


async def _remove(request: Request, job: Finish | Delete) -> Answer:
    """Delete the job of that id (finish: consume scope; delete: produce scope)."""
    topic = job.topic or await _topic_of(request, job.id)
    authorize(request, "consume" if isinstance(job, Finish) else "produce", topic)
    if not await _queue(request, topic).cancel(job.id):
        raise ApiError(404, f"no job of id {job.id!r} in topic {topic!r}")
    return Answer(success=True, id=job.id)


async def _topic_of(request: Request, job_id: str) -> str:
    """The one topic holding job_id: 404 if none, 409 if several."""
    topics = await _client(request).key_queues(job_id)
    if not topics:
        raise ApiError(404, f"no job of id {job_id!r}")
    if len(topics) > 1:
        raise ApiError(409, f"id {job_id!r} is in topics {', '.join(topics)}: name the topic")
    return topics[0]
