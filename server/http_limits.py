"""Bounds on reading a request: the size and count of its headers, and the time it takes to arrive.

uvicorn's httptools protocol (the one `pyfront serve` runs) has none of them: a request head of any size is
parsed before any middleware (the API key included) sees it, and httptools joins a header that arrives in
pieces with `bytes +=`, so the cost grows with the square of its size (a 64 MiB header stalled the event loop,
and /health, for seconds); and a connection that never finishes its request (headers dribbled a byte at a time,
a Content-Length larger than the body, a chunked body that never ends, or nothing at all) stays open forever.
uvicorn's `h11_max_incomplete_event_size` only applies to its h11 protocol, and its `timeout_keep_alive` only
to the idle time between requests.

`protocol_class(limits)` is uvicorn's `HttpToolsProtocol` with the three bounds:

- The request head (request line and headers) is fed to the parser at most `max_header_bytes` at a time: a
  head that has not ended by then is answered with 431 without parsing more of it, so the parser's work stays
  linear in the limit. (The bytes of a pipelined request that follow its predecessor's body in one read are
  parsed before the count starts; that read is bounded by the transport's buffer size.)
- A request with more than `max_header_count` headers gets 431 at the end of its head, before it is started.
- `request_read_timeout` seconds after a connection opens, or after a request's first byte on a kept-alive
  connection, the whole request (head and body) must have arrived: otherwise it gets 408 (or, when nothing
  of a request was sent or its response has started, the connection is just closed). The clock is stopped
  while the server itself has paused reading (flow control, pipelining): only the client's slowness counts.

Every refusal is an OpenAI error body (`{"error": {...}}`, as every route answers) with `Connection: close`,
and closes the connection; requests the parser cannot read get the same shape with 400 (uvicorn's is plain
text). The fast path costs a clock read per request and a length comparison per read (see the class).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass
from typing import Any, cast

import httptools
import msgspec
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl

from pyfront.server.access_log import AccessLine
from pyfront.server.config import ServerConfig
from pyfront.server.errors import error_body
from pyfront.server.http_cycle import DefaultHeaders, ResponseCycle, unverified_reason
from pyfront.server.http_direct import DirectCycle, DirectLane, direct_lane, has_proxy_headers, proxy_twin

logger = logging.getLogger("pyfront.server")

LINGER_S = 2.0
"""After a refusal, how long the connection stays half-open for the client to read the answer."""


@dataclass(frozen=True, slots=True)
class ReadLimits:
    max_header_bytes: int
    """The request line and headers, in bytes, CRLFs included."""
    max_header_count: int
    request_read_timeout: float
    """Seconds for a whole request to arrive; 0: no bound."""

    @classmethod
    def from_config(cls, config: ServerConfig) -> ReadLimits:
        return cls(config.max_header_bytes, config.max_header_count, config.request_read_timeout)


def local_address(info: Any) -> tuple[str, int | None] | None:
    """A `sockname` as uvicorn's `get_local_addr` makes it: (host, port) of an IP socket (IPv6's four fields cut
    to two), (path, None) of a unix socket."""
    if isinstance(info, tuple):
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


def remote_address(info: Any) -> tuple[str, int] | None:
    """A `peername` as uvicorn's `get_remote_addr` makes it: (host, port) of an IP peer; None for a unix socket's
    peer (an empty name) or none."""
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) else None


class _TooManyHeaders(Exception):
    """Raised from the parser's end-of-headers callback: it stops the parser before uvicorn starts the request
    (httptools re-raises it as the `__context__` of an HttpParserCallbackError)."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `limits` (set on the subclass `protocol_class` makes).

    The read clock is a deadline per request and at most one timer per connection, armed for the deadline and,
    when it fires early for a later request's deadline, armed again: a timer costs several microseconds with
    uvloop (a libuv handle each), a deadline one clock read, and keep-alive connections send many requests per
    timeout.
    """

    limits: ReadLimits
    access_line: AccessLine
    """The server's access logger (server/access_log.py), shared by its connections."""
    response_cycle: bool
    """Whether cycles are ResponseCycles (server/http_cycle.py: the installed uvicorn is one it was read against)."""
    direct: DirectLane | None
    """The fast lane's routes as the direct exchange answers them (server/http_direct.py); None: all go the ASGI way."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.response_cycle:
            self._connection_made(transport)
        else:
            super().connection_made(transport)
        self._default_headers = DefaultHeaders()
        self.access_logger = self.access_line  # type: ignore[assignment]  # uvicorn only calls its `info`
        self._in_head = True
        """Between the end of a request (or the connection's start) and the end of the next one's headers."""
        self._head_bytes = 0
        """Bytes of the current head fed to the parser so far."""
        self._heads_read = 0
        self._deadline: float | None = None
        """When the request being read must have arrived (loop time); None while no request is being read."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When `_timer` fires (loop time); it is never later than the deadline, and may be earlier."""
        self._idle = False
        """The deadline is the keep-alive timeout's: a response is complete and no request has begun."""
        self._discarding = False
        """Refused: what the client still sends is dropped until the connection closes."""
        self._direct = self.direct if self.limit_concurrency is None and not self.root_path else None
        """The direct lane, unless uvicorn is told to refuse requests over a limit or to serve under a root path."""
        self._access_client = f"{self.client[0]}:{self.client[1]:d}" if self.client else ""
        """The client in the access line (uvicorn's `get_client_addr`): the direct exchange's, made once."""
        self._proxy = proxy_twin(self.app) if self._direct is not None else None
        """What the direct exchange runs on a scope with proxy headers (server/http_direct.py)."""
        self._start_clock()  # a connection that never sends a request is closed too

    def _connection_made(self, transport: asyncio.Transport) -> None:
        """uvicorn's `connection_made` (0.55, checked with the response cycle: server/http_cycle.py) with the
        addresses read from the transport's `sockname` and `peername`.

        uvicorn asks for the transport's `socket` and calls its `getsockname` / `getpeername`; under uvloop the
        first such call builds a `socket.socket` from the descriptor, seven system calls (five `getsockname`, two
        `getpeername` per connection in an strace) and ~15 us of CPU per new connection against ~3.5 us this way,
        for the same values (the rules of uvicorn's `get_local_addr` / `get_remote_addr` below).
        """
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server = local_address(transport.get_extra_info("sockname"))
        self.client = remote_address(transport.get_extra_info("peername"))
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)
        self._tell_gone(self.cycle)

    @staticmethod
    def _tell_gone(cycle: RequestResponseCycle | None) -> None:
        """A cycle marked disconnected calls the application's callback (server/http_cycle.py), if it has one."""
        if isinstance(cycle, ResponseCycle) and cycle.disconnected:
            cycle.client_gone()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head fed at most `max_header_bytes` at a time and the refusals as JSON bodies."""
        if self._discarding:
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            if len(data) > self.limits.max_header_bytes - self._head_bytes:
                self._feed_bounded(data)
                return
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parser_stopped(exc)

    def _feed_bounded(self, data: bytes) -> None:
        """Feed `data`, whose head part may be over the limit: never more than the head's room at a time."""
        view = memoryview(data)
        limit = self.limits.max_header_bytes
        while self._in_head and len(view) > limit - self._head_bytes:
            room = limit - self._head_bytes
            self._head_bytes = limit
            heads_before = self._heads_read
            if not self._feed(view[:room]) or self.transport.is_closing():
                return
            if self._in_head and self._heads_read == heads_before:
                self._refuse(431, f"the request line and headers exceed the {limit}-byte limit")
                return
            view = view[room:]  # a head ended inside the part fed: the rest is body or the next request
        if self._in_head:
            self._head_bytes += len(view)
        self._feed(view)

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse `data`; False if the request was refused."""
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            return self._parser_stopped(exc)
        return True

    def _parser_stopped(self, exc: Exception) -> bool:
        """After the parser raised `exc`: refuse the request (False), or go on after an Upgrade request (True)."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self._deadline = None  # the connection is the WebSocket protocol's now
                self.handle_websocket_upgrade()
            # else the request is served as plain HTTP: pyfront runs uvicorn with ws="none" (it has no WebSocket
            # routes), and uvicorn's two warnings per such request would only let anyone fill the log
            return True
        if isinstance(exc, httptools.HttpParserCallbackError) and isinstance(exc.__context__, _TooManyHeaders):
            self._refuse(431, f"the request has more than {self.limits.max_header_count} headers")
        else:
            self._refuse(400, f"invalid HTTP request: {exc}")
        return False

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Every cycle uvicorn starts is a ResponseCycle (server/http_cycle.py), when that applies."""
        if self.response_cycle:
            cycle.__class__ = ResponseCycle
            cast(ResponseCycle, cycle).adopt(self._default_headers)
        super()._start_asgi_task(cycle, app)

    def _direct_cycle(self, direct: DirectLane, path: str) -> None:
        """Make the cycle of a request of the direct exchange (server/http_direct.py): uvicorn's end of headers
        (0.55, checked with the response cycle) for a POST to `path` with no cycle in progress and no concurrency
        limit. Its task starts once the body is in (`on_message_complete`), or now with a refusal from the lane's
        middleware."""
        scope = self.scope
        scope["method"] = "POST"
        http_version = self.parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = path
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        cycle = DirectCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        cycle.adopt(self._default_headers)
        cycle.adopt_direct(direct, self._access_client)
        if self._proxy is not None and has_proxy_headers(self.headers):
            cycle.proxy = self._proxy
        self.cycle = cycle
        cycle.refusal = direct.refusal(path, self.headers)
        if cycle.refusal is not None:
            self._start_direct(cycle)

    def _start_direct(self, cycle: DirectCycle) -> None:
        """uvicorn's `_start_asgi_task`, without its done callback (DirectCycle.run)."""
        cycle.started = True
        context = contextvars.Context() if self.config.reset_contextvars else None
        cycle.task = task = self.loop.create_task(cycle.run(self.tasks), context=context)
        self.tasks.add(task)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None or self._idle:  # else the clock runs from the connection's start
            self._idle = False
            self._start_clock()

    def on_headers_complete(self) -> None:
        """Counted here, not per header: the byte limit already bounds the parser's work on them."""
        if len(self.headers) > self.limits.max_header_count:
            raise _TooManyHeaders
        self._in_head = False
        self._heads_read += 1
        direct = self._direct
        if (
            direct is not None
            and (path := direct.paths.get(self.url)) is not None
            and self.parser.get_method() == b"POST"
            and (self.cycle is None or self.cycle.response_complete)  # else uvicorn queues it (pipelining)
            and not self.expect_100_continue
            and not self.parser.should_upgrade()
        ):
            self._direct_cycle(direct, path)
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is DirectCycle:
            if not cycle.started and not cycle.gather(body):
                self._start_direct(cycle)  # the body limit's 413, while the client is still sending
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is DirectCycle:
            if not cycle.started:
                cycle.more_body = False
                self._start_direct(cycle)
        else:
            super().on_message_complete()
        self._deadline = None
        self._in_head = True
        self._head_bytes = 0
        if cycle is not None and cycle.response_complete and not self.pipeline:  # answered before its body ended
            self._go_idle()

    def on_response_complete(self) -> None:
        """uvicorn's (0.55, checked with the response cycle), with its keep-alive timeout a deadline on the
        connection's one timer (`_go_idle`) instead of a timer armed after every response and cancelled by the
        next request: two timer handles a request, and uvicorn's check of the timer on every read.

        A connection idles from the end of a response until a request begins, when no request is being read
        (a client that sent its next request early is on the read clock), and is closed after uvicorn's
        `timeout_keep_alive` of idling, as uvicorn closes it.
        """
        if not self.response_cycle:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._deadline is None:
            self._go_idle()

    # ------------------------------------------------------------------ the clock: reads and keep-alive

    def _start_clock(self) -> None:
        timeout = self.limits.request_read_timeout
        if timeout > 0:
            self._set_deadline(timeout)
        else:
            self._deadline = None

    def _go_idle(self) -> None:
        self._idle = True
        self._set_deadline(self.timeout_keep_alive)

    def _set_deadline(self, timeout: float) -> None:
        """The deadline `timeout` s from now; the timer is armed again only if it would fire after it (a deadline
        later than the timer's leaves it: it fires early and is armed for the deadline then)."""
        self._deadline = deadline = self.loop.time() + timeout
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        self._timer = self.loop.call_at(at, self._check_deadline)
        self._timer_at = at

    def _check_deadline(self) -> None:
        self._timer = None
        if self._deadline is None or self.transport.is_closing():
            return  # no request is being read and none answered: the next deadline arms the timer again
        if self._idle or not self.flow.read_paused:
            if self.loop.time() < self._deadline:  # a later deadline than the one the timer was armed for
                self._arm(self._deadline)
            elif self._idle:
                self.transport.close()  # uvicorn's keep-alive timeout
            else:
                self._read_timed_out()
            return
        self._start_clock()  # the server is not reading (a pipelined request waits its turn): restart

    def _read_timed_out(self) -> None:
        if self._in_head and self._head_bytes == 0:
            self.transport.close()  # nothing of a request arrived: nothing to answer
            return
        self._refuse(408, f"the request was not received within {self.limits.request_read_timeout:g} s")

    # ------------------------------------------------------------------ refusals

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` with an OpenAI error body, then close the connection.

        If the request's own response has started, it is only closed; if an earlier (pipelined) request's response
        is still being sent, the answer follows it.

        A request whose headers were read has a cycle that the application may be reading from: it is marked
        disconnected first, so the application gets `http.disconnect` and its later sends are dropped.
        """
        self._deadline = None
        cycle = self.cycle
        if self._in_head or cycle is None:  # no cycle of this request yet; `cycle` is the previous request's
            if cycle is not None and not cycle.response_complete:
                # The previous (pipelined) request is still being answered: refuse after its response, whole.
                self._discarding = True
                answered = cycle.on_response

                def then_refuse() -> None:
                    answered()
                    self._refuse(status, message)

                cycle.on_response = then_refuse
                return
            writable = True
        else:
            writable = not cycle.response_started
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
                self._tell_gone(cycle)
        if writable and not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
            self.logger.warning("%srefused a request with %d: %s", client, status, message)
            body = msgspec.json.encode(error_body(status, message))
            head = [STATUS_LINE[status]]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body)]
            self.transport.write(b"".join(head) + b"connection: close\r\n\r\n" + body)
            self._close_lingering()
        else:
            self.transport.close()

    def _close_lingering(self) -> None:
        """Close after the client has had `LINGER_S` to read the answer, discarding what it still sends.

        Closing a socket with unread input makes the kernel send a reset, which can destroy the answer before
        the client reads it: a client still writing its 1 MiB header would see "connection reset" instead of
        the 431. So the write side is shut (the client sees the answer, then end of file) and input is read
        and dropped until the client closes or the time is up.
        """
        self._discarding = True
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def protocol_class(limits: ReadLimits, app: object = None) -> type[LimitedHttpToolsProtocol]:
    """The protocol for uvicorn's `http=`: uvicorn builds it with its own arguments, so the limits (and the
    server's access logger, and the direct lane of `app`, the application it serves) ride on a class."""
    reason = unverified_reason()
    if reason is not None:
        logger.warning("responses are written by uvicorn's own cycle: %s", reason)
    direct = direct_lane(app) if reason is None and app is not None else None
    attributes = {"limits": limits, "access_line": AccessLine(), "response_cycle": reason is None, "direct": direct}
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), attributes)
