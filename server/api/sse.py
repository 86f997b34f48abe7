"""Server-sent events: an ASGI response that notices a client disconnect at once, and frame templates.

Starlette's StreamingResponse only notices a disconnect when a write fails (ASGI spec 2.4), so a
client that leaves during a long prefill would keep its engine request running. This response
cancels the stream when the client goes away; the stream's own `finally` then aborts the engine
request. Under `pyfront serve` the server calls back when the connection is lost (the scope extension
of server/extensions.py, as the fast lane's non-streamed requests use it): no task per stream. Under
any other server one plain asyncio task waits for the `http.disconnect` message beside the stream
(not a task group: it runs for every streamed request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pyfront.server.errors import sse_error_frame
from pyfront.server.extensions import DISCONNECT, HOLD_HEAD, Disconnect

if TYPE_CHECKING:
    from pyfront.engine_client.protocol import EngineCoreOutput
    from pyfront.server.generate.generation import Choice

DONE_FRAME = b"data: [DONE]\n\n"
KEEPALIVE_FRAME = b": keep-alive\n\n"
"""An SSE comment: keeps proxies and clients from timing out a stream that is waiting for its engine."""
_encode = msgspec.json.encode


def error_frames(status: int, message: str) -> bytes:
    """The chat and completion streams' end after an error: the error as an event (as vLLM), then [DONE]."""
    return sse_error_frame(status, message) + DONE_FRAME


def frame(obj: object) -> bytes:
    """One SSE event holding `obj` as JSON."""
    return b"data: " + _encode(obj) + b"\n\n"


DELTA_MARKER = "\x00PYFRONT-DELTA\x00"
"""Put this string where the streamed text goes in a chunk, then build a ContentTemplate from it."""


class ContentTemplate:
    """The bytes around a streamed text delta, encoded once per choice instead of once per token.

    A chunk is `prefix + json(text) + suffix`; only the text is encoded per token, and the bytes are
    exactly what encoding the whole chunk would give.
    """

    __slots__ = ("prefix", "suffix")

    def __init__(self, chunk: dict[str, Any]) -> None:
        self.prefix, self.suffix = frame(chunk).split(_encode(DELTA_MARKER))

    def render(self, text: str) -> bytes:
        return self.prefix + _encode(text) + self.suffix


class Frames(Protocol):
    """Renders one streamed response's SSE frames (api.chat.frames.ChatFrames, api.completions.frames.CompletionFrames,
    api.messages.frames.MessagesFrames, api.responses_api.frames.ResponsesFrames).

    Both streaming paths (api.streaming.stream_frames and api.push.PushStream) drive the same `output` per
    engine output, so a response is byte-for-byte the same whichever path carries it.
    """

    def output(self, choice: Choice, output: EngineCoreOutput) -> bytes:
        """The frames (possibly none) for one engine output of `choice`; folds the output into the choice."""
        ...

    def closing(self) -> bytes:
        """The last frames: the usage chunk when asked for, and [DONE]."""
        ...

    def error(self, status: int, message: str) -> bytes:
        """The last frames of a stream that failed after it started (its API's own error event)."""
        ...


class Pusher(Protocol):
    """Writes a whole SSE body itself, its end included (api.push.PushStream): `run` returns when the body is
    complete."""

    async def run(self, send: Send) -> None: ...


class SSEResponse(Response):
    """Streams `frames` as text/event-stream; stops them when the client goes away.

    A Response subclass only so that FastAPI hands it to the server as it is; it renders nothing itself.
    Each item of `frames` is written with one `send` straight to the server (no wrapping per frame); or
    a `pusher` writes the body itself. `on_close` runs once the stream has ended, however it ended.
    """

    def __init__(
        self,
        frames: AsyncIterator[bytes] | None,
        headers: dict[str, str] | None = None,
        on_close: Callable[[], None] | None = None,
        *,
        pusher: Pusher | None = None,
    ) -> None:
        assert (frames is None) != (pusher is None)
        self.frames = frames
        self.pusher = pusher
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.sse_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        streaming = True
        disconnected = False

        def leave() -> None:
            # Cancelling the task is safe only while it is inside the streaming loop below: the flag is
            # read and the cancel requested on the event loop, where the task is suspended at an await.
            nonlocal disconnected
            disconnected = True
            if streaming:
                task.cancel()

        extension: Disconnect | None = (scope.get("extensions") or {}).get(DISCONNECT)
        watcher: asyncio.Task[None] | None = None
        if extension is not None:
            extension["when_disconnected"](leave)
        else:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                leave()

            watcher = asyncio.create_task(watch_disconnect())
        try:
            start: dict[str, Any] = {"type": "http.response.start", "status": 200, "headers": self.sse_headers}
            if self.pusher is not None:
                start[HOLD_HEAD] = True  # the pusher sends a body message within PushStream.HEAD_HOLD_S
            await send(start)
            if self.pusher is not None:
                await self.pusher.run(send)
                streaming = False
            else:
                assert self.frames is not None
                async for chunk in self.frames:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                streaming = False
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()  # our own cancel: the client left, which is not an error of this request
        finally:
            streaming = False
            if watcher is not None:
                watcher.cancel()
            elif extension is not None:
                extension["when_disconnected"](None)
            if self.frames is not None:
                await _close(self.frames)
            if self.on_close is not None:
                self.on_close()


async def _close(frames: AsyncIterator[bytes]) -> None:
    aclose = getattr(frames, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()
