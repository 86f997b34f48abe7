"""Push streaming: a one-choice stream written from the engine client's output loop, no task switch per token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

from starlette.types import Message, Send

from pyfront.engine_client.client import RequestAbortedError, release_waiter
from pyfront.engine_client.protocol import EngineCoreOutput
from pyfront.server.api.sse import KEEPALIVE_FRAME, Frames
from pyfront.server.errors import DeadlineExceeded, to_api_error
from pyfront.server.generate.generation import Choice
from pyfront.server.metrics import Metrics


class OneChoice(Protocol):
    """What PushStream needs of the request's Generation: one choice with its engine stream, and its timers.

    A Generation is one; tests drive PushStream with a small fake instead (tests/server/api/test_push.py).
    """

    keepalive: float | None
    """Seconds without output before a keep-alive comment goes out (None: never)."""
    deadline: float | None
    """time.monotonic() at which the request fails with DeadlineExceeded (None: no deadline)."""
    last_output_at: float

    @property
    def choices(self) -> Sequence[Choice]: ...  # read-only here, so that a Generation's list[Choice] matches

    def finish_metrics(self) -> None: ...

    async def abort(self) -> None:
        """Abort every unfinished engine request; idempotent, safe inside a cancelled scope."""
        ...


class PushStream:
    """A streamed response with one choice, written from the engine client's output loop.

    The general path (api.streaming.stream_frames under SSEResponse) wakes the request's task for
    every engine output. Here the choice's RequestStream hands each output to `on_output` while the
    engine's batch is routed; it renders the same frames (ChatFrames / CompletionFrames) and writes them
    with the server's `send` at once. Sending a body chunk completes without suspending unless the
    client stopped reading (flow control), so the send coroutine is driven by hand; if it does suspend,
    the request's task resumes it exactly as an asyncio Task would (await the future it yielded, then
    `send(None)`), and later frames queue behind it in order. The task wakes only for that, at the end,
    on an error, and on keep-alive / deadline timers: not once per token.
    """

    def __init__(self, generation: OneChoice, frames: Frames, metrics: Metrics) -> None:
        assert len(generation.choices) == 1
        self.metrics = metrics
        self.generation = generation
        self.choice = generation.choices[0]
        self.frames = frames
        self._send: Callable[[Message], Coroutine[Any, Any, None]] | None = None
        """The server's `send`: an async def, so each call returns a coroutine that `_write` drives by hand."""
        self._pending: tuple[Any, Any] | None = None
        """A send coroutine that suspended, and what it yielded."""
        self._backlog: list[bytes] = []
        self._attention: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._send_failed = False
        """`send` raised: the connection is gone, so the stream ends without an error event."""

    # -------------------------------------------------- called from the output loop (must not raise)

    def on_output(self, output: EngineCoreOutput) -> None:
        if self._done or self._error is not None:
            return
        try:
            chunk = self.frames.output(self.choice, output)
        except Exception as exc:  # raised in the request's task by run()
            self._error = exc
            self._wake()
            return
        if self.choice.done:
            self._done = True
        if chunk:
            self._write(chunk)
        if self._done:
            self._wake()

    def on_error(self, error: BaseException) -> None:
        if self._done:
            return
        if isinstance(error, RequestAbortedError):
            self._done = True  # aborted here (or by an admin): the stream ends as the general path ends it
        else:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        attention = self._attention
        if attention is not None and not attention.done():
            attention.set_result(None)

    def _write(self, chunk: bytes) -> None:
        if self._pending is not None:
            self._backlog.append(chunk)
            return
        assert self._send is not None
        coro = self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:  # the connection failed: the client is gone
            self._send_failed = True
            if self._error is None:
                self._error = exc
            self._wake()
            return
        self._pending = (coro, yielded)
        self.metrics.write_waits.inc()
        self._wake()

    # -------------------------------------------------- the request's task

    async def _resume_pending(self) -> None:
        """Finish the suspended send as a Task would, then write what queued behind it.

        A Task that gets a future from a coroutine clears the future's `_asyncio_future_blocking`
        flag, waits for it to be done and resumes the coroutine with `send(None)`, which then reads
        the future's result or exception itself. This does the same from the request's task.
        """
        assert self._pending is not None
        coro, yielded = self._pending
        loop = asyncio.get_running_loop()
        while True:
            if yielded is None:  # a bare `yield` (asyncio.sleep(0)): resume on the next loop pass
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False
                if not yielded.done():
                    waiter = loop.create_future()
                    yielded.add_done_callback(lambda _, waiter=waiter: release_waiter(waiter))
                    try:
                        await waiter
                    except asyncio.CancelledError:
                        yielded.cancel()
                        self._pending = None
                        coro.close()
                        raise
            try:
                yielded = coro.send(None)
            except StopIteration:
                break
            except BaseException:
                self._pending = None
                self._send_failed = True
                raise
        self._pending = None
        backlog, self._backlog = self._backlog, []
        for chunk in backlog:
            self._write(chunk)

    async def _wait(self) -> None:
        """Until something needs the task, or the next keep-alive / deadline check is due."""
        generation = self.generation
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        timeout = None
        keepalive, deadline = generation.keepalive, generation.deadline
        if keepalive is not None:
            timeout = max(0.0, keepalive - (now - generation.last_output_at))
        if deadline is not None:
            timeout = deadline - now if timeout is None else min(timeout, deadline - now)
        attention = self._attention = loop.create_future()
        timer = loop.call_later(max(timeout, 0.0), release_waiter, attention) if timeout is not None else None
        try:
            await attention
        finally:
            self._attention = None
            if timer is not None:
                timer.cancel()
        if self._done or self._error is not None or self._pending is not None:
            return
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise DeadlineExceeded("the request deadline passed before the engine finished")
        if keepalive is not None and now - generation.last_output_at >= keepalive:
            generation.last_output_at = now
            self._write(KEEPALIVE_FRAME)

    async def _flush(self) -> None:
        while self._pending is not None:
            await self._resume_pending()

    async def run(self, send: Send) -> None:
        """Stream the response body (the response start is sent by SSEResponse)."""
        generation = self.generation
        stream = self.choice.stream
        assert stream is not None
        self._send = cast("Callable[[Message], Coroutine[Any, Any, None]]", send)  # ASGI servers' send is an async def
        try:
            for output in stream.listen(self):
                self.on_output(output)
            if stream.error is not None:
                self.on_error(stream.error)
            while True:
                if self._pending is not None:
                    await self._resume_pending()
                elif self._error is not None:
                    raise self._error
                elif self._done:
                    break
                else:
                    await self._wait()
            generation.finish_metrics()
            self._write(self.frames.closing())
            await self._flush()
        except asyncio.CancelledError:
            self._done = True
            await generation.abort()
            raise
        except BaseException as exc:
            self._done = True
            await generation.abort()
            if self._send_failed:
                raise  # nobody to tell: SSEResponse ends a response whose client went away quietly
            error = to_api_error(exc)
            self.metrics.error(error.status)
            if self._pending is not None:
                self._pending[0].close()
                self._pending = None
            self._backlog.clear()
            self._write(self.frames.error(error.status, error.message))
            await self._flush()
        finally:
            self._done = True
            stream.listen(None)
            await generation.abort()
