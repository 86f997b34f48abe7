"""The engine client against the mock engine over real ZMQ sockets: handshake, FEH negotiation,
routing, aborts, utility calls, death and stall detection."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from pyfront.engine_client import codec
from pyfront.engine_client.client import (
    INLINE_ENCODE_TOKENS,
    DuplicateRequestError,
    EngineClient,
    EngineClientConfig,
    EngineDeadError,
    EngineError,
    EngineUnavailableError,
    RequestAbortedError,
)
from pyfront.engine_client.handshake import HandshakeError, HandshakeServer, handshake_address
from pyfront.engine_client.mock_engine import MockConfig, MockEngineRank, run_mock_engine
from pyfront.engine_client.protocol import (
    REQUEST_TYPE_ABORT,
    REQUEST_TYPE_ADD,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHandshakeMessage,
    SamplingParams,
    engine_identity,
)
from pyfront.engine_client.transport import open_engine_sockets
from pyfront.engine_client.transport.base import OUTPUT_BATCH_MESSAGES
from pyfront.hashing import default_none_hash
from tests.conftest import free_port

EOS = 151645


def make_request(request_id: str, prompt_len: int = 50, max_tokens: int = 5, **sampling) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS, **sampling)
    prompt = [1000 + (i * 37) % 5000 for i in range(prompt_len)]
    return EngineCoreRequest(request_id, prompt, None, params, None, time.time(), None, None, None)


@contextmanager
def mock_threads(port: int, ranks: list[int], **kwargs) -> Iterator[None]:
    """Mock engine ranks on threads of this process (fine unless a test makes them die)."""
    stop = threading.Event()
    config = MockConfig(handshake_address=f"tcp://127.0.0.1:{port}", ranks=ranks, **kwargs)
    thread = threading.Thread(target=run_mock_engine, args=(config, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@contextmanager
def mock_process(port: int, ranks: list[int], *args: str) -> Iterator[subprocess.Popen]:
    """A mock engine in its own process, for tests that kill it."""
    cmd = [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{port}",
           "--ranks", *map(str, ranks), "--log-level", "WARNING", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@asynccontextmanager
async def client_for(port: int, size: int, **kwargs) -> AsyncIterator[EngineClient]:
    config = EngineClientConfig(data_parallel_rpc_port=port, data_parallel_size=size, startup_timeout_s=20, **kwargs)
    client = await EngineClient.start(config)
    try:
        yield client
    finally:
        await client.close()


async def collect(stream) -> tuple[list[int], int | None]:
    tokens: list[int] = []
    finish = None
    async for output in stream:
        tokens += output.new_token_ids
        finish = output.finish_reason
    return tokens, finish


async def engine_stats(client: EngineClient) -> list[dict]:
    return [await client.call_utility("mock_stats", rank=e.rank) for e in client.engines]


# ---------------------------------------------------------------- basics


def test_generate_route_and_spread_over_two_engines() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 2, feh_enabled=False) as client:
            assert client.max_model_len == 32768
            streams = [await client.add_request(make_request(f"r{i}", max_tokens=6)) for i in range(8)]
            results = [await collect(s) for s in streams]
            assert all(len(tokens) == 6 and finish == 1 for tokens, finish in results)
            # Same prompt, no seed: deterministic tokens on whichever engine.
            assert len({tuple(t) for t, _ in results}) == 1
            ranks = [s.rank for s in streams]
            assert ranks.count(0) == 4 and ranks.count(1) == 4
            stats = await engine_stats(client)
            assert [s["requests"] for s in stats] == [4, 4]
            assert all(s["running"] == 0 for s in stats)
            assert client.num_in_flight == 0
            assert all(e.num_in_flight == 0 for e in client.engines)
            # An explicit rank is honoured.
            stream = await client.add_request(make_request("pinned"), rank=1)
            assert stream.rank == 1
            await collect(stream)

    with mock_threads(port, [0, 1]):
        asyncio.run(main())


def test_eos_stop_token_and_logprobs() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            tokens, finish = await collect(await client.add_request(make_request("eos", max_tokens=50)))
            assert finish == 0 and tokens[-1] == EOS and len(tokens) == 4  # output_len=3, then EOS
            first = tokens[0]
            tokens, finish = await collect(
                await client.add_request(make_request("stop-id", max_tokens=50, stop_token_ids=[first]))
            )
            assert tokens == [first] and finish == 0
            stream = await client.add_request(make_request("lp", max_tokens=2, logprobs=2, prompt_logprobs=1))
            outputs = [o async for o in stream]
            plain = outputs[0].new_logprobs.to_plain()
            assert plain.token_ids[0][0] == outputs[0].new_token_ids[0] and len(plain.token_ids[0]) == 3
            prompt = outputs[0].new_prompt_logprobs_tensors.to_plain()
            assert len(prompt.token_ids) == 49 and prompt.token_ids[0][0] == make_request("x").prompt_token_ids[1]

    with mock_threads(port, [0], output_len=3):
        asyncio.run(main())


def test_abort_reaches_the_engine_and_ends_the_stream() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            stream = await client.add_request(make_request("long", max_tokens=10_000))
            first = await stream.get()
            assert first.new_token_ids
            await client.abort(["long"])
            with pytest.raises(RequestAbortedError):  # after any outputs that were already buffered
                for _ in range(10_000):
                    await stream.get()
            await asyncio.sleep(0.1)
            (stats,) = await engine_stats(client)
            assert stats["aborts"] == 1 and stats["running"] == 0
            assert client.num_in_flight == 0

    with mock_threads(port, [0]):
        asyncio.run(main())


def test_bad_requests_are_refused_before_sending() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            stream = await client.add_request(make_request("dup", max_tokens=1000))
            with pytest.raises(DuplicateRequestError):
                await client.add_request(make_request("dup"))
            await client.abort(["dup"])
            del stream
            bad = [
                make_request("t", temperature=5.0),
                make_request("m", max_tokens=0),
                make_request("p", top_p=0.0),
                make_request("k", top_k=-3),
                make_request("s", stop=[""]),
                make_request("lb", logit_bias={"7": 1.0}),
                make_request("lp", logprobs=21),
                make_request("min", min_tokens=10, max_tokens=5),
                make_request("long-prompt", prompt_len=32768),
                make_request("empty", prompt_len=0),
            ]
            float_prompt = make_request("f")
            float_prompt.prompt_token_ids[3] = 3.0
            negative = make_request("neg")
            negative.prompt_token_ids[0] = -1
            bad += [float_prompt, negative]
            for request in bad:
                with pytest.raises(ValueError):
                    await client.add_request(request)
            # The engine survived all of that: it still serves.
            tokens, finish = await collect(await client.add_request(make_request("ok")))
            assert finish == 1 and len(tokens) == 5
            (stats,) = await engine_stats(client)
            assert stats["requests"] == 2

    with mock_threads(port, [0]):
        asyncio.run(main())


def test_utility_calls_and_failures() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 2, feh_enabled=False) as client:
            assert await client.call_utility("get_supported_tasks") == ["generate"]
            assert await client.call_utility("reset_prefix_cache", rank=1) is True
            with pytest.raises(EngineError, match="no_such_method"):
                await client.call_utility("no_such_method")

    with mock_threads(port, [0, 1]):
        asyncio.run(main())


def test_handshake_timeout_names_missing_ranks() -> None:
    port = free_port()

    async def main() -> None:
        config = EngineClientConfig(data_parallel_rpc_port=port, data_parallel_size=2, startup_timeout_s=1.5)
        with pytest.raises(HandshakeError, match=r"ranks \[1\] never said HELLO"):
            await EngineClient.start(config)

    with mock_threads(port, [0]):
        asyncio.run(main())


def test_a_handshake_socket_bound_before_the_client_admits_engines_that_said_hello_meanwhile() -> None:
    """What `pyfront serve` does (launcher.run_server): bind the handshake socket first, start the engine client
    much later. Engines that connected and said HELLO in between are admitted from the socket's queue; the
    client owns the socket from then on and closes it (and its own context) with itself."""
    port = free_port()
    handshake = HandshakeServer(handshake_address("127.0.0.1", port), 2)  # no event loop yet, its own context

    async def main() -> None:
        await asyncio.sleep(0.5)  # both ranks connect and say HELLO while nobody reads the socket
        config = EngineClientConfig(data_parallel_rpc_port=port, data_parallel_size=2, startup_timeout_s=20)
        client = await EngineClient.start(config, handshake)
        try:
            assert sorted(e.rank for e in client.engines) == [0, 1]
            assert await client.call_utility("get_supported_tasks", rank=1) == ["generate"]
        finally:
            await client.close()
        HandshakeServer(handshake_address("127.0.0.1", port), 1).close()  # closed with the client: the port is free

    with mock_threads(port, [0, 1]):
        asyncio.run(main())


def test_a_handshake_socket_needs_a_client_that_runs_the_handshake() -> None:
    handshake = HandshakeServer(handshake_address("127.0.0.1", free_port()), 1)
    try:
        with pytest.raises(ValueError, match="does not run the handshake"):
            EngineClient(EngineClientConfig(run_handshake=False, client_count=2), handshake)
    finally:
        handshake.close()
        handshake.close()  # a second close does nothing


# ---------------------------------------------------------------- FEH negotiation matrix


def run_negotiation(port: int, size: int, engines: list[dict], feh_enabled: bool, caplog) -> list[dict]:
    """Start one mock per rank with its own FEH settings; send prompts; return the engines' counters."""

    async def main() -> list[dict]:
        async with client_for(port, size, feh_enabled=feh_enabled) as client:
            prompts = [make_request(f"n{i}", prompt_len=40 + 16 * i) for i in range(6)]
            prompts[1].cache_salt = "tenant"
            prompts[2].prompt_token_ids = prompts[2].prompt_token_ids[:10]  # shorter than a block
            for request in prompts:
                await collect(await client.add_request(request))
            # Multi-turn: each turn extends the previous one, so the memo gets hits.
            history = list(range(2000, 4100))
            for turn in range(4):
                history = history + list(range(5000 + turn * 700, 5000 + turn * 700 + 700))
                request = make_request(f"turn{turn}")
                request.prompt_token_ids = list(history)
                await collect(await client.add_request(request))
            if client.hasher is not None:
                assert client.hasher.memo.stats.hits >= 3
            return await engine_stats(client)

    with caplog.at_level(logging.INFO, logger="pyfront.engine_client.client"):
        threads = [mock_threads(port, [rank], **kw) for rank, kw in enumerate(engines)]
        for ctx in threads:
            ctx.__enter__()
        try:
            return asyncio.run(main())
        finally:
            for ctx in threads:
                ctx.__exit__(None, None, None)


