"""Writing a response: uvicorn's request/response cycle, with a response of known length written in one piece.

uvicorn's ``RequestResponseCycle.send`` writes the status line and headers as soon as ``http.response.start``
arrives, and the body with ``http.response.body``: two socket writes (two system calls, two TCP segments) for
every non-streamed answer, and two regex searches for every header, the server's own ``date`` and ``server``
included. A short completion request is a few hundred microseconds of CPU, of which those are a measurable part
(peers.py's sequential row writes ~1 KB per request).

:class:`ResponseCycle` sends the same bytes in fewer steps:

- a response that declares its ``content-length`` (and is not to a HEAD request, nor empty) has its head held
  back and written together with its body, which in ASGI is the very next message. If the application breaks
  the protocol there (a wrong message, a body longer than declared), the head is written before the error, as
  uvicorn would have; if it fails before sending any body, uvicorn closes the connection, and the client, which
  would have had a head and no body, has neither;
- a chunked response whose start carries :data:`~pyfront.server.extensions.HOLD_HEAD` (streamed answers: the
  application sends its first body message, an event or an empty one, within a bound of its own) has its head
  written with that first body message too: a short streamed answer is then one write after the admission less;
- the server's default headers (``date``, ``server``), which uvicorn builds itself, are encoded and checked
  once per list uvicorn makes (it makes a new one when the date changes, once a second), unless one of them is
  a header the cycle acts on (``content-length``, ``transfer-encoding``, ``connection``);
- everything else, the checks, the errors and their words, the ``connection`` and ``transfer-encoding``
  handling, the access line and the body accounting, is uvicorn's own code path, restated.

It also tells the application at once when the client goes away (:meth:`DisconnectWatch.when_disconnected`, offered
in the scope's extensions: server/extensions.py), instead of only as the next ``receive`` message.

The protocol (server/http_limits.py) gives every cycle this class before its task starts, when the installed
uvicorn is a release this class was read against (:data:`VERIFIED_UVICORN`); with another, it logs why and
leaves uvicorn's cycle as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
    get_client_addr,
    get_path_with_query_string,
)

from pyfront.server.extensions import DISCONNECT, HOLD_HEAD, Disconnect

VERIFIED_UVICORN = ("0.55.",)
"""uvicorn releases whose ``RequestResponseCycle.send`` was read line by line against :class:`ResponseCycle`."""


def unverified_reason() -> str | None:
    """Why the installed uvicorn's cycle is left as it is (None: :class:`ResponseCycle` applies)."""
    if not uvicorn.__version__.startswith(VERIFIED_UVICORN):
        return f"uvicorn {uvicorn.__version__} is not a release the response cycle was checked against"
    return None


_ACTED_ON = frozenset({b"content-length", b"transfer-encoding", b"connection"})


