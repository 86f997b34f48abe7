"""PushStream on its own: a fake `send` and fake generations (one or several choices), no server, no engine.

PushStream drives the server's `send` coroutine by hand from the engine client's output loop; these tests
pin what that must guarantee whatever `send` does: every frame once and in order, the closing frames last,
a send that suspends (a slow client) resumed in order with later frames queued behind it, errors turned
into one SSE error event, and the engine request aborted however the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from pyfront.engine_client.client import RequestAbortedError, RequestStream
from pyfront.engine_client.protocol import EngineCoreOutput, FinishReason
from pyfront.server.api.push import PushStream
from pyfront.server.api.sse import DONE_FRAME, KEEPALIVE_FRAME, error_frames
from pyfront.server.metrics import Metrics

pytestmark = pytest.mark.anyio


@dataclass
class FakeChoice:
    stream: RequestStream
    done: bool = False


@dataclass
class FakeGeneration:
    """The Streamed protocol: its choices, its timers, and what abort / finish_metrics were asked."""

    choices: list[FakeChoice]
    keepalive: float | None = None
    deadline: float | None = None
    last_output_at: float = 0.0
    aborts: int = 0
    finished: int = 0

    def finish_metrics(self) -> None:
        self.finished += 1

    async def abort(self) -> None:
        self.aborts += 1
        for choice in self.choices:
            choice.done = True


@dataclass
class FakeFrames:
    """One frame per output, `tok:<ids>`; the output with a finish reason ends the choice."""

    fail_on: int | None = None
    seen: list[list[int]] = field(default_factory=list)

    def output(self, choice: Any, output: EngineCoreOutput) -> bytes:
        self.seen.append(output.new_token_ids)
        if self.fail_on is not None and output.new_token_ids == [self.fail_on]:
            raise RuntimeError("frame rendering failed")
        if output.finish_reason is not None:
            choice.done = True
        return f"tok:{output.new_token_ids}\n".encode()

    def closing(self) -> bytes:
        return b"closing\n" + DONE_FRAME

    def error(self, status: int, message: str) -> bytes:
        """The chat routes' error event (an OpenAI error body), then [DONE]: what ChatFrames.error writes."""
        return error_frames(status, message)


class FakeSend:
    """The ASGI `send`: records body chunks; `block_at` makes that call (0-based) wait until `release()`."""

    def __init__(self, block_at: int | None = None, fail_at: int | None = None) -> None:
        self.bodies: list[bytes] = []
        self.ends: list[bool] = []
        """Per recorded body: whether it ended the body (`more_body` False)."""
        self.calls = 0
        self.block_at = block_at
        self.fail_at = fail_at
        self.gate: asyncio.Future[None] | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        call = self.calls
        self.calls += 1
        if call == self.fail_at:
            raise OSError("client went away")
        if call == self.block_at:
            self.gate = asyncio.get_running_loop().create_future()
            await self.gate
        assert not any(self.ends), "a send after the end of the body"
        self.bodies.append(message["body"])
        self.ends.append(not message["more_body"])

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set_result(None)

    @property
    def text(self) -> str:
        return b"".join(self.bodies).decode()


def output(*ids: int, finish: int | None = None) -> EngineCoreOutput:
    return EngineCoreOutput("r", list(ids), finish_reason=finish)


def setup(**generation: Any) -> tuple[RequestStream, FakeGeneration, Metrics]:
    stream = RequestStream("r", 0)
    return stream, FakeGeneration([FakeChoice(stream)], **generation), Metrics("m", lambda: None)


