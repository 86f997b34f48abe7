"""tests/fakes.py's FakeEngine: it satisfies the server's `Engine` protocol and behaves like the ZMQ client.

The same scenarios run against FakeEngine and against `EngineClient` + the mock engine over real sockets, so a
handler test that passes against the fake tells the truth about the real client: outputs in order, finish
reasons as max_tokens says, aborts that end the stream at once and are recorded, `listen()` and `drain()`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

from pyfront.engine_client.client import (
    DuplicateRequestError,
    EngineClient,
    EngineClientConfig,
    EngineDeadError,
    EngineUnavailableError,
    RequestAbortedError,
    RequestStream,
)
from pyfront.engine_client.interface import Engine, EngineLoad
from pyfront.engine_client.mock_engine import MockConfig, run_mock_engine
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason, SamplingParams
from pyfront.hashing import HashConfig, PromptHasher, block_hashes, unpack_block_hashes
from tests.conftest import free_port
from tests.fakes import DEFAULT_TOKENS, FakeEngine, Step, echo_script

SCRIPT = (11, 22, 33, 44, 55, 66)
EOS = 151645


@contextmanager
def mock_threads(port: int, **options: Any) -> Iterator[None]:
    """One mock engine rank on a thread of this process, for the ZMQ side of the comparisons."""
    stop = threading.Event()
    config = MockConfig(handshake_address=f"tcp://127.0.0.1:{port}", ranks=[0], **options)
    thread = threading.Thread(target=run_mock_engine, args=(config, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@asynccontextmanager
async def client_for(port: int) -> AsyncIterator[EngineClient]:
    config = EngineClientConfig(data_parallel_rpc_port=port, startup_timeout_s=20, feh_enabled=False)
    client = await EngineClient.start(config)
    try:
        yield client
    finally:
        await client.close()


def make_request(request_id: str, max_tokens: int = 5, prompt_len: int = 40, **sampling: Any) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS, **sampling)
    prompt = [1000 + i for i in range(prompt_len)]
    return EngineCoreRequest(request_id, prompt, None, params, None, time.time(), None, None, None)


async def collect(stream: RequestStream) -> tuple[list[int], int | None]:
    tokens: list[int] = []
    finish = None
    async for output in stream:
        tokens += output.new_token_ids
        finish = output.finish_reason
    return tokens, finish


class Collector:
    """A StreamListener that keeps what it is handed."""

    def __init__(self) -> None:
        self.outputs: list[EngineCoreOutput] = []
        self.errors: list[BaseException] = []
        self.done = asyncio.Event()

    def on_output(self, output: EngineCoreOutput) -> None:
        self.outputs.append(output)
        if output.finish_reason is not None:
            self.done.set()

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)
        self.done.set()


def held_or_echo(request: EngineCoreRequest) -> list[Step]:
    """Echo SCRIPT, except that a request named "held*" gets one token per step and never finishes."""
    if request.request_id.startswith("held"):
        return [[EngineCoreOutput(request.request_id, [7])] for _ in range(10_000)]
    return list(echo_script(SCRIPT)(request))


# ---------------------------------------------------------------- the protocol


def _as_engine(engine: Engine) -> Engine:
    """For static checkers (mypy/pyright): both implementations must be assignable to `Engine`."""
    return engine


def test_engine_client_and_fake_satisfy_the_protocol() -> None:
    client = EngineClient(EngineClientConfig())  # not started: only its shape is checked
    try:
        fake = FakeEngine()
        for engine in (client, fake):
            assert isinstance(engine, Engine)
        _as_engine(client)
        _as_engine(fake)
        assert isinstance(fake.engines[0], EngineLoad)
        # runtime_checkable only checks that the members exist: compare the call signatures too.
        for name, member in vars(Engine).items():
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            wanted = inspect.signature(member)
            for impl in (EngineClient, FakeEngine):
                got = inspect.signature(getattr(impl, name))
                assert inspect.iscoroutinefunction(getattr(impl, name)) == inspect.iscoroutinefunction(member), name
                for param in wanted.parameters.values():
                    assert param.name in got.parameters, f"{impl.__name__}.{name} lacks {param.name}"
                    theirs = got.parameters[param.name]
                    assert theirs.kind == param.kind, f"{impl.__name__}.{name}({param.name}) kind"
                    assert theirs.default == param.default, f"{impl.__name__}.{name}({param.name}) default"
                extra = [p for n, p in got.parameters.items() if n not in wanted.parameters]
                assert all(p.default is not inspect.Parameter.empty for p in extra), f"{impl.__name__}.{name}"
    finally:
        client.ctx.term()


# ---------------------------------------------------------------- FakeEngine and the ZMQ client side by side


Scenario = Callable[[Engine], Awaitable[dict[str, Any]]]


async def scenario_order_and_finish(engine: Engine) -> dict[str, Any]:
    """Three concurrent requests: each stream's outputs in order; LENGTH when max_tokens cuts, else EOS + STOP."""
    short = await engine.add_request(make_request("short", max_tokens=4), trusted=True)
    long = await engine.add_request(make_request("long", max_tokens=50), trusted=True)
    exact = await engine.add_request(make_request("exact", max_tokens=len(SCRIPT)), trusted=True)
    results = await asyncio.gather(collect(short), collect(long), collect(exact))
    await asyncio.sleep(0.05)
    return {"results": results, "in_flight": engine.num_in_flight, "healthy": engine.healthy}