@pytest.mark.parametrize("size", [1, 2])
def test_feh_on_when_all_engines_agree(size, caplog) -> None:
    stats = run_negotiation(free_port(), size, [{"advertise_feh": True}] * size, True, caplog)
    assert "prompts are hashed by pyfront" in caplog.text
    assert sum(s["hashes_used"] for s in stats) == 9  # 10 requests, one shorter than a block
    assert all(s["hashes_mismatched"] == 0 and s["hashes_missing"] == 0 for s in stats)


def test_long_prompts_are_encoded_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ADD of more than INLINE_ENCODE_TOKENS ids is encoded on a worker thread (the encode grows with the
    prompt), a shorter one on the event loop (a thread hop would cost more); both reach the engine whole, their
    block hashes with them."""
    port = free_port()
    encoded_on: dict[str, int] = {}
    original = codec.encode_add

    def spy(request: EngineCoreRequest, *, block_hashes: bool) -> list:
        encoded_on[request.request_id] = threading.get_ident()
        return original(request, block_hashes=block_hashes)

    monkeypatch.setattr(codec, "encode_add", spy)
    lengths = {"short": 50, "bound": INLINE_ENCODE_TOKENS, "long": INLINE_ENCODE_TOKENS + 1}

    async def main() -> None:
        loop_thread = threading.get_ident()
        async with client_for(port, 1, feh_enabled=True) as client:
            for rid, length in lengths.items():
                tokens, finish = await collect(await client.add_request(make_request(rid, prompt_len=length)))
                assert len(tokens) == 5 and finish is not None
            stats = await engine_stats(client)
        assert stats[0]["hashes_used"] == 3 and stats[0]["hashes_mismatched"] == 0
        assert [encoded_on[rid] == loop_thread for rid in lengths] == [True, True, False]

    with mock_threads(port, [0], advertise_feh=True):
        asyncio.run(main())


def test_the_mock_checks_hashes_after_the_step_it_owes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An FEH mock with --step-on-arrival sends the ADD's first output before it recomputes the ADD's hashes (its
    proof of the front end's, which a real FEH engine does not do): benchmarks time the front end, not that check.
    The check still covers every ADD, a wrong blob included, by the time stats are read."""
    port = free_port()
    events: list[str] = []
    original_send, original_check = MockEngineRank.send, MockEngineRank.check_hashes

    def send(self: MockEngineRank, client_index: int, outputs: Any) -> None:
        events.append("output")
        original_send(self, client_index, outputs)

    def check(self: MockEngineRank, request: EngineCoreRequest) -> None:
        events.append("check")
        original_check(self, request)

    monkeypatch.setattr(MockEngineRank, "send", send)
    monkeypatch.setattr(MockEngineRank, "check_hashes", check)

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=True) as client:
            for i in range(3):
                events.clear()
                tokens, _ = await collect(await client.add_request(make_request(f"s{i}", max_tokens=1)))
                assert len(tokens) == 1
                deadline = time.monotonic() + 5
                while "check" not in events and time.monotonic() < deadline:
                    await asyncio.sleep(0.001)
                assert events[:2] == ["output", "check"]
            wrong = make_request("wrong", max_tokens=1)
            await collect(await client.add_request(wrong, prompt_block_hashes=b"FEH1" + bytes(4 + 32 * 3)))
            stats = await engine_stats(client)
        assert stats[0]["hashes_used"] == 3 and stats[0]["hashes_mismatched"] == 1

    with mock_threads(port, [0], advertise_feh=True, step_on_arrival=True):
        asyncio.run(main())


