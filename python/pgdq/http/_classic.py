"""The classic delay-queue protocol at POST /command: add, pop, finish and
delete jobs by id, each answered {"success", "error", "id", "value"}.

A job is a pgdq message: topic = queue, id = key, its payload the envelope
{"body": body, "ttr": TTR}, so that a pop leases it for its own TTR (1 s to
a day; a bad envelope: DEFAULT_TTR). Ids are unique across topics, as that
protocol requires: an add whose id another topic holds is refused, and
finish and delete find the id's topic (dq_key_queues) unless the request
names it, among the topics the caller's token may act on only, after 401
and 403: no answer tells whether an id exists in a topic the caller may not
touch, or names such a topic.

A message with no key (sent, 1.2), or whose key starts with "#" (offered
otherwise: no add may use such an id), is popped as "#ID@TOPIC" (its
message id and topic), and finish and delete of that form delete that
message by id (finish: dq_finish_id, recorded acked as a keyed finish is;
delete: dq_cancel_id) and nothing else.

add_job, pop_jobs and remove_job are the protocol's logic, shared with its
delay-queue dialect (_delay_queue.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import psycopg
from fastapi import APIRouter, Request
from pydantic import AfterValidator, BaseModel, Field, JsonValue, StrictInt, TypeAdapter, ValidationError

from .. import AsyncDelivery, AsyncQueue
from ..errors import PgdqError
from ._access import CLASSIC_PATH, ApiError, authenticate, authorize
from ._auth import Token
from ._models import MAX_BATCH, MAX_DEPTH, MAX_WAIT, Body, Key, Number, Seconds, shallow
from ._v1 import _at, _client, _queue, poll_waiting

log = logging.getLogger("pgdq.http")

DEFAULT_TTR = 60.0  # seconds a pop leases a job that names no TTR (or a TTR no add accepts)
MIN_TTR, MAX_TTR = 1, 86400  # seconds: a TTR shorter than a second or longer than a day is refused
Topic = Annotated[str, Field(min_length=1, max_length=100, description="the queue")]
TtrSeconds = Annotated[Number, Field(ge=MIN_TTR, le=MAX_TTR, description="seconds a pop leases the job for")]
_TTR = TypeAdapter(TtrSeconds)
# a job's body: its envelope (one level more) is a payload the service can hand out again
JobBody = Annotated[JsonValue, AfterValidator(lambda body: shallow(body, MAX_DEPTH - 1))]


BY_ID = "#"  # the first character of an id a pop hands out for a message by its id: "#ID@TOPIC"
_BY_ID = re.compile(r"#([0-9]{1,19})@(.+)", re.DOTALL)


def _keyed(value: str) -> str:
    """value, unless it has the form a pop gives a message by its id."""
    if value.startswith(BY_ID):
        raise ValueError(f"ids starting with {BY_ID!r} are reserved: a pop names a message without a key so")
    return value


AddId = Annotated[Key, AfterValidator(_keyed)]


class Add(Body):
    """Add a job (or replace the job of that id), due in delay seconds."""

    command: Literal["add"]
    topic: Topic
    id: AddId
    delay: Seconds = 0
    TTR: TtrSeconds = DEFAULT_TTR
    body: JobBody = None


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
        outcome = await add_job(request, body.topic, body.id, body.delay, body.TTR, body.body)
        return Answer(success=True, id=body.id, value=outcome)
    if isinstance(body, Pop):
        jobs = await pop_jobs(request, [body.topic], body.count or 1, body.wait)
        if body.count is not None:
            return Answer(success=True, value=[j.model_dump() for j in jobs])
        return Answer(success=True, id=jobs[0].id, value=jobs[0].value) if jobs else Answer(success=True)
    if not await remove_job(request, body.id, body.topic, "consume" if isinstance(body, Finish) else "produce"):
        raise ApiError(404, f"no job of id {body.id!r}")
    return Answer(success=True, id=body.id)


# What the classic protocol and its dialects (_delay_queue.py) share: one place each.


async def add_job(request: Request, topic: str, job_id: str, delay: float, ttr: float, body: JsonValue) -> str:
    """Offer the job under an advisory lock on its id (produce scope); its outcome
    (created, updated); 409 if another topic holds the id, naming none."""
    authorize(request, "produce", topic)
    async with request.app.state.pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%s, 0))", (job_id,))
        if any(t != topic for t in await _client(request).key_queues(job_id, conn=conn)):
            raise ApiError(409, f"id {job_id!r} is taken by another topic; ids are unique across topics")
        due = _at(None, delay or None)  # no delay: due at the database's now
        outcome = await _queue(request, topic).offer(job_id, {"body": body, "ttr": ttr}, due, conn=conn)
    return str(outcome.value)


async def pop_jobs(request: Request, topics: Sequence[str], count: int, wait: float) -> list[Job]:
    """Lease up to count jobs of the first of topics that has any (consume scope on
    each), each for its own TTR; wait up to wait seconds for one."""
    for topic in topics:
        authorize(request, "consume", topic)
    deliveries = await poll_waiting(request, topics, count, DEFAULT_TTR, wait)
    return [await _lease_for_ttr(request, d) for d in deliveries]


def _body_and_ttr(payload: Any) -> tuple[Any, float]:
    """A job's body and TTR from its envelope (a TTR no add accepts: DEFAULT_TTR);
    a message offered otherwise is all body."""
    if not (isinstance(payload, dict) and payload.keys() == {"body", "ttr"}):
        return payload, DEFAULT_TTR
    try:
        return payload["body"], float(_TTR.validate_python(payload["ttr"]))
    except ValidationError:
        log.warning("a job's envelope has a TTR no add accepts (%.60r): leased for %s s", payload["ttr"], DEFAULT_TTR)
        return payload["body"], DEFAULT_TTR


async def _lease_for_ttr(request: Request, delivery: AsyncDelivery) -> Job:
    """The job of a delivery, its lease made its TTR long; if that fails, the job
    keeps the poll's lease (DEFAULT_TTR): one job's failure is never its batch's."""
    body, ttr = _body_and_ttr(delivery.raw_payload)
    if ttr != DEFAULT_TTR:
        try:
            if await _client(request).extend(delivery.lock_token, ttr) is None:
                ttr = DEFAULT_TTR
        except (PgdqError, psycopg.Error) as e:
            log.warning("cannot lease job %r for its TTR %s s: %s", delivery.key, ttr, e)
            ttr = DEFAULT_TTR
    return Job(id=_job_id(delivery), value=body, TTR=ttr)


