"""AdmissionPacer (server/pacing.py): admissions start freely within a slice of one loop iteration, then as many
per iteration as fitted in that slice, in arrival order, with the loop's other callbacks (socket reads: engine
outputs) run between them; a waiter that is cancelled is skipped and never stalls the rest; a streamed request
whose client leaves while it waits is never admitted."""

from __future__ import annotations

import asyncio

import pytest

from pyfront.server.pacing import AdmissionPacer


class Iterations:
    """Counts event-loop iterations: a callback that re-schedules itself runs once per iteration."""

    def __init__(self) -> None:
        self.count = 0
        self._stopped = False
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        if not self._stopped:
            self.count += 1
            asyncio.get_running_loop().call_soon(self._step)

    def stop(self) -> None:
        self._stopped = True


def test_an_idle_pacer_lets_a_request_in_without_suspending() -> None:
    async def main() -> None:
        pacer = AdmissionPacer()
        coro = pacer.turn()
        with pytest.raises(StopIteration):  # finished on its first step: no await happened
            coro.send(None)
        assert pacer.waiting == 0

    asyncio.run(main())


def test_a_burst_is_admitted_in_order_a_slice_s_worth_per_iteration_after_the_slice() -> None:
    async def main() -> None:
        now = [0.0]
        pacer = AdmissionPacer(slice_s=0.003, clock=lambda: now[0])
        iterations = Iterations()
        admitted: list[tuple[int, int]] = []
        between: list[int] = []

        async def request(i: int) -> None:
            await pacer.turn()
            admitted.append((i, iterations.count))
            now[0] += 0.001  # an admission's synchronous work, 1 ms by the pacer's clock
            if i == 5:  # as an engine output would: a callback queued during the burst
                asyncio.get_running_loop().call_soon(lambda: between.append(len(admitted)))

        await asyncio.gather(*(request(i) for i in range(30)))
        iterations.stop()
        assert [i for i, _ in admitted] == list(range(30))  # first come, first served
        first_iteration = admitted[0][1]
        free = [i for i, it in admitted if it == first_iteration]
        assert len(free) == 3, admitted  # the 3 ms slice of the first iteration: three 1 ms admissions
        later = [it for _, it in admitted[len(free) :]]
        per_iteration = [later.count(it) for it in sorted(set(later))]
        assert per_iteration == [3] * 9, admitted  # then the three that fitted the slice, per iteration
        assert between and between[0] < 12, (between, admitted)  # the callback did not wait for the burst's end

    asyncio.run(main())


def test_a_cancelled_waiter_is_skipped_and_the_rest_still_get_in() -> None:
    async def main() -> None:
        pacer = AdmissionPacer(slice_s=0.0)
        order: list[int] = []

        async def request(i: int) -> None:
            await pacer.turn()
            order.append(i)

        tasks = [asyncio.ensure_future(request(i)) for i in range(6)]
        await asyncio.sleep(0)  # request 0 is in; the others wait
        tasks[2].cancel()
        tasks[3].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert order == [0, 1, 4, 5]
        assert [type(r).__name__ for r in results] == ["NoneType"] * 2 + ["CancelledError"] * 2 + ["NoneType"] * 2
        assert pacer.waiting == 0

    asyncio.run(main())


def test_a_waiter_cancelled_after_it_was_let_go_does_not_stall_the_queue() -> None:
    async def main() -> None:
        pacer = AdmissionPacer(slice_s=0.0)
        order: list[int] = []

        async def request(i: int) -> None:
            await pacer.turn()
            order.append(i)

        tasks = [asyncio.ensure_future(request(i)) for i in range(4)]
        await asyncio.sleep(0)  # 0 is in, 1..3 wait
        assert pacer.waiting == 3
        first = pacer._waiters[0]
        while not first.done():  # a tick lets 1 go
            await asyncio.sleep(0)
        tasks[1].cancel()  # let go but cancelled, before or after it ran: the queue goes on either way
        await asyncio.gather(*tasks, return_exceptions=True)
        assert order in ([0, 2, 3], [0, 1, 2, 3])
        assert all(t.done() for t in tasks)

    asyncio.run(main())
