"""The direct exchange: `pyfront serve`'s protocol answers the fast lane's routes without the ASGI layers.

A short non-streamed completion is a few hundred microseconds of CPU, and the HTTP layer was a large share of it.
uvicorn runs every request as an ASGI application in a task started at the end of its headers: the body travels
as ``receive`` messages, the answer as two ``send`` messages, through uvicorn's proxy-headers middleware, the
application, its middleware and the lane. On peers.py's sequential row that machinery was the CPU pyfront spent
above vllm-rs (benchmarks/README.md, stops 33 and 34: a bare httptools protocol answers ~40 us cheaper than
uvicorn with an empty application).

Here the protocol (server/http_limits.py) keeps uvicorn's request/response cycle, so that pipelining, keep-alive,
the read clock's refusals, a client that goes away and a shutdown treat the request as any other, and changes
what runs in it:

- the body is gathered by the protocol itself (with the body limit), and the cycle's task starts when it is
  complete, with no ASGI message on the way in;
- the task calls the lane's :meth:`~pyfront.server.api.lane.FastLane.answer` (the same handlers, error mapping and
  cancellation on disconnect as the lane's ASGI entry) and writes a non-streamed answer with
  :meth:`~pyfront.server.http_cycle.ResponseCycle.send_json` (uvicorn's bytes and access line, one write);
- streamed answers and error responses run as ASGI responses on the cycle's own ``send``, as before.

Nor are uvicorn's proxy headers: a request with ``X-Forwarded-For`` or ``-Proto`` has uvicorn's own proxy-headers
middleware run on its scope (a copy of the server's, with no application after it) at the start of its task, as it
would have run before the application, so that the access line names the same client.

The middleware in front of the lane is what the exchange must not skip. :meth:`DirectLane.of` walks the lane's
middleware as the application built it and takes the request-phase check of each (``refusal(path, headers)``: the
body limit's Content-Length and the API key), run in the same order before the body is read, exactly where the
middleware would answer; the body limit also bounds what is gathered. The request-id middleware (outermost) is
applied the way it applies itself: its ``send`` wraps every response but a JSON answer, which gets its ``id_header``
when the route set none. Any other middleware (CORS, one added by the user) means no direct exchange: the start-up
log says why, and every request takes the ASGI path. Per request, a request goes the ASGI way when it is not a POST
of exactly a lane path (a query string included), expects ``100-continue``, asks for an upgrade, or arrives while an
earlier request on its connection is still being answered (uvicorn queues it as usual).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any, cast

from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.utils import get_client_addr

from pyfront.server.api.lane import FastLane, PyfrontApp, end_cut_response, shutdown_reason
from pyfront.server.api.middleware.api_key import APIKeyMiddleware
from pyfront.server.api.middleware.body_limit import BodyLimitMiddleware, BodyTooLarge
from pyfront.server.api.middleware.request_id import RequestIdHeaderMiddleware, has_request_id
from pyfront.server.api.responses import EncodedJSON, exception_response
from pyfront.server.http_cycle import ResponseCycle

logger = logging.getLogger("pyfront.server")

Check = Callable[[str, list[tuple[bytes, bytes]]], Response | None]
"""A middleware's request-phase check: the response that refuses a request to a path with these headers, or None."""

PROXY_HEADERS = frozenset({b"x-forwarded-for", b"x-forwarded-proto"})
"""The headers uvicorn's proxy-headers middleware reads (it rewrites the scope's client and scheme from them)."""


class DirectLane:
    """The fast lane as the direct exchange runs it: its routes by raw path, and its middleware's checks."""

    __slots__ = ("body_limit", "checks", "lane", "paths", "request_ids")

    def __init__(self, lane: FastLane, checks: tuple[Check, ...], body_limit: int | None, request_ids: bool) -> None:
        self.lane = lane
        self.checks = checks
        self.body_limit = body_limit
        self.request_ids = request_ids
        """Every response gets an X-Request-Id (RequestIdHeaderMiddleware's, which is outermost: refusals too)."""
        self.paths = {path.encode("ascii"): path for path in lane.handlers}
        """A request target, exactly as sent, to its path: a query string or an escape means the ASGI way."""

    @classmethod
    def of(cls, app: object) -> DirectLane | str:
        """The direct lane of `app`, or why it has none (then every request takes the ASGI path)."""
        if not isinstance(app, PyfrontApp):
            return f"the application is a {type(app).__name__}, not pyfront's"
        if app.middleware_stack is None:  # Starlette builds it on the first request; the lane's layers with it
            app.middleware_stack = app.build_middleware_stack()
        layer = app.fast_lane
        checks: list[Check] = []
        body_limit: int | None = None
        request_ids = False
        while layer is not app.lane:
            if isinstance(layer, RequestIdHeaderMiddleware):
                if layer is not app.fast_lane:  # inside a check, its refusals would go without the header
                    return "the request-id middleware is not the outermost"
                request_ids = True
            elif isinstance(layer, BodyLimitMiddleware):
                body_limit = layer.limit if body_limit is None else min(body_limit, layer.limit)
                checks.append(layer.refusal)
            elif isinstance(layer, APIKeyMiddleware):
                checks.append(layer.refusal)
            else:
                return f"the fast lane runs behind {type(layer).__name__}, which the direct exchange does not apply"
            layer = getattr(layer, "app", None)
        return cls(app.lane, tuple(checks), body_limit, request_ids)

    def refusal(self, path: str, headers: list[tuple[bytes, bytes]]) -> Response | None:
        """The first check's refusal, in the middleware's order (outermost first)."""
        for check in self.checks:
            response = check(path, headers)
            if response is not None:
                return response
        return None