async def scenario_abort(engine: Engine) -> dict[str, Any]:
    """Abort after the first output: async for stops quietly, get()/drain() raise, nothing more arrives."""
    stream = await engine.add_request(make_request("held-1", max_tokens=10_000), trusted=True)
    first = await stream.get()
    await engine.abort(["held-1", "never-sent"])
    after = [output async for output in stream]  # only what was already routed, then a quiet stop
    with pytest.raises(RequestAbortedError):
        await stream.get()
    with pytest.raises(RequestAbortedError):
        await stream.drain(0.05)
    await asyncio.sleep(0.05)
    return {
        "first_has_tokens": bool(first.new_token_ids),
        "after_abort_unfinished": all(o.finish_reason is None for o in after),
        "late_outputs": stream.listen(None),
        "finished": stream.finished,
        "in_flight": engine.num_in_flight,
    }


async def scenario_drain_and_listen(engine: Engine) -> dict[str, Any]:
    """drain() hands over everything buffered; a listener gets every output as it is routed."""
    drained_stream = await engine.add_request(make_request("drained", max_tokens=5), trusted=True)
    drained: list[EngineCoreOutput] = []
    while not (drained and drained[-1].finish_reason is not None):
        drained += await drained_stream.drain(5.0)
    listened_stream = await engine.add_request(make_request("listened", max_tokens=5), trusted=True)
    listener = Collector()
    outputs = listened_stream.listen(listener)
    listener.outputs[:0] = outputs
    if not any(o.finish_reason is not None for o in listener.outputs):
        await asyncio.wait_for(listener.done.wait(), 5.0)
    return {
        "drained": [(o.new_token_ids, o.finish_reason) for o in drained],
        "listened": [(o.new_token_ids, o.finish_reason) for o in listener.outputs],
        "listener_errors": listener.errors,
    }


