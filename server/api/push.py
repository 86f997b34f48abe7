"""Push streaming: a streamed response written from the engine client's output loop, no task switch per token."""

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


class Streamed(Protocol):
    """What PushStream needs of each of the response's Generations: its choices with their engine streams, and
    its timers.

    A Generation is one (n choices of one prompt; a completions request with several prompts has one per
    prompt); tests drive PushStream with a small fake instead (tests/server/api/test_push.py).
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


class _ChoiceListener:
    """One choice's engine stream listener: hands its outputs and error to the PushStream with the choice."""

    __slots__ = ("choice", "push")

    def __init__(self, push: PushStream, choice: Choice) -> None:
        self.push = push
        self.choice = choice

    def on_output(self, output: EngineCoreOutput) -> None:
        self.push.on_output(self.choice, output)

    def on_error(self, error: BaseException) -> None:
        self.push.on_error(self.choice, error)


class PushStream:
    """A streamed response, every choice of every generation, written from the engine client's output loop.

    The general path (api.streaming.stream_frames, which background responses still use) wakes the request's
    task for every engine output, and with several choices runs a pump task per choice. Here each choice's
    RequestStream hands each output to `on_output` while the engine's batch is routed; it renders the same
    frames (ChatFrames / CompletionFrames / ...) and writes them with the server's `send` at once, in the
    order the outputs arrive. Sending a body chunk completes without suspending unless the client stopped
    reading (flow control), so the send coroutine is driven by hand; if it does suspend, the request's task
    resumes it exactly as an asyncio Task would (await the future it yielded, then `send(None)`), and later
    frames queue behind it in order. The task wakes only for that, at the end, on an error, and on
    keep-alive / deadline timers: not once per token, whatever n is.

    The stream ends when every choice is done (its final output, a stop string, or an abort from outside,
    which ends that choice as the general path ends it); any other error ends it with one error event.

    The server may hold the response's head back until the first body message (server/extensions.py's HOLD_HEAD,
    which SSEResponse sets for a pusher): the head and the first events are then one write. The bound is
    `HEAD_HOLD_S`: if no output came by then, an empty body message sends the head alone, so a client waiting for
    a long prefill still sees its 200 (and the request ids in the headers) at once, give or take that bound.

    `run` writes the whole body, its end included: the last frames go with the end of the body in one `send`
    (`more_body` False), so the server writes them and the chunked terminator in one piece. When the last
    choice ends with an engine output, that output's frames, the closing frames (usage, [DONE]) and the end go
    out together from `on_output`: with the head held, a short streamed answer is one write, not four (the head,
    the output's frames, the closing frames and the terminator each had their own system call).
    """

    HEAD_HOLD_S = 0.1
    """How long the response's head may wait for the first output to go out with it (see the class docstring)."""

    def __init__(self, generations: Sequence[Streamed], frames: Frames, metrics: Metrics) -> None:
        self.metrics = metrics
        self.generations = generations
        # As Generation.batches: the choices that have an engine stream (all of them once a Generation started).
        self.choices = [choice for generation in generations for choice in generation.choices if choice.stream]
        assert self.choices
        self.frames = frames
        self._open = len(self.choices)
        """Choices not done yet."""
        self._send: Callable[[Message], Coroutine[Any, Any, None]] | None = None
        """The server's `send`: an async def, so each call returns a coroutine that `_write` drives by hand."""
        self._pending: tuple[Any, Any] | None = None
        """A send coroutine that suspended, and what it yielded."""
        self._backlog: list[tuple[bytes, bool]] = []
        """Chunks (and whether each ends the body) waiting behind a suspended send."""
        self._ended = False
        """The end of the body has been sent (or queued behind a suspended send): nothing more is written."""
        self._head_held = True
        """No body message was sent yet: the server may still hold the head back."""
        self._attention: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._send_failed = False
        """`send` raised: the connection is gone, so the stream ends without an error event."""

    # -------------------------------------------------- called from the output loop (must not raise)

    def on_output(self, choice: Choice, output: EngineCoreOutput) -> None:
        if self._done or self._error is not None or choice.done:
            return
        try:
            chunk = self.frames.output(choice, output)
        except Exception as exc:  # raised in the request's task by run()
            self._error = exc
            self._wake()
            return
        if choice.done:
            self._choice_ended()
        if self._done:
            try:
                closing = self._closing()
            except Exception as exc:  # as above: run() ends the stream with an error event after `chunk`
                self._error = exc
                if chunk:
                    self._write(chunk)
                self._wake()
                return
            self._write(chunk + closing, end=True)
            self._wake()
        elif chunk:
            self._write(chunk)

    def _choice_ended(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._done = True

    def on_error(self, choice: Choice, error: BaseException) -> None:
        if self._done:
            return
        if isinstance(error, RequestAbortedError):
            # Aborted here (a stop string matched: the choice is done already) or by an admin: the choice
            # ends as the general path ends it, and the others go on.
            if not choice.done:
                choice.done = True
                self._choice_ended()
            if not self._done:
                return
        else:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        attention = self._attention
        if attention is not None and not attention.done():
            attention.set_result(None)

    def _closing(self) -> bytes:
        """The closing frames, once every choice is done (the request's end-to-end time is observed here)."""
        for generation in self.generations:
            generation.finish_metrics()
        return self.frames.closing()

    def _write(self, chunk: bytes, *, end: bool = False) -> None:
        if self._ended:
            return
        self._head_held = False
        if end:
            self._ended = True
        if self._pending is not None:
            self._backlog.append((chunk, end))
            return
        assert self._send is not None
        coro = self._send({"type": "http.response.body", "body": chunk, "more_body": not end})
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
        ended, self._ended = self._ended, False  # set again by the backlog's end, if it holds one
        for chunk, end in backlog:
            self._write(chunk, end=end)
        self._ended = self._ended or ended

    async def _wait(self) -> None:
        """Until something needs the task, or the next keep-alive / deadline check is due."""
        generations = self.generations
        first = generations[0]  # one request: its generations share the keep-alive and the deadline
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        timeout = None
        keepalive, deadline = first.keepalive, first.deadline
        last_output_at = max(g.last_output_at for g in generations) if len(generations) > 1 else first.last_output_at
        if keepalive is not None:
            timeout = max(0.0, keepalive - (now - last_output_at))
        if deadline is not None:
            timeout = deadline - now if timeout is None else min(timeout, deadline - now)
        if self._head_held:
            timeout = self.HEAD_HOLD_S if timeout is None else min(timeout, self.HEAD_HOLD_S)
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
        if self._head_held:
            self._write(b"")  # no output within HEAD_HOLD_S: the head goes out alone
        if keepalive is not None and now - last_output_at >= keepalive:
            for generation in generations:
                generation.last_output_at = now
            self._write(KEEPALIVE_FRAME)

    async def _flush(self) -> None:
        while self._pending is not None:
            await self._resume_pending()

    async def run(self, send: Send) -> None:
        """Stream the response body, its end included (the response start is sent by SSEResponse)."""
        self._send = cast("Callable[[Message], Coroutine[Any, Any, None]]", send)  # ASGI servers' send is an async def
        try:
            for choice in self.choices:
                stream = choice.stream
                assert stream is not None
                for output in stream.listen(_ChoiceListener(self, choice)):
                    self.on_output(choice, output)
                if stream.error is not None:
                    self.on_error(choice, stream.error)
            while True:
                if self._pending is not None:
                    await self._resume_pending()
                elif self._error is not None:
                    raise self._error
                elif self._done:
                    break
                else:
                    await self._wait()
            if not self._ended:  # the last choice ended without an output of its own (an abort)
                self._write(self._closing(), end=True)
            await self._flush()
        except asyncio.CancelledError:
            self._done = True
            await self._abort()
            raise
        except BaseException as exc:
            self._done = True
            await self._abort()
            if self._send_failed or self._ended:
                raise  # nobody to tell, or the body has ended: SSEResponse ends the response as it can
            error = to_api_error(exc)
            self.metrics.error(error.status)
            if self._pending is not None:
                self._pending[0].close()
                self._pending = None
            self._backlog.clear()
            self._write(self.frames.error(error.status, error.message), end=True)
            await self._flush()
        finally:
            self._done = True
            for choice in self.choices:
                if choice.stream is not None:
                    choice.stream.listen(None)
            await self._abort()

    async def _abort(self) -> None:
        for generation in self.generations:
            await generation.abort()