def test_a_request_to_an_idle_engine_is_sent_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`at_once` (see EngineSockets.send) for a request when its engine has nothing else of ours in flight only:
    behind another one it is batched with the rest of the turn's messages, and aborts always are."""
    port = free_port()
    sent: list[tuple[bytes, bool]] = []

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            sockets = client._sockets
            assert sockets is not None
            original = sockets.send

            def spy(identity: bytes, frames: Sequence[Any], *, at_once: bool = False) -> None:
                sent.append((bytes(frames[0]), at_once))
                original(identity, frames, at_once=at_once)

            monkeypatch.setattr(sockets, "send", spy)
            first = await client.add_request(make_request("first", max_tokens=50))
            second = await client.add_request(make_request("second", max_tokens=50))
            await client.abort(["second"])
            await collect(first)
            assert client.num_in_flight == 0
            third = await client.add_request(make_request("third"))
            await collect(third)
            assert second.finished
        add, abort = REQUEST_TYPE_ADD, REQUEST_TYPE_ABORT
        assert sent == [(add, True), (add, False), (abort, False), (add, True)]

    with mock_threads(port, [0]):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("engines", "feh_enabled", "reason"),
    [
        ([{"advertise_feh": True}], False, "VLLM_NATIVE_FEH is not set"),
        ([{"advertise_feh": True}, {}], True, "engine rank 1 does not advertise"),
        (
            [{"advertise_feh": True}, {"advertise_feh": True, "feh_block_size": 32}],
            True,
            "block_size 32 vs 16",
        ),
        (
            [{"advertise_feh": True}, {"advertise_feh": True, "feh_none_hash": bytes(32)}],
            True,
            "none_hash 000000000000.. vs " + default_none_hash()[:6].hex(),
        ),
        ([{}], True, "engine rank 0 does not advertise"),
    ],
)
def test_feh_off_when_engines_disagree(engines, feh_enabled, reason, caplog) -> None:
    stats = run_negotiation(free_port(), len(engines), engines, feh_enabled, caplog)
    assert reason in caplog.text
    assert "prompts are sent unhashed" in caplog.text
    assert all(s["hashes_used"] == 0 and s["hashes_unexpected"] == 0 for s in stats)
    advertising = [s for s in stats if s["feh_advertised"]]
    assert all(s["hashes_missing"] > 0 for s in advertising if s["requests"])