def _job_id(delivery: AsyncDelivery) -> str:
    """The id a pop hands out: the key, or "#ID@TOPIC" for a message without one (or
    with a key of that reserved form), which finish and delete read back (_by_id)."""
    if delivery.key is not None and not delivery.key.startswith(BY_ID):
        return delivery.key
    return f"{BY_ID}{delivery.id}@{delivery.queue}"


def _by_id(job_id: str) -> tuple[int, str] | None:
    """The message id and topic of an id a pop handed out by message id; None for a key."""
    found = _BY_ID.fullmatch(job_id)
    return (int(found[1]), found[2]) if found else None


async def remove_job(request: Request, job_id: str, topic: str | None, scope: str) -> bool:
    """Delete the job of job_id from topic, else from the one topic holding it that the
    caller may act on in scope; False if there is none. 401 and 403 come before any
    lookup, and an id in a topic the caller may not touch is as absent as a missing one.
    An id of the form "#ID@TOPIC" (_job_id) deletes message ID of TOPIC only."""
    by_id = _by_id(job_id)
    if topic is not None:
        authorize(request, scope, topic)
        if by_id is not None:
            return by_id[1] == topic and await _remove_id(_queue(request, topic), by_id[0], scope)
        return await _remove(_queue(request, topic), job_id, scope)
    token = authenticate(request)
    if token is not None and not token.scopes & {scope, "admin"}:
        raise ApiError(403, f"token {token.name!r} has no {scope} scope")
    if by_id is not None:
        may = token is None or token.allows(scope, by_id[1])
        return may and await _remove_id(_queue(request, by_id[1]), by_id[0], scope)
    topic = await _topic_of(request, job_id, token, scope)
    return topic is not None and await _remove(_queue(request, topic), job_id, scope)


async def _remove(queue: AsyncQueue, job_id: str, scope: str) -> bool:
    """Delete job_id from queue: a finish (consume scope) as done, recorded acked; a delete cancelled."""
    return await (queue.finish(job_id) if scope == "consume" else queue.cancel(job_id))


async def _remove_id(queue: AsyncQueue, id: int, scope: str) -> bool:
    """Delete message id of queue, as _remove does a key's (dq_finish_id, dq_cancel_id)."""
    return await (queue.finish_id(id) if scope == "consume" else queue.cancel_id(id))


async def _topic_of(request: Request, job_id: str, token: Token | None, scope: str) -> str | None:
    """The one topic holding job_id that token may act on in scope (None: no such
    topic); 409 if several, naming only those."""
    topics = [t for t in await _client(request).key_queues(job_id) if token is None or token.allows(scope, t)]
    if len(topics) > 1:
        raise ApiError(409, f"id {job_id!r} is in topics {', '.join(topics)}: name the topic")
    return topics[0] if topics else None