async def scenario_refusals(engine: Engine) -> dict[str, Any]:
    """What add_request refuses before anything is sent."""
    refused: dict[str, str] = {}
    bad = make_request("bad")
    assert bad.sampling_params is not None
    bad.sampling_params.temperature = 5.0
    with pytest.raises(ValueError) as exc:
        await engine.add_request(bad)
    refused["temperature"] = type(exc.value).__name__
    await engine.add_request(make_request("held-dup", max_tokens=10_000), trusted=True)
    with pytest.raises(DuplicateRequestError) as dup:
        await engine.add_request(make_request("held-dup", max_tokens=10_000), trusted=True)
    refused["duplicate"] = type(dup.value).__name__
    await engine.abort(["held-dup"])
    too_long = make_request("too-long", prompt_len=engine.max_model_len)
    with pytest.raises(ValueError):
        await engine.add_request(too_long, trusted=True)
    return {"refused": refused, "in_flight": engine.num_in_flight}


SCENARIOS: list[Scenario] = [scenario_order_and_finish, scenario_abort, scenario_drain_and_listen, scenario_refusals]


def run_on_fake(scenario: Scenario) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        engine = FakeEngine(held_or_echo, max_model_len=32768)
        try:
            return await scenario(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def run_on_zmq_client(scenario: Scenario) -> dict[str, Any]:
    """The same scenario against EngineClient and a mock engine rank that emits SCRIPT for scripted requests."""
    port = free_port()

    async def main() -> dict[str, Any]:
        async with client_for(port) as client:
            return await scenario(client)

    # The mock gives the first requests of each scenario SCRIPT (scripts are used in arrival order);
    # "held*" requests get generated tokens, which run far longer than any scenario waits.
    scripted_requests: dict[Scenario, int] = {scenario_order_and_finish: 3, scenario_drain_and_listen: 2}
    scripted = scripted_requests.get(scenario, 0)
    with mock_threads(port, scripts=[SCRIPT] * scripted, step_interval_s=0.005):
        return asyncio.run(main())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_fake_engine_behaves_like_the_zmq_client(scenario: Scenario) -> None:
    fake = run_on_fake(scenario)
    real = run_on_zmq_client(scenario)
    assert fake == real


def test_default_script_finishes_as_max_tokens_says() -> None:
    assert run_on_fake(scenario_order_and_finish)["results"] == [
        (list(SCRIPT[:4]), FinishReason.LENGTH),
        ([*SCRIPT, EOS], FinishReason.STOP),
        (list(SCRIPT), FinishReason.LENGTH),
    ]

    async def main() -> None:
        engine = FakeEngine()
        no_eos = make_request("no-eos", max_tokens=100)
        assert no_eos.sampling_params is not None
        no_eos.sampling_params.eos_token_id = None
        assert await collect(await engine.add_request(no_eos)) == (list(DEFAULT_TOKENS), FinishReason.STOP)
        ignore = make_request("ignore", max_tokens=100, ignore_eos=True)
        assert await collect(await engine.add_request(ignore)) == (list(DEFAULT_TOKENS), FinishReason.STOP)
        await engine.close()

    asyncio.run(main())


# ---------------------------------------------------------------- FakeEngine's own controls


def test_records_added_and_aborted_requests() -> None:
    async def main() -> None:
        engine = FakeEngine(held_or_echo)
        a = await engine.add_request(make_request("a"), trusted=True)
        await engine.add_request(make_request("held-b"), trusted=True)
        assert engine.num_in_flight == 2 and engine.added_ids == ["a", "held-b"]
        await collect(a)
        await engine.abort(["held-b", "a", "unknown"])
        assert engine.aborted == ["held-b"]  # only what was in flight reaches an engine
        assert engine.abort_calls == [["held-b", "a", "unknown"]]
        assert engine.num_in_flight == 0
        assert engine.added[0].client_index == 0 and engine.added[0].prompt_block_hashes is None
        await engine.close()

    asyncio.run(main())


def test_outputs_of_one_step_arrive_together_and_in_order() -> None:
    def two_per_step(request: EngineCoreRequest) -> list[Step]:
        rid = request.request_id
        return [
            [EngineCoreOutput(rid, [1]), EngineCoreOutput(rid, [2])],
            [EngineCoreOutput(rid, [3], finish_reason=FinishReason.LENGTH)],
        ]

    async def main() -> None:
        engine = FakeEngine(two_per_step)
        stream = await engine.add_request(make_request("r"))
        assert [o.new_token_ids for o in await stream.drain(1.0)] == [[1], [2]]
        assert [o.new_token_ids for o in await stream.drain(1.0)] == [[3]]
        await engine.wait_idle()
        await engine.close()

    asyncio.run(main())


def test_step_interval_paces_outputs() -> None:
    async def main() -> None:
        engine = FakeEngine(step_interval_s=0.02)
        start = time.monotonic()
        tokens, finish = await collect(await engine.add_request(make_request("r", max_tokens=5)))
        assert len(tokens) == 5 and finish == FinishReason.LENGTH
        assert time.monotonic() - start >= 0.09
        await engine.close()

    asyncio.run(main())


def test_die_fails_in_flight_requests_and_refuses_new_ones() -> None:
    async def main() -> None:
        engine = FakeEngine(held_or_echo)
        stream = await engine.add_request(make_request("held"))
        listener = Collector()
        listened = await engine.add_request(make_request("held-listened"))
        listened.listen(listener)
        await stream.get()
        engine.die("test says so")
        with pytest.raises(EngineDeadError, match="test says so"):
            async for _ in stream:
                pass
        assert len(listener.errors) == 1 and isinstance(listener.errors[0], EngineDeadError)
        assert not engine.healthy and engine.num_in_flight == 0
        assert engine.health()["engines"][0]["status"] == "disconnected"
        assert engine.health()["degraded_ranks"] == [0]
        with pytest.raises(EngineUnavailableError):
            await engine.add_request(make_request("later"))
        engine.revive()
        assert engine.healthy and engine.health()["degraded_ranks"] == []
        assert (await collect(await engine.add_request(make_request("later"))))[1] == FinishReason.LENGTH
        await engine.close()

    asyncio.run(main())


def test_fail_next_add_and_close() -> None:
    async def main() -> None:
        engine = FakeEngine(held_or_echo)
        engine.fail_next_add(EngineUnavailableError("no healthy engine"))
        with pytest.raises(EngineUnavailableError):
            await engine.add_request(make_request("first"))
        assert engine.added == []
        held = await engine.add_request(make_request("held"))
        await engine.close()
        with pytest.raises(EngineUnavailableError, match="shutting down"):
            async for _ in held:  # what was routed before the close, then the error
                pass
        with pytest.raises(EngineUnavailableError, match="closed"):
            await engine.add_request(make_request("after-close"))
        assert not engine.healthy and engine.health()["healthy"] is False
        await engine.close()  # idempotent

    asyncio.run(main())


def test_hasher_attaches_the_prompt_block_hashes() -> None:
    config = HashConfig.default(16)

    async def main() -> None:
        engine = FakeEngine(hasher=PromptHasher(config))
        request = make_request("hashed", prompt_len=40)
        await collect(await engine.add_request(request))
        assert request.prompt_token_ids is not None and request.prompt_block_hashes is not None
        blob = request.prompt_block_hashes
        assert unpack_block_hashes(blob, 16, 40) == block_hashes(request.prompt_token_ids, config)
        shared = await engine.add_request(make_request("child", prompt_len=40), prompt_block_hashes=blob)
        await collect(shared)
        assert engine.added[-1].prompt_block_hashes is blob  # n > 1 children share the parent's hashes
        assert "hashed by pyfront" in engine.health()["front_end_block_hashing"]
        await engine.close()

    asyncio.run(main())


def test_a_fake_engine_serves_several_event_loops() -> None:
    engine = FakeEngine()
    for _ in range(2):
        assert asyncio.run(collect_one(engine))[1] == FinishReason.LENGTH


async def collect_one(engine: FakeEngine) -> tuple[list[int], int | None]:
    return await collect(await engine.add_request(make_request(f"r{len(engine.added)}")))