# ---------------------------------------------------------------- death and stalls


@pytest.mark.parametrize("mode", ["sentinel", "silent", "sigkill"])
def test_engine_death_fails_in_flight_requests_promptly(mode) -> None:
    port = free_port()

    async def main(victim: subprocess.Popen) -> None:
        async with client_for(port, 2, feh_enabled=False, ping_interval_s=0.5, stall_timeout_s=5) as client:
            streams = [await client.add_request(make_request(f"d{i}", max_tokens=100_000)) for i in range(6)]
            for stream in streams:
                await stream.get()
            started = time.monotonic()
            if mode == "sigkill":
                os.killpg(victim.pid, signal.SIGKILL)
            else:
                with pytest.raises(asyncio.TimeoutError):  # it dies before answering
                    await client.call_utility("mock_die", mode, rank=0, timeout_s=0.5)
            doomed = [s for s in streams if s.rank == 0]
            for stream in doomed:
                with pytest.raises(EngineDeadError):
                    while True:
                        await stream.get()
            elapsed = time.monotonic() - started
            assert elapsed < 2.5, f"in-flight requests failed only after {elapsed:.2f}s"
            assert not client.engines[0].healthy and client.engines[1].healthy
            assert client.healthy
            health = client.health()
            assert health["engines"][0]["healthy"] is False
            # The survivor keeps serving, and new requests avoid the dead engine.
            for stream in streams:
                if stream.rank == 1:
                    await client.abort([stream.request_id])
            new = await client.add_request(make_request("after"))
            assert new.rank == 1
            await collect(new)
            with pytest.raises(EngineUnavailableError):
                await client.add_request(make_request("pinned-dead"), rank=0)

    with mock_process(port, [0]) as victim, mock_process(port, [1]):
        asyncio.run(main(victim))


