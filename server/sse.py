"""Server-sent events: an ASGI response that notices a client disconnect at once, and frame templates.

Starlette's StreamingResponse only notices a disconnect when a write fails (ASGI spec 2.4), so a
client that leaves during a long prefill would keep its engine request running. This response
listens for `http.disconnect` beside the stream and cancels it; the stream's own `finally` then
aborts the engine request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE_FRAME = b"data: [DONE]\n\n"
_encode = msgspec.json.encode


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

    def __init__(self, chunk: dict) -> None:
        self.prefix, self.suffix = frame(chunk).split(_encode(DELTA_MARKER))

    def render(self, text: str) -> bytes:
        return self.prefix + _encode(text) + self.suffix


class SSEResponse(Response):
    """Streams `frames` as text/event-stream; cancels them when the client goes away.

    A Response subclass only so that FastAPI hands it to the server as it is; it renders nothing itself.
    """

    def __init__(self, frames: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> None:
        self.frames = frames
        self.status_code = 200
        self.background = None
        self.sse_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ] + [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_disconnect)
            try:
                await send({"type": "http.response.start", "status": 200, "headers": self.sse_headers})
                async for chunk in self.frames:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client went away mid-write
            finally:
                await _close(self.frames)
                tg.cancel_scope.cancel()


async def _close(frames: AsyncIterator[bytes]) -> None:
    aclose = getattr(frames, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()
