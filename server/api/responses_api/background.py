"""Background responses (``background: true``), as vLLM 0.32 runs them with its store on.

The request is answered at once with the response in status ``queued`` (streamed: its events as they come),
and the generation goes on in a task of its own: a client that leaves does not abort it; ``POST
/v1/responses/{id}/cancel`` does (status ``cancelled``), and ``GET /v1/responses/{id}`` shows the stored
response, the finished one once it is done (or ``failed``). A streamed background response keeps its events
(:class:`EventLog`) so that ``GET /v1/responses/{id}?stream=true&starting_after=N`` can replay them and follow
the rest, as vLLM's event store does. Differences from vLLM 0.32: the events live with the stored response and
go when the store evicts it (vLLM keeps every event forever); a replay of a cancelled or failed stream ends
instead of waiting forever; server shutdown cancels the runs still going (their engine requests are aborted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from pyfront.server.api.sse import KEEPALIVE_FRAME

logger = logging.getLogger("pyfront.server")

_END = b"\n\n"


class EventLog:
    """A background stream's SSE events in order, for the client that started it and any that come back.

    Events are appended by the run's task and read by any number of readers on the same event loop; each
    append wakes the readers (a fresh ``asyncio.Event`` per change, so that no reader misses one).
    """

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.nbytes = 0
        self.closed = False
        self._changed = asyncio.Event()

    def append(self, chunk: bytes) -> None:
        """One chunk of the rendered stream: split into its events (keep-alive comments dropped).

        Event data is JSON on one line, so an event ends exactly at the first blank line.
        """
        for event in chunk.split(_END):
            if event and not event.startswith(b":"):
                self.events.append(event + _END)
                self.nbytes += len(event) + len(_END)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def read(self, start: int, keepalive_s: float | None) -> AsyncIterator[bytes]:
        """The events from index ``start`` on, following new ones until the log is closed; a keep-alive
        comment after ``keepalive_s`` without one."""
        index = start
        while True:
            if index < len(self.events):
                chunk = b"".join(self.events[index:])
                index = len(self.events)
                yield chunk
                continue
            if self.closed:
                return
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), keepalive_s)
            except TimeoutError:
                yield KEEPALIVE_FRAME


class BackgroundRuns:
    """The tasks of the background responses still running, by response id (event-loop only).

    A run owns its engine request and its admission slot and lets them go in its own ``finally``; a task
    cancelled before it first ran would never get there, so :meth:`cancel` waits until the run has started.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def start(self, response_id: str, run: Coroutine[Any, Any, None]) -> None:
        started = asyncio.Event()

        async def guarded() -> None:
            started.set()
            await run

        task = asyncio.get_running_loop().create_task(guarded(), name=f"background {response_id}")
        self._tasks[response_id] = (task, started)
        task.add_done_callback(lambda done: self._finished(response_id, done))

    def _finished(self, response_id: str, task: asyncio.Task[None]) -> None:
        entry = self._tasks.get(response_id)
        if entry is not None and entry[0] is task:
            del self._tasks[response_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("background response %s failed", response_id, exc_info=task.exception())

    def running(self, response_id: str) -> bool:
        return response_id in self._tasks

    async def cancel(self, response_id: str) -> None:
        """Cancel the run (its engine request is aborted) and wait until it has ended."""
        entry = self._tasks.get(response_id)
        if entry is None:
            return
        task, started = entry
        await started.wait()  # scheduled tasks start at the loop's next turn
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def cancel_all(self) -> None:
        for response_id in list(self._tasks):
            await self.cancel(response_id)

    def __len__(self) -> int:
        return len(self._tasks)