def test_stalled_engine_fails_requests_then_recovers() -> None:
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False, ping_interval_s=0.3, stall_timeout_s=0.6) as client:
            stream = await client.add_request(make_request("s", max_tokens=100_000))
            await stream.get()
            await client.call_utility("mock_stall", 2.5)
            with pytest.raises(EngineDeadError, match="stalled"):
                while True:
                    await stream.get()
            assert not client.healthy
            with pytest.raises(EngineUnavailableError):
                await client.add_request(make_request("while-stalled"))
            for _ in range(60):
                await asyncio.sleep(0.1)
                if client.healthy:
                    break
            assert client.healthy, "the engine answers pings again and is back in service"
            tokens, _ = await collect(await client.add_request(make_request("after")))
            assert tokens
            await asyncio.sleep(0.1)
            (stats,) = await engine_stats(client)
            assert stats["running"] == 0  # the stalled request was aborted in the engine too

    with mock_threads(port, [0]):
        asyncio.run(main())


# ---------------------------------------------------------------- the output loop yields


@pytest.mark.parametrize("transport", ["libzmq", "zmtp"])
def test_output_loop_yields_between_bounded_batches(transport: str, tmp_path: Path) -> None:
    """A flood of outputs already queued must not keep the event loop from other tasks (issue 13, item 1).

    The messages are sent before the event loop gets a turn, so the socket never runs dry while they are
    routed: before the fix the loop routed all of them without yielding once. The check is on fairness, not
    speed: a ticker task that yields after every tick must run between every bounded batch. libzmq gets them
    through inproc (in the PULL's queue as soon as the send returns), ZMTP through ipc (in the kernel's buffer,
    then read as large chunks of many messages each).
    """
    total = 20 * OUTPUT_BATCH_MESSAGES

    async def main() -> None:
        if transport == "libzmq":
            name = f"inproc://flood-{uuid.uuid4().hex}"
            input_address, output_address = f"{name}-in", f"{name}-out"
        else:
            input_address, output_address = f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out"
        routed = 0
        seen_at_ticks: list[int] = []

        def counting(frames: list[bytes]) -> None:
            nonlocal routed
            routed += 1

        ctx = zmq.asyncio.Context()
        sockets = await open_engine_sockets(ctx, input_address, output_address, counting, lambda _: None, transport)
        assert sockets.kind.startswith(transport)
        push = zmq.Context.shadow(ctx.underlying).socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(sockets.output_address)
        message = codec.encode_outputs(EngineCoreOutputs(0, [EngineCoreOutput("nobody", [1, 2, 3])]))
        for _ in range(total):
            push.send_multipart(message)
        if transport == "zmtp":
            time.sleep(0.5)  # libzmq's I/O thread writes them all to the kernel while the event loop is blocked

        async def ticker() -> None:
            while True:
                seen_at_ticks.append(routed)
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        deadline = time.monotonic() + 30
        while routed < total and time.monotonic() < deadline:
            await asyncio.sleep(0)
        tick_task.cancel()
        await asyncio.gather(tick_task, return_exceptions=True)
        push.close(0)
        await sockets.close()
        ctx.term()
        assert routed == total
        steps = [b - a for a, b in itertools.pairwise([*seen_at_ticks, routed])]  # the last batch too
        assert max(steps) <= OUTPUT_BATCH_MESSAGES, f"{max(steps)} messages routed without yielding"
        assert len([step for step in steps if step]) >= total // OUTPUT_BATCH_MESSAGES - 1  # the first before a tick

    asyncio.run(main())