class DefaultHeaders:
    """The server's default header list as bytes, encoded and checked once per list object uvicorn makes."""

    __slots__ = ("encoded", "source")

    def __init__(self) -> None:
        self.source: list[tuple[bytes, bytes]] | None = None
        self.encoded: bytes | None = None

    def get(self, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """The list's bytes; None when it holds a header the cycle acts on (then it goes with the response's)."""
        if headers is not self.source:
            content: list[bytes] = []
            acted_on = False
            for name, value in headers:
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
                acted_on = acted_on or name.lower() in _ACTED_ON
                content += [name.lower(), b": ", value, b"\r\n"]
            self.encoded = None if acted_on else b"".join(content)
            self.source = headers
        return self.encoded


class DisconnectWatch:
    """What the :data:`DISCONNECT` extension calls: ``when_disconnected(callback)`` has ``callback()`` called once, at
    once, if the client goes away before the response is complete (None: stop).

    What the fast lane needs of a non-streamed request: without it, it has a task wait for the ``http.disconnect``
    message (server/api/lane.py), a task and two event-loop steps per request.

    A separate object, not a method of the cycle: the extension lives in the cycle's scope, so a bound method of the
    cycle there made every request a reference cycle (cycle -> scope -> extension -> method -> cycle). The cycle, its
    scope and headers then waited for the garbage collector instead of going when the request ended, and every such
    request brought the next collection closer.
    """

    __slots__ = ("callback", "gone")

    def __init__(self) -> None:
        self.callback: Callable[[], object] | None = None
        self.gone = False

    def when_disconnected(self, callback: Callable[[], object] | None) -> None:
        self.callback = callback
        if callback is not None and self.gone:
            self.client_gone()

    def client_gone(self) -> None:
        self.gone = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class ResponseCycle(RequestResponseCycle):
    """uvicorn's ``RequestResponseCycle``; only ``send`` differs (see the module docstring). An instance is uvicorn's
    own cycle given this class, with :meth:`adopt` setting the attributes it adds."""

    _held_head: bytes | None
    _defaults: DefaultHeaders
    _watch: DisconnectWatch

    def adopt(self, defaults: DefaultHeaders) -> None:
        self._held_head = None
        self._defaults = defaults
        self._watch = watch = DisconnectWatch()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[DISCONNECT] = Disconnect(when_disconnected=watch.when_disconnected)

    def client_gone(self) -> None:
        """The protocol's word that the client went away (``disconnected`` is set)."""
        self._watch.client_gone()

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()

        if self.disconnected:
            return

        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            head = self._head(message["status"], message.get("headers", ()))
            if self.chunked_encoding is False and self.expected_content_length > 0 and self.scope["method"] != "HEAD":
                self._held_head = head  # written with the body, the next message
            elif self.chunked_encoding and message.get(HOLD_HEAD):
                self._held_head = head  # written with the first body message, whenever the application sends it
            else:
                self.transport.write(head)

        elif not self.response_complete:
            if message["type"] != "http.response.body":
                self._write_held_head()
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                chunk = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
                if not more_body:
                    chunk.append(b"0\r\n\r\n")
                held = self._held_head
                if held is not None:
                    self._held_head = None
                    chunk.insert(0, held)
                if chunk:
                    self.transport.write(b"".join(chunk))
            else:
                num_bytes = len(body)
                if num_bytes > self.expected_content_length:
                    self._write_held_head()
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= num_bytes
                held = self._held_head
                if held is not None:
                    self._held_head = None
                    self.transport.write(held + body)
                else:
                    self.transport.write(body)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self._complete()

        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

    async def send_json(self, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
        """What `send` writes for a 200 with `content-length`, `content-type: application/json` and the `extra`
        headers, then `body` ending the response: the same bytes in one write, without the two ASGI messages.

        The direct exchange's (server/http_direct.py) non-streamed answers (api/responses.py's EncodedJSON). The
        two headers it writes itself are known to be valid and to be the only ones `send` acts on; the `extra` ones
        get `send`'s checks. A default header list that holds one `send` acts on goes `send`'s whole way.
        """
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError("Expected ASGI message 'http.response.body', but got 'http.response.start'.")
        defaults = self._defaults.get(self.default_headers)
        acted_on = False
        for name, _ in extra:  # a loop, not any() over a generator: one header or none, usually
            if name.lower() in _ACTED_ON:
                acted_on = True
                break
        if defaults is None or self.scope["method"] == "HEAD" or acted_on:
            headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json"), *extra]
            head = self._head(200, headers)
            self.expected_content_length = 0
            self.transport.write(head + body if self.scope["method"] != "HEAD" else head)
            self._complete()
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        if self.access_log:
            self._log_access(200)
        content = [STATUS_LINE[200], defaults, b"content-length: %d\r\ncontent-type: application/json\r\n" % len(body)]
        for name, value in extra:  # send's checks
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            content += [name.lower(), b": ", value, b"\r\n"]
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content += [b"\r\n", body]
        self.chunked_encoding = False
        self.transport.write(b"".join(content))
        self._complete()

    def _head(self, status_code: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """Start the response: the access line, and its status line and headers as bytes (uvicorn's start)."""
        self.response_started = True
        self.waiting_for_100_continue = False
        if self.access_log:
            self._log_access(status_code)
        defaults = self._defaults.get(self.default_headers)
        if defaults is None:
            defaults, headers = b"", [*self.default_headers, *headers]
        content: list[bytes] = [STATUS_LINE[status_code], defaults]
        has_connection_close = False
        for name, value in headers:
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend([name, b": ", value, b"\r\n"])
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _log_access(self, status_code: int) -> None:
        self.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(self.scope),
            self.scope["method"],
            get_path_with_query_string(self.scope),
            self.scope["http_version"],
            status_code,
        )

    def _complete(self) -> None:
        """The response's last byte is written (uvicorn's end of a response)."""
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def _write_held_head(self) -> None:
        """The application broke the protocol after the head: it goes out as uvicorn would have sent it."""
        head = self._held_head
        if head is not None:
            self._held_head = None
            self.transport.write(head)
