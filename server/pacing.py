"""Admission pacing: a burst of new streams cannot hold the event loop while running streams' tokens wait.

A request's admission (decode, a small body's inline render and tokenization, the engine request's set-up and
its ADD) runs without an await, about half a millisecond for a short chat. When 256 streams arrive at once, their
tasks are all ready in the same event-loop iteration, and the loop runs every ready callback before it polls
sockets again: all 256 admissions ran back to back (~150 ms here) before the first engine output was even read, so
the first token of the first stream waited for the last admission, and TTFT p50 was the whole burst's length.

``AdmissionPacer.turn`` lets admissions start freely until they have used ``slice_s`` of one loop iteration;
after that each waits its turn in arrival order, and each later iteration lets go as many as started within that
slice (at least one): about a slice's worth. Between two such batches the loop polls its sockets, so engine
outputs are read and streamed while the burst is still being admitted: stream k's first token then follows its
own admission, not the burst's last. Measured (benchmarks/loadgen.py streams, 256 x
256 tokens, interleaved A/B): TTFT p50 136 -> 103 ms, the first TTFT 80-143 -> 15-36 ms, p90 159 -> 175 ms (the
burst's last admissions now share the core with the first streams' tokens), CPU per token unchanged.

Why batches and not one per iteration (as at first): every iteration ends with the engine client's write of the
ADDs queued in it (engine_client/transport/zmtp.py), and costs a poll and a tick. One admission per iteration made
that a system call per ADD (an strace of a 256-stream burst: 250 writes to the engine socket, one ADD each) and
woke the engine once per request. The batch is measured, not configured: how many admissions (the work from one
`turn` to the next, which includes more than what a waiter does after its turn) fit in the free slice. The
iteration's bound is unchanged.

Only streamed requests take turns (the handlers ask when ``stream`` is set): a non-streamed answer has no first
token to hurry, and pacing those cost a quarter of the requests per second at 64 connections (more loop
iterations, and the engine's outputs batched less). The cost is one ``call_soon`` per iteration that admitted a
stream, and a future per stream that had to wait.

Progress does not depend on the waiters: the tick that lets one go re-arms itself while any are left, and a
waiter whose client left (its future cancelled) is skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class AdmissionPacer:
    """At most ``slice_s`` of admissions per event-loop iteration, then one per iteration, first come first served.

    One per process (``ServingState.pacer``), used only from its event loop.
    """

    SLICE_S = 0.002
    """Admission time one loop iteration may take before the next admissions wait for later iterations."""

    __slots__ = ("_armed", "_batch", "_clock", "_slice_s", "_started_in_slice", "_tick_started", "_waiters")

    def __init__(self, slice_s: float = SLICE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._slice_s = slice_s
        self._clock = clock
        self._tick_started: float | None = None
        """When this iteration's first admission started; None until one does."""
        self._started_in_slice = 0
        """Admissions started (freely) since `_tick_started`."""
        self._batch = 1
        """How many waiters a tick lets go: how many admissions started in the last free slice that filled up."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._armed = False

    @property
    def waiting(self) -> int:
        """Admissions waiting for their turn (cancelled ones included until a tick passes them)."""
        return len(self._waiters)

    async def turn(self) -> None:
        """Return when this request may be admitted (at once unless this iteration's slice is used up)."""
        if not self._waiters:
            started = self._tick_started
            if started is None:
                self._tick_started = self._clock()
                self._started_in_slice = 1
                self._arm()
                return
            if self._clock() - started < self._slice_s:
                self._started_in_slice += 1
                return
            self._batch = self._started_in_slice
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._arm()
        await waiter

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        """The next loop iteration: a new slice, and the first `_batch` waiters still waiting let go."""
        self._armed = False
        self._tick_started = None
        waiters = self._waiters
        left = self._batch
        while waiters and left:
            waiter = waiters.popleft()
            if not waiter.done():  # done: cancelled, its client left while it waited
                waiter.set_result(None)
                left -= 1
        if waiters:
            self._arm()