# ---------------------------------------------------------------- engines that come back


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def fail_with_engine_dead(stream, timeout: float = 30.0) -> None:
    """The stream ends with EngineDeadError (after any outputs) within `timeout` s (a bound, not a speed check)."""

    async def drain() -> None:
        while True:
            await stream.get()

    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(drain(), timeout)


def test_killed_engine_is_degraded_then_readmitted_and_serves() -> None:
    """DP=2: rank 1 is killed, /health names it, a new process of rank 1 is re-admitted and takes requests."""
    port = free_port()

    async def main(victim: subprocess.Popen) -> None:
        async with client_for(port, 2, feh_enabled=False, ping_interval_s=0.5) as client:
            streams = [await client.add_request(make_request(f"k{i}", max_tokens=100_000)) for i in range(4)]
            for stream in streams:
                await stream.get()
            os.killpg(victim.pid, signal.SIGKILL)
            for stream in streams:
                if stream.rank == 1:
                    await fail_with_engine_dead(stream)
            health = client.health()
            assert health["healthy"] and health["degraded_ranks"] == [1]
            assert health["engines"][1]["status"] == "disconnected"
            assert (await client.add_request(make_request("meanwhile"))).rank == 0
            with mock_process(port, [1]):  # the same rank, a new process: HELLO again
                await wait_for(lambda: client.engines[1].healthy, "rank 1 to be re-admitted")
                health = client.health()
                assert health["degraded_ranks"] == [] and health["engines"][1]["restarts"] == 1
                assert health["engines"][1]["status"] == "ok"
                for stream in streams:
                    if stream.rank == 0:
                        await client.abort([stream.request_id])
                await client.abort(["meanwhile"])
                after = [await client.add_request(make_request(f"after{i}", max_tokens=4)) for i in range(6)]
                results = [await collect(s) for s in after]
                assert all(len(tokens) == 4 for tokens, _ in results)
                assert {s.rank for s in after} == {0, 1}, "the balancer routes to the re-admitted rank again"
                stats = await client.call_utility("mock_stats", rank=1)
                assert stats["requests"] == sum(s.rank == 1 for s in after) and stats["running"] == 0
                assert client.num_in_flight == 0

    with mock_process(port, [0]), mock_process(port, [1]) as victim:
        asyncio.run(main(victim))


