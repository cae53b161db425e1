"""Payload codecs: how Python values become jsonb and come back.

The default codec takes any JSON-serialisable value, dataclass instances and
pydantic models; given a payload_type it decodes into that type.

Before any codec, psycopg reads jsonb into Python values; a value Python's
json module cannot read (a number of more than 4300 digits, nesting past the
interpreter's recursion limit) comes back as UnreadableJson instead of
failing the whole read (tolerate_unreadable_json), so one such message
spoils only itself.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

from .errors import InvalidArgument


class Codec(Protocol):
    """Turns payloads into JSON text and JSON values back into payloads."""

    def dumps(self, value: Any) -> str:
        """JSON text for value; raise InvalidArgument if it has none."""
        ...

    def load(self, value: Any) -> Any:
        """The payload for a JSON value decoded from jsonb."""
        ...


def dumps_array(codec: Codec, values: Sequence[Any]) -> str:
    """One JSON array document of values, as offer_many sends a batch's
    payloads: the codec's own dumps_array when it has one."""
    encode_all = getattr(codec, "dumps_array", None)
    if callable(encode_all):
        return str(encode_all(values))
    return "[" + ",".join(map(codec.dumps, values)) + "]"


def _plain(value: Any) -> Any:
    """JSON-ready form of dataclasses and pydantic models (json.dumps default)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class JsonCodec:
    """The default codec: JSON values, dataclasses, pydantic models.

    With payload_type set, loaded payloads become that type: a pydantic model
    (model_validate) or a dataclass (keyword arguments from a JSON object);
    a value that does not fit raises (for a dataclass: TypeError, a value
    other than an object or null included). JSON null stays None for a
    dataclass, as in 1.0 (cron occurrences have a null payload by default).
    """

    def __init__(self, payload_type: type[Any] | None = None) -> None:
        self.payload_type = payload_type

    def dumps(self, value: Any) -> str:
        try:
            return json.dumps(value, default=_plain, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"payload is not JSON serialisable: {e}") from e

    def dumps_array(self, values: Sequence[Any]) -> str:
        """One JSON array of values, encoded in one call (batches)."""
        return self.dumps(list(values))

    def load(self, value: Any) -> Any:
        target = self.payload_type
        if target is None:
            return value
        validate = getattr(target, "model_validate", None)
        if callable(validate):
            return validate(value)
        if dataclasses.is_dataclass(target):
            if value is None:
                return None
            if not isinstance(value, dict):
                raise TypeError(f"{target.__name__} needs a JSON object, got {type(value).__name__}")
            return target(**value)
        return value


class UnreadableJson(str):
    """A stored JSON value that Python's json module cannot read (a number of
    more than 4300 digits, nesting past the recursion limit): its JSON text
    as stored, a str; error is why it could not be read. pgdq's reads return
    it in place of the value (raw_payload, state, headers), so that one such
    value spoils its own message (its decode_error), never the read."""

    error: BaseException

    def __new__(cls, text: str, error: BaseException) -> UnreadableJson:
        made = super().__new__(cls, text)
        made.error = error
        return made


@cache
def _tolerant(base: type[Loader]) -> type[Loader]:
    """A subclass of the json/jsonb loader base whose load answers
    UnreadableJson where base's load raises (user-set loads functions kept)."""

    def load(self: Loader, data: Buffer) -> Any:
        try:
            return base.load(self, data)
        except (ValueError, RecursionError) as e:  # json's errors, the int digits limit, bad UTF-8
            return UnreadableJson(bytes(data).decode("utf-8", "replace"), e)

    return type(f"Tolerant{base.__name__}", (base,), {"load": load, "tolerant": True})


def tolerate_unreadable_json(context: AdaptContext) -> None:
    """Make json and jsonb values read through context (a cursor: its own
    adapters) that Python cannot read come back as UnreadableJson."""
    adapters = context.adapters
    for name in ("json", "jsonb"):
        oid = adapters.types[name].oid
        base = adapters.get_loader(oid, Format.TEXT)
        if base is not None and not getattr(base, "tolerant", False):
            adapters.register_loader(oid, _tolerant(base))
