"""The delay-queue (ouqiang) dialect of the classic protocol: POST /push,
/pop, /finish and /delete, each answered {"code", "message", "data"} (code 0:
success; a failure: code 1, data null, with the HTTP status the service uses
elsewhere, in DELAY_QUEUE_PATHS' shape).

Every route is a thin translation onto the classic protocol's shared logic
(_classic.add_job, pop_jobs, remove_job): the same envelope, ids unique
across topics, TTR bounds, and scopes (produce: push, delete; consume: pop,
finish). A pop names topics separated by commas and waits for a job up to
POP_WAIT seconds (a long poll), then answers data null.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import AfterValidator, BaseModel, Field

from ._access import DELAY_QUEUE_PATHS
from ._classic import DEFAULT_TTR, AddId, Topic, TtrSeconds, add_job, pop_jobs, remove_job
from ._models import MAX_WAIT, Body, Key, Number, Seconds

PUSH, POP, FINISH, DELETE = DELAY_QUEUE_PATHS
POP_WAIT = MAX_WAIT  # seconds a pop waits for a job (delay-queue waits 178; shorter is safe for its clients)
MAX_TOPICS = 20  # topics one pop may name


def _topics(value: str) -> list[str]:
    """The topics a pop names, separated by commas, spaces around each trimmed."""
    return [name.strip() for name in value.split(",")]


def _topic_list(value: str) -> str:
    """value if it is 1 to MAX_TOPICS topic names separated by commas, each 1-100 characters."""
    names = _topics(value)
    if len(names) > MAX_TOPICS:
        raise ValueError(f"at most {MAX_TOPICS} topics, separated by commas")
    if any(not 1 <= len(n) <= 100 for n in names):
        raise ValueError("each topic, separated by commas, must have 1 to 100 characters")
    return value


def _one_topic(value: str) -> str:
    """value if it holds no comma (a pop could not name it)."""
    if "," in value:
        raise ValueError("a topic of these routes holds no comma (a pop separates topics with commas)")
    return value


class Push(Body):
    """Add a job (or replace the job of that id in its topic), due in delay seconds."""

    topic: Annotated[Topic, AfterValidator(_one_topic)]
    id: AddId
    delay: Seconds = 0
    ttr: TtrSeconds = DEFAULT_TTR
    body: str = ""


class Pop(Body):
    """Lease a ready job of the first of topics (comma separated) that has one, waiting up to timeout seconds."""

    topic: Annotated[str, AfterValidator(_topic_list), Field(description="topics, separated by commas")]
    timeout: Number = Field(POP_WAIT, ge=0, le=MAX_WAIT, description="pgdq's own: seconds to wait for a job")


class Remove(Body):
    """Remove the job of that id (finish: it is done; delete: at any time)."""

    id: Key


class Job(BaseModel):
    id: str
    body: str


class Answer(BaseModel):
    """Every answer: code 0 on success, else 1 with a message and data null."""

    code: int = 0
    message: str = "ok"
    data: Job | None = None


ANSWERS: dict[int | str, dict[str, Any]] = {code: {"model": Answer} for code in (400, 401, 403, 409, 413, 503)}
router = APIRouter(tags=["delay-queue (ouqiang) dialect"], responses=ANSWERS)


@router.post(PUSH, response_model=Answer)
async def push(request: Request, job: Push) -> Answer:
    """Add a job (produce scope); 409 if another topic holds its id."""
    await add_job(request, job.topic, job.id, job.delay, job.ttr, job.body)
    return Answer(message="added")


@router.post(POP, response_model=Answer)
async def pop(request: Request, body: Pop) -> Answer:
    """Lease one ready job for its TTR (consume scope on every topic); none within timeout: data null."""
    jobs = await pop_jobs(request, _topics(body.topic), 1, body.timeout)
    if not jobs:
        return Answer()
    text = jobs[0].value if isinstance(jobs[0].value, str) else json.dumps(jobs[0].value)
    return Answer(data=Job(id=jobs[0].id, body=text))


@router.post(FINISH, response_model=Answer)
async def finish(request: Request, body: Remove) -> Answer:
    """A popped job is done: delete it (consume scope); code 0 whether or not it was there."""
    return await _remove(request, body.id, "consume")


@router.post(DELETE, response_model=Answer)
async def delete(request: Request, body: Remove) -> Answer:
    """Delete a job at any time (produce scope); code 0 whether or not it was there."""
    return await _remove(request, body.id, "produce")


async def _remove(request: Request, job_id: str, scope: str) -> Answer:
    """Delete the job of job_id as delay-queue does: success even if there was none."""
    await remove_job(request, job_id, None, scope)
    return Answer()
