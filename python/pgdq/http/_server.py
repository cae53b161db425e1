"""The HTTP parser `pgdq serve` runs by default: uvicorn's httptools protocol
(about a third less server CPU a request than h11 on the 2 vCPU machine of
bench/RESULTS.md, "W9: a leaner hot path") with the bound h11 has on a
request head: one still unfinished after MAX_HEAD bytes gets 400 and the
connection closes (httptools alone would buffer megabytes of it). A whole
head over MAX_HEAD read at once passes here and gets 431 from the app
(_middleware.HeadLimit), with either parser."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._middleware import MAX_HEAD  # bytes of a request head that may wait unparsed (a slow or endless head: 400)


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
            self.send_400_response(f"the request head is over {MAX_HEAD} bytes")

    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._ends = False, 0, self._ends + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._ends = True, self._ends + 1  # what follows is the next request's head
        super().on_message_complete()
