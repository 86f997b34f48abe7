"""The fast lane: the token-carrying routes straight from the server, around FastAPI's own stack."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyfront.server.api.chat.handler import chat_response
from pyfront.server.api.completions.handler import completion_response
from pyfront.server.api.messages.handler import count_tokens_response, messages_response
from pyfront.server.api.request import RequestHeaders, read_body
from pyfront.server.api.responses import exception_response
from pyfront.server.api.responses_api.handler import responses_response
from pyfront.server.api.responses_api.store import ResponseStore
from pyfront.server.api.sse import DONE_FRAME
from pyfront.server.config import ServerConfig
from pyfront.server.errors import (
    ANTHROPIC_PATHS,
    FORCED_EXIT,
    anthropic_sse_error_frame,
    error_response_for,
    sse_error_frame,
)
from pyfront.server.extensions import DISCONNECT, Disconnect, WhenDisconnected
from pyfront.server.state import ServingState

_Handler = Callable[[ServingState, ServerConfig, bytes, RequestHeaders], Coroutine[Any, Any, Response]]


class FastLane:
    """POST /v1/chat/completions, /v1/completions, /v1/responses and the Messages API straight from the server.

    These routes carry every token; through FastAPI each `send` of a streamed frame passed several
    middleware wrappers (error, exception, body-limit and telemetry layers) and each request a dozen
    more calls. Here a request costs one dispatch and frames go to the server's own `send`. Behaviour is
    the same as through FastAPI: the same handlers (chat_response / completion_response), the same
    user middleware (api.middleware, wrapped around this lane by PyfrontApp), and errors
    mapped to the same error bodies (`exception_response`: OpenAI's, Anthropic's on the Messages routes).
    """

    def __init__(self, state: ServingState, config: ServerConfig, responses_store: ResponseStore) -> None:
        self.state = state
        self.config = config
        self.handlers: dict[str, _Handler] = {
            "/v1/chat/completions": chat_response,
            "/v1/completions": completion_response,
            "/v1/responses": functools.partial(responses_response, responses_store),
            "/v1/messages": messages_response,
            "/v1/messages/count_tokens": count_tokens_response,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(receive)
        except Exception as exc:  # the body limit's 413 (BodyTooLarge)
            await exception_response(self.state, exc, scope["path"])(scope, receive, send)
            return
        if raw is None:
            return  # the client left before sending its body
        extension: Disconnect | None = (scope.get("extensions") or {}).get(DISCONNECT)
        when_disconnected = extension["when_disconnected"] if extension is not None else None
        response = await self.answer(scope["path"], raw, scope["headers"], when_disconnected, receive)
        if response is not None:
            await response(scope, receive, send)

    async def answer(
        self,
        path: str,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        when_disconnected: WhenDisconnected | None,
        receive: Receive,
        task: asyncio.Task[Any] | None = None,
    ) -> Response | None:
        """The response to a POST to `path` with body `raw`; None if the client left while it was being made.

        What the lane does once a body is read, for its ASGI entry above and for `pyfront serve`'s direct
        exchange (server/http_direct.py), which reads the body itself and passes the `task` it runs in (asking
        asyncio for the current task is a system call, getpid, on every request).
        """
        state = self.state
        try:
            handler = self.handlers[path](state, self.config, raw, RequestHeaders(headers))
            return await _unless_client_leaves(handler, when_disconnected, receive, task)
        except Exception as exc:
            return exception_response(state, exc, path)


_CLIENT_LEFT = "pyfront: the client disconnected"


async def _unless_client_leaves(
    handler: Coroutine[Any, Any, Response],
    when_disconnected: WhenDisconnected | None,
    receive: Receive,
    task: asyncio.Task[Any] | None,
) -> Response | None:
    """Run `handler`, cancelling it if the client disconnects first (vLLM's `with_cancellation`).

    A non-streamed answer is made entirely inside the handler (it waits for the last token), so a
    client that gives up would otherwise keep its engine requests running to the end and its admission
    slot taken. The handler runs in this task, and is cancelled with a message of its own, so that no
    other cancel (a shutdown's) is mistaken for it. Cancelled, the handler aborts its engine requests and
    releases its admission in its own clean-up (Generation.abort, the `finally` that releases). A
    streamed answer is returned at once, and the SSE response watches for the disconnect from then on.

    How the disconnect is seen: `pyfront serve`'s server calls back when the connection is lost
    (`when_disconnected`, its scope extension: server/extensions.py); any other server tells it only as
    the next `receive` message (the body has been read, so that is the disconnect), which a watcher task
    waits for.
    """
    if task is None:
        task = asyncio.current_task()
        assert task is not None
    left = False

    def leave() -> None:
        nonlocal left
        left = True
        task.cancel(_CLIENT_LEFT)

    watcher = None
    if when_disconnected is not None:
        when_disconnected(leave)
    else:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            leave()

        watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await handler
    except asyncio.CancelledError as exc:
        if not left or exc.args[:1] != (_CLIENT_LEFT,):
            raise
        task.uncancel()
        return None
    finally:
        if watcher is not None:
            watcher.cancel()
        elif when_disconnected is not None:
            when_disconnected(None)


class PyfrontApp(FastAPI):
    """FastAPI, except that the FastLane's routes take it, behind the same user middleware.

    Starlette builds its middleware stack once, on the first call (and refuses `add_middleware` after
    that); `build_middleware_stack` wraps the lane in the same `user_middleware` list at the same moment,
    so whatever middleware the application has, given as `middleware=` or added with `add_middleware`,
    runs on the fast lane too, in the same order.
    """

    def __init__(self, lane: FastLane, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lane = lane
        self.fast_paths = frozenset(lane.handlers)
        self.fast_lane: ASGIApp | None = None
        """The lane inside the user middleware; built with the stack."""

    def build_middleware_stack(self) -> ASGIApp:
        lane: ASGIApp = self.lane
        for cls, args, kwargs in reversed(self.user_middleware):
            lane = cls(lane, *args, **kwargs)
        self.fast_lane = lane
        return super().build_middleware_stack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self.middleware_stack is None:
                self.middleware_stack = self.build_middleware_stack()
            if (
                self.fast_lane is not None
                and scope["type"] == "http"
                and scope["method"] == "POST"
                and scope["path"] in self.fast_paths
            ):
                await self.fast_lane(scope, receive, send)
                return
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError as exc:
            reason = shutdown_reason(exc, scope)
            if reason is None:
                raise
            await end_cut_response(scope, send, reason)


_SHUTDOWN_CANCELS = {
    "Task cancelled, timeout graceful shutdown exceeded": "the shutdown drain timeout passed",
    FORCED_EXIT: "forced exit",
}
"""The cancels that end a shutdown, by message: uvicorn's when the drain times out, pyfront's on a second Ctrl-C.

uvicorn logs one line for the first ("Cancel N running task(s), timeout graceful shutdown exceeded"); the
requests it cuts end here quietly, instead of as one "Exception in ASGI application" traceback each.
"""


def shutdown_reason(exc: asyncio.CancelledError, scope: Scope) -> str | None:
    """Why a shutdown cut the request of `scope` (None: `exc` is no shutdown's cancel, it goes on up)."""
    return _SHUTDOWN_CANCELS.get(exc.args[0]) if exc.args and scope["type"] == "http" else None


async def end_cut_response(scope: Scope, send: Send, reason: str) -> None:
    """End a request cut by shutdown: a 503 if nothing was sent yet, else an SSE error event and the end of the body.

    The server's `send` says which: it refuses a second response start.
    """
    current = asyncio.current_task()
    if current is not None:
        current.uncancel()
    message = f"server shutting down: request cut ({reason})"
    path = scope["path"]
    with contextlib.suppress(OSError, RuntimeError):  # the client may be gone too
        try:
            await error_response_for(path, 503, message)(scope, _disconnected, send)
        except RuntimeError:  # the response had started: a stream
            cut = (
                anthropic_sse_error_frame(503, message)
                if path in ANTHROPIC_PATHS
                else sse_error_frame(503, message) + DONE_FRAME
            )
            await send({"type": "http.response.body", "body": cut, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected() -> Message:
    return {"type": "http.disconnect"}