@pytest.mark.parametrize(
    ("restart_args", "feh_stays_on"),
    [(["--advertise-feh"], True), (["--advertise-feh", "--feh-block-size", "32"], False), ([], False)],
)
def test_restarted_engine_renegotiates_feh(restart_args: list[str], feh_stays_on: bool, caplog) -> None:
    """FEH over the current registrations after a restart: the same config keeps it on, any other turns it off."""
    port = free_port()

    async def main(victim: subprocess.Popen) -> list[dict]:
        async with client_for(port, 2, feh_enabled=True, ping_interval_s=0.5) as client:
            assert client.hasher is not None
            os.killpg(victim.pid, signal.SIGKILL)
            await wait_for(lambda: not client.engines[1].healthy, "rank 1 to be taken out of service")
            with mock_process(port, [1], *restart_args):
                await wait_for(lambda: client.engines[1].restarts == 1, "rank 1 to be re-admitted")
                assert (client.hasher is not None) == feh_stays_on
                if not feh_stays_on:
                    assert client.negotiation.reason.startswith("turned off after engine rank 1 restarted")
                    assert "prompts are sent unhashed" in client.health()["front_end_block_hashing"]
                for i in range(4):
                    await collect(await client.add_request(make_request(f"f{i}", prompt_len=64)))
                return await engine_stats(client)

    with (
        caplog.at_level(logging.INFO, logger="pyfront.engine_client.client"),
        mock_process(port, [0], "--advertise-feh"),
        mock_process(port, [1], "--advertise-feh") as victim,
    ):
        stats = asyncio.run(main(victim))
    assert all(s["hashes_mismatched"] == 0 and s["hashes_unexpected"] == 0 for s in stats)
    if feh_stays_on:
        assert sum(s["hashes_used"] for s in stats) == 4
    else:
        turned_off = [r for r in caplog.records if "turned off after engine rank 1 restarted" in r.getMessage()]
        assert len(turned_off) == 1 and turned_off[0].levelno == logging.WARNING
        assert stats[0]["hashes_used"] == 0 and stats[0]["hashes_missing"] > 0


def test_second_hello_from_a_healthy_rank_is_a_restart() -> None:
    """A new process of a rank that still looks healthy: treated as a restart; the old process's requests fail."""
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            old = await client.add_request(make_request("old", max_tokens=100_000))
            await old.get()
            with mock_process(port, [0]):
                await fail_with_engine_dead(old)
                assert client.engines[0].restarts == 1 and client.healthy
                stats = await client.call_utility("mock_stats", rank=0)
                assert stats["requests"] == 0, "the new process answers for rank 0 now"
                tokens, _ = await collect(await client.add_request(make_request("new", max_tokens=3)))
                assert len(tokens) == 3

    with mock_threads(port, [0]):
        asyncio.run(main())


def test_unknown_rank_and_bad_handshake_messages_after_startup_are_refused(caplog) -> None:
    """After start-up a HELLO from a rank outside 0..N-1 gets no INIT, and junk on the handshake socket is dropped."""
    port = free_port()

    async def main() -> None:
        async with client_for(port, 1, feh_enabled=False) as client:
            with caplog.at_level(logging.WARNING, logger="pyfront.engine_client.handshake"):
                ctx = zmq.Context.instance()
                stray = ctx.socket(zmq.DEALER)
                stray.setsockopt(zmq.IDENTITY, engine_identity(3))
                stray.setsockopt(zmq.LINGER, 0)
                stray.connect(f"tcp://127.0.0.1:{port}")
                stray.send(codec.encode_handshake(EngineHandshakeMessage.hello()))
                junk = ctx.socket(zmq.DEALER)
                junk.setsockopt(zmq.IDENTITY, engine_identity(0))
                junk.setsockopt(zmq.LINGER, 0)
                junk.connect(f"tcp://127.0.0.1:{port}")
                junk.send(b"not msgpack")
                junk.send_multipart([b"two", b"frames"])
                junk.send(codec.encode_handshake(EngineHandshakeMessage.ready()))
                await wait_for(
                    lambda: "READY from engine rank 0 without a HELLO" in caplog.text, "the junk to be logged"
                )
                assert not stray.poll(200), "no INIT for a rank outside the deployment"
                assert "refusing an engine with data parallel rank 3 (identity 0300)" in caplog.text
                assert "malformed handshake message from rank 0" in caplog.text
                assert "with 3 frames" in caplog.text
                stray.close()
                junk.close()
            assert len(client.engines) == 1 and client.healthy
            tokens, _ = await collect(await client.add_request(make_request("still-serving", max_tokens=2)))
            assert len(tokens) == 2

    with mock_threads(port, [0]):
        asyncio.run(main())