def waits(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("pyfront:stream_write_waits_total", {"model_name": "m"}) or 0.0


async def test_outputs_before_and_after_run_are_written_once_in_order() -> None:
    stream, generation, metrics = setup()
    frames = FakeFrames()
    send = FakeSend()
    push = PushStream([generation], frames, metrics)
    stream.push(output(1))  # buffered before the stream listens: taken first by run()
    task = asyncio.create_task(push.run(send))
    await asyncio.sleep(0)
    stream.push(output(2))  # straight from the "output loop" to the listener
    stream.push(output(3, finish=FinishReason.LENGTH))
    await asyncio.wait_for(task, 2)
    assert send.text == "tok:[1]\ntok:[2]\ntok:[3]\nclosing\n" + DONE_FRAME.decode()
    assert generation.finished == 1
    assert generation.aborts >= 1  # the final clean-up: nothing is left running
    assert waits(metrics) == 0


async def test_a_send_that_suspends_keeps_later_frames_in_order() -> None:
    stream, generation, metrics = setup()
    send = FakeSend(block_at=1)  # the second frame meets a slow client
    push = PushStream([generation], FakeFrames(), metrics)
    task = asyncio.create_task(push.run(send))
    await asyncio.sleep(0)
    for i in range(1, 5):
        stream.push(output(i))
    stream.push(output(5, finish=FinishReason.STOP))
    await asyncio.sleep(0.01)
    assert send.bodies == [b"tok:[1]\n"]  # frame 2 waits for the client; 3-5 queue behind it
    assert not task.done()
    send.release()
    await asyncio.wait_for(task, 2)
    assert send.text == "".join(f"tok:[{i}]\n" for i in range(1, 6)) + "closing\n" + DONE_FRAME.decode()
    assert send.ends == [False] * 4 + [True]  # the end, queued behind the slow send, went out last, once
    assert waits(metrics) == 1


async def test_a_rendering_error_ends_the_stream_with_one_error_event_and_aborts() -> None:
    stream, generation, metrics = setup()
    send = FakeSend()
    push = PushStream([generation], FakeFrames(fail_on=2), metrics)
    task = asyncio.create_task(push.run(send))
    await asyncio.sleep(0)
    stream.push(output(1))
    stream.push(output(2))
    stream.push(output(3))  # after the error: dropped
    await asyncio.wait_for(task, 2)
    events = re.findall(r"^data: (\{.*\})$", send.text, re.M)
    assert send.bodies[0] == b"tok:[1]\n"
    assert len(events) == 1
    assert json.loads(events[0])["error"]["code"] == 500
    assert send.text.endswith(DONE_FRAME.decode()) and send.ends[-1]
    assert "tok:[3]" not in send.text
    assert generation.aborts >= 1
    assert generation.finished == 0


async def test_an_engine_abort_ends_the_stream_normally() -> None:
    stream, generation, metrics = setup()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    stream.push(output(1))
    stream.fail(RequestAbortedError("aborted"))
    await asyncio.wait_for(task, 2)
    assert send.text == "tok:[1]\nclosing\n" + DONE_FRAME.decode()


async def test_keepalive_comments_while_the_engine_is_silent() -> None:
    stream, generation, metrics = setup(keepalive=0.02)
    generation.last_output_at = time.monotonic()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0.09)
    stream.push(output(1, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
    keepalives = send.bodies.count(KEEPALIVE_FRAME)
    assert keepalives >= 2
    assert send.bodies[-1] == b"tok:[1]\nclosing\n" + DONE_FRAME and send.ends[-1]


async def test_the_last_output_the_closing_frames_and_the_end_are_one_send() -> None:
    """A short answer is one send after the head: its frames, the closing frames and the end of the body (so the
    server writes them, the chunked terminator included, in one system call); a stream that ends without an
    output of its own (an abort) ends with the closing frames alone."""
    stream, generation, metrics = setup()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    stream.push(output(1, 2, finish=FinishReason.LENGTH))
    assert send.bodies == [b"tok:[1, 2]\nclosing\n" + DONE_FRAME] and send.ends == [True]  # before the task ran
    await asyncio.wait_for(task, 2)
    assert send.ends == [True] and generation.finished == 1

    stream, generation, metrics = setup()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    stream.push(output(1))
    stream.fail(RequestAbortedError("aborted"))
    await asyncio.wait_for(task, 2)
    assert send.bodies == [b"tok:[1]\n", b"closing\n" + DONE_FRAME] and send.ends == [False, True]


async def test_the_head_goes_out_alone_if_no_output_comes_within_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server may hold the head until the first body message (HOLD_HEAD): with no output within HEAD_HOLD_S an
    empty body message releases it, once; an output that comes first carries the head, and no empty one is sent."""
    monkeypatch.setattr(PushStream, "HEAD_HOLD_S", 0.02)
    stream, generation, metrics = setup(keepalive=10.0)
    generation.last_output_at = time.monotonic()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0.1)
    assert send.bodies == [b""] and send.ends == [False]  # once, not every HEAD_HOLD_S
    stream.push(output(1, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
    assert send.bodies == [b"", b"tok:[1]\nclosing\n" + DONE_FRAME]

    stream, generation, metrics = setup(keepalive=10.0)
    generation.last_output_at = time.monotonic()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    stream.push(output(1))
    await asyncio.sleep(0.1)
    stream.push(output(2, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
    assert b"" not in send.bodies and send.text == "tok:[1]\ntok:[2]\nclosing\n" + DONE_FRAME.decode()


async def test_the_deadline_fails_the_stream_with_a_timeout_event() -> None:
    _, generation, metrics = setup(deadline=time.monotonic() + 0.03)
    send = FakeSend()
    await asyncio.wait_for(PushStream([generation], FakeFrames(), metrics).run(send), 2)
    events = re.findall(r"^data: (\{.*\})$", send.text, re.M)
    assert [json.loads(e)["error"]["code"] for e in events] == [504]
    assert generation.aborts >= 1


async def test_a_client_that_leaves_cancels_the_task_and_aborts_the_engine_request() -> None:
    stream, generation, metrics = setup()
    send = FakeSend()
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    stream.push(output(1))
    task.cancel()  # what SSEResponse does on http.disconnect
    with pytest.raises(asyncio.CancelledError):
        await task
    assert generation.aborts >= 1
    stream.push(output(2))  # the output loop keeps routing: nothing more is written
    assert send.bodies == [b"tok:[1]\n"]


async def test_a_send_that_fails_stops_writing_and_aborts() -> None:
    stream, generation, metrics = setup()
    send = FakeSend(fail_at=1)
    task = asyncio.create_task(PushStream([generation], FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    for i in range(1, 4):
        stream.push(output(i))
    with pytest.raises(OSError):
        await asyncio.wait_for(task, 2)  # SSEResponse treats OSError from send as the client gone
    assert send.bodies == [b"tok:[1]\n"]
    assert generation.aborts >= 1


def setup_many(choices: int, generations: int = 1) -> tuple[list[RequestStream], list[FakeGeneration], Metrics]:
    """`generations` fake generations of `choices` choices each (n > 1, or a completions request's prompts)."""
    streams: list[RequestStream] = []
    gens = []
    for g in range(generations):
        mine = [RequestStream(f"r{g}-{c}", 0) for c in range(choices)]
        streams += mine
        gens.append(FakeGeneration([FakeChoice(s) for s in mine]))
    return streams, gens, Metrics("m", lambda: None)


async def test_several_choices_interleave_in_arrival_order_and_close_once_after_the_last() -> None:
    streams, generations, metrics = setup_many(2, generations=2)
    send = FakeSend()
    streams[3].push(output(30))  # buffered before run: taken first, in choice order
    task = asyncio.create_task(PushStream(generations, FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    streams[0].push(output(1))
    streams[2].push(output(20, finish=FinishReason.STOP))
    streams[1].push(output(10))
    streams[0].push(output(2, finish=FinishReason.LENGTH))
    streams[2].push(output(21))  # after its choice ended: dropped
    streams[1].push(output(11, finish=FinishReason.STOP))
    await asyncio.sleep(0.01)
    assert not task.done()  # the fourth choice is still open
    streams[3].push(output(31, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
    body = "tok:[30]\ntok:[1]\ntok:[20]\ntok:[10]\ntok:[2]\ntok:[11]\ntok:[31]\n"
    assert send.text == body + "closing\n" + DONE_FRAME.decode()
    assert [g.finished for g in generations] == [1, 1]
    assert all(g.aborts >= 1 for g in generations)


async def test_an_abort_of_one_choice_ends_that_choice_only() -> None:
    streams, generations, metrics = setup_many(3)
    send = FakeSend()
    task = asyncio.create_task(PushStream(generations, FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    streams[1].fail(RequestAbortedError("aborted by an admin"))
    streams[0].push(output(1, finish=FinishReason.STOP))
    await asyncio.sleep(0.01)
    assert not task.done()
    streams[2].push(output(3, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
    assert send.text == "tok:[1]\ntok:[3]\nclosing\n" + DONE_FRAME.decode()


async def test_an_engine_error_on_one_choice_fails_the_whole_stream_and_aborts_every_generation() -> None:
    streams, generations, metrics = setup_many(2, generations=2)
    send = FakeSend()
    task = asyncio.create_task(PushStream(generations, FakeFrames(), metrics).run(send))
    await asyncio.sleep(0)
    streams[0].push(output(1))
    streams[3].fail(RuntimeError("engine died"))
    streams[1].push(output(2))  # after the error: dropped
    await asyncio.wait_for(task, 2)
    events = re.findall(r"^data: (\{.*\})$", send.text, re.M)
    assert send.bodies[0] == b"tok:[1]\n" and "tok:[2]" not in send.text
    assert [json.loads(e)["error"]["code"] for e in events] == [500]
    assert all(g.aborts >= 1 for g in generations) and all(g.finished == 0 for g in generations)


async def test_keepalive_with_several_generations_counts_from_the_latest_output() -> None:
    streams, generations, metrics = setup_many(1, generations=2)
    now = time.monotonic()
    for g in generations:
        g.keepalive = 0.05
    generations[0].last_output_at, generations[1].last_output_at = now - 10, now
    send = FakeSend()
    task = asyncio.create_task(PushStream(generations, FakeFrames(), metrics).run(send))
    await asyncio.sleep(0.02)
    assert KEEPALIVE_FRAME not in send.bodies  # the second generation's output was recent
    await asyncio.sleep(0.06)
    assert KEEPALIVE_FRAME in send.bodies
    assert generations[0].last_output_at == generations[1].last_output_at > now
    for s in streams:
        s.push(output(1, finish=FinishReason.STOP))
    await asyncio.wait_for(task, 2)