def has_proxy_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, _ in headers:  # noqa: SIM110  (any() over a generator: 0.40 us a request against 0.18)
        if name in PROXY_HEADERS:
            return True
    return False


def proxy_twin(app: object) -> ProxyHeadersMiddleware | None:
    """The server's proxy-headers middleware (`app`, when uvicorn wrapped the application in it) with nothing after
    it: what the direct exchange runs on a scope with proxy headers. None: the server applies no proxy headers."""
    if not isinstance(app, ProxyHeadersMiddleware):
        return None
    twin = copy.copy(app)
    twin.app = cast(Any, _nothing)
    return twin


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    return None


class DirectCycle(ResponseCycle):
    """uvicorn's cycle for a request of the direct exchange (an instance is the protocol's cycle given this class).

    The protocol appends the body to ``body`` (``gather``) and starts the task (``serve``, run by uvicorn's
    ``run_asgi``, so that its errors end the way an application's do) once the body is complete, or at once with
    a refusal. Until then there is no task: a client that goes away or a read timeout leaves nothing behind.
    """

    direct: DirectLane
    started: bool
    refusal: Response | Exception | None
    task: asyncio.Task[None] | None

    access_client: str
    """The client as uvicorn's access line writes it (its `get_client_addr`), made once per connection."""
    proxy: ProxyHeadersMiddleware | None
    """`proxy_twin`'s, for a request with proxy headers."""

    def adopt_direct(self, direct: DirectLane, access_client: str) -> None:
        self.direct = direct
        self.access_client = access_client
        self.started = False
        self.refusal = None
        self.task = None
        self.proxy = None

    def _log_access(self, status_code: int) -> None:
        """uvicorn's access line; the path is a lane path as sent (no query string, nothing to escape)."""
        self.access_logger.info(
            '%s - "%s %s HTTP/%s" %d', self.access_client, "POST", self.scope["path"], self.scope["http_version"],
            status_code,
        )  # fmt: skip

    async def run(self, tasks: set[asyncio.Task[None]]) -> None:
        """The task's coroutine: uvicorn's `run_asgi` of `serve`, then out of the server's set of running tasks.

        uvicorn takes a task out of that set with a done callback, which the event loop runs on a turn of its
        own: one more pass through the loop (a poll of its sockets, a system call) after every answer. Here
        the task leaves the set as its last step. (A task cancelled before its first step, which only a
        shutdown does, stays in the set; uvicorn waits for the set only before it cancels.)
        """
        try:
            await self.run_asgi(cast(Any, self.serve))
        finally:
            tasks.discard(cast(asyncio.Task[None], self.task))

    def gather(self, body: bytes) -> bool:
        """Add a piece of the body; False once it passes the body limit (the 413 is then this request's answer)."""
        self.body += body
        limit = self.direct.body_limit
        if limit is not None and len(self.body) > limit:
            self.refusal = BodyTooLarge(limit)
            return False
        return True

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request's ASGI application: the lane's answer, written as the lane would have sent it."""
        direct = self.direct
        lane = direct.lane
        path = scope["path"]
        # What the middleware's `send` is; a shutdown's cut is written on the server's own, as PyfrontApp writes it.
        middleware_send = RequestIdHeaderMiddleware.with_id(scope["headers"], send) if direct.request_ids else send
        if self.proxy is not None:  # as uvicorn's middleware would have, before the application
            await self.proxy(cast(Any, scope), cast(Any, receive), cast(Any, send))
            self.access_client = get_client_addr(cast(Any, scope))
        try:
            refusal = self.refusal
            if isinstance(refusal, Response):
                response: Response | None = refusal
            elif refusal is not None:
                response = exception_response(lane.state, refusal, path)
            else:
                raw = bytes(self.body)
                self.body = bytearray()
                response = await lane.answer(
                    path, raw, scope["headers"], self._watch.when_disconnected, receive, self.task
                )
            if response is None:
                return  # the client left while its answer was being made
            if type(response) is EncodedJSON:
                extra = response.extra
                if direct.request_ids and not has_request_id(extra):
                    extra = [*extra, RequestIdHeaderMiddleware.id_header(scope["headers"])]
                await self.send_json(cast(bytes, response.body), extra)
            else:
                await response(scope, receive, middleware_send)
        except asyncio.CancelledError as exc:
            reason = shutdown_reason(exc, scope)
            if reason is None:
                raise
            await end_cut_response(scope, send, reason)


def direct_lane(app: object) -> DirectLane | None:
    """`DirectLane.of(app)`, logging why there is none."""
    direct = DirectLane.of(app)
    if isinstance(direct, str):
        logger.info("the fast lane's requests take the ASGI path: %s", direct)
        return None
    return direct
