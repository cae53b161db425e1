"""The HTTP parsers `pgdq serve` runs: by default uvicorn's httptools protocol
(about a third less server CPU a request than h11 on the 2 vCPU machine of
bench/RESULTS.md, "W9: a leaner hot path") with the bound h11 has on a
request head: one still unfinished after MAX_HEAD bytes is refused and the
connection closes (httptools alone would buffer megabytes of it); or h11's,
which has that bound. Either refusal is the JSON 431 that a whole head over
MAX_HEAD, read at once, gets from the app (_middleware.HeadLimit), not
uvicorn's 400 text/plain (head_refusal)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._access import error_response
from ._guard import HEADERS, NO_STORE, STATIC_PREFIX
from ._middleware import MAX_HEAD  # bytes of a request head that may wait unparsed (a slow or endless head: 431)

HEAD_TOO_LARGE = f"the request head is over {MAX_HEAD} bytes"  # as HeadLimit says it


def head_refusal(target: bytes, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The answer to a head refused while it arrived, as sent: the JSON 431 that HeadLimit gives a
    whole one (error_response for target's path, uvicorn's default headers, the guard's), and
    connection: close (the rest of the head is never read). target: the request target as far as
    it was read (b"" if not yet)."""
    path = unquote(target.split(b"?", 1)[0].decode("latin-1"))
    body = bytes(error_response(path, 431, HEAD_TOO_LARGE).body)
    guard = HEADERS if path.startswith(STATIC_PREFIX) else NO_STORE
    headers = [
        *default_headers,
        (b"content-length", str(len(body)).encode()),
        (b"content-type", b"application/json"),
        *((name.encode(), value.encode()) for name, value in guard.items()),
        (b"connection", b"close"),
    ]
    lines = [b"HTTP/1.1 431 Request Header Fields Too Large"] + [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools, a request head refused once MAX_HEAD bytes of it were read without its end.

    Counted: each chunk read wholly inside one head (open before it, from the
    connection's start or the end of the previous request, and still open after
    it, no head or request ending within it); so the count never exceeds the
    head's true size (no head within the bound is refused), and falls short of
    it by at most the part of one chunk a head began in after the previous
    request's end (the bytes held stay bounded)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head, self._head_bytes, self._ends = True, 0, 0

    def data_received(self, data: bytes) -> None:
        """Parse data; refuse the head if it is still open past MAX_HEAD bytes."""
        counted, ends = self._in_head, self._ends
        super().data_received(data)
        if not self._in_head or self.parser is None or self.transport.is_closing():
            return
        if counted and self._ends == ends:
            self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD:
            self.logger.warning("a request head over %d bytes was refused", MAX_HEAD)
            self.transport.write(head_refusal(self.url, self.server_state.default_headers))
            self.transport.close()

    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._ends = False, 0, self._ends + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._ends = True, self._ends + 1  # what follows is the next request's head
        super().on_message_complete()


class BoundedH11Protocol(H11Protocol):
    """h11 (bounded to MAX_HEAD by h11_max_incomplete_event_size), a head refused for its size
    answered as BoundedHttpToolsProtocol does (h11 raises its RemoteProtocolError hinting 431; uvicorn
    answers every such error 400 text/plain): its own buffer, unparsed, is then over MAX_HEAD."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request h11 could not parse, or head_refusal for one over MAX_HEAD."""
        unparsed, _ = self.conn.trailing_data
        if len(unparsed) <= MAX_HEAD:
            super().send_400_response(msg)
            return
        request_line = unparsed.split(b"\r\n", 1)[0].split(b" ")
        target = request_line[1] if len(request_line) > 1 else b""
        self.transport.write(head_refusal(target, self.server_state.default_headers))
        self.transport.close()
