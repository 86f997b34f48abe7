"""The mock engine's simulated prefix cache and its KV cache events, read the way a subscriber reads a vLLM engine's.

Each test runs the mock (in this process, or as a subprocess for the command line) behind pyfront's EngineClient,
subscribes with a raw ZMQ SUB (and a DEALER on the replay socket), decodes with
pyfront.engine_client.kv_events.decode_batch and checks the events against the feh1 recipe: what vLLM 0.32's
BlockPool would publish for the same requests (block_pool.py), and the request's prefill_stats against its
scheduler (vllm/v1/core/sched/scheduler.py, vllm/v1/metrics/stats.py PrefillStats).

A SUB socket misses what a publisher sent before the subscription reached it; `EventStream` fills such gaps from
the replay socket, as a subscriber of a real engine must, so every test sees every batch from seq 0 on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import zmq

from pyfront.engine_client import codec, mock_prefix_cache
from pyfront.engine_client.client import EngineClient
from pyfront.engine_client.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    block_key,
    decode_batch,
    resolve_endpoints,
)
from pyfront.engine_client.mock_engine import MockConfig, MockEngine, MockEngineRank, parse_args
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, SamplingParams
from pyfront.hashing import ALGORITHM, HashConfig, block_hashes, default_none_hash, pack_block_hashes, seeded_none_hash
from tests.conftest import free_port
from tests.engine_client.test_engine_client import client_for, mock_process

BLOCK = 16
EOS = 151645
FEH1 = HashConfig.default(BLOCK)
KV_EVENTS_KEYS = [
    "enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size",
    "topic",
]  # fmt: skip
"""vLLM 0.32's KVEventsConfig fields, in declaration order (the order of the registration's map)."""

_ids = itertools.count()


def prompt(length: int, seed: int) -> list[int]:
    """Token ids no other seed's prompt shares (so no two prompts of a test share a block by accident)."""
    return [seed * 1000 + i for i in range(length)]


def port_ranges(count: int, width: int = 1) -> list[int]:
    """`count` bases of disjoint runs of `width` consecutive TCP ports on 127.0.0.1 that were free a moment ago
    (a rank r publishes on base + r)."""
    bases: list[int] = []
    while len(bases) < count:
        base = free_port()
        if any(abs(base - other) < width for other in bases):
            continue
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + width):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            bases.append(base)
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    return bases


def events_config(endpoint: str, replay: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": replay, **extra}


@dataclass
class Received:
    seq: int
    topic: bytes
    batch: EventBatch
    live: bool
    """True when the SUB socket delivered it, False when the replay socket did."""


class EventStream:
    """One rank's batches in seq order from 0: a raw SUB (connected, or bound for a publisher that connects),
    with gaps filled from the replay socket."""

    def __init__(self, ctx: zmq.Context, endpoint: str, replay: str | None, *, bind: bool = False, topic: bytes = b""):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        if bind:
            self.sub.bind(endpoint)
        else:
            self.sub.connect(endpoint)
        self.dealer: zmq.Socket | None = None
        if replay is not None:
            self.dealer = ctx.socket(zmq.DEALER)
            self.dealer.setsockopt(zmq.LINGER, 0)
            self.dealer.connect(replay)
        self.next_seq = 0
        self.pending: deque[Received] = deque()

    def replay(self, start: int) -> list[tuple[bytes, int, bytes]]:
        """(topic, seq, payload) of every buffered batch from `start` on, as the replay socket answers."""
        assert self.dealer is not None
        self.dealer.send_multipart([b"", start.to_bytes(8, "big")])
        batches = []
        while True:
            assert self.dealer.poll(20_000), "the replay socket did not answer"
            frames = self.dealer.recv_multipart()
            assert len(frames) == 4 and frames[0] == b"", frames
            _, topic, seq, payload = frames
            if seq == END_SEQ:
                assert (topic, payload) == (b"", b"")
                return batches
            batches.append((topic, int.from_bytes(seq, "big"), payload))

    def _fill(self, upto: int | None) -> None:
        """Batches next_seq.. (up to `upto`, excluded) from the replay socket."""
        for topic, seq, payload in self.replay(self.next_seq):
            if upto is None or seq < upto:
                assert seq == self.next_seq + len(self.pending), "the replay buffer lost batches"
                self.pending.append(Received(seq, topic, decode_batch(payload), live=False))

    def next(self, timeout_s: float = 20.0) -> Received:
        deadline = time.monotonic() + timeout_s
        while not self.pending:
            assert time.monotonic() < deadline, f"no KV event batch {self.next_seq} within {timeout_s} s"
            if self.sub.poll(200):
                topic, seq_bytes, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big")
                if seq < self.next_seq:
                    continue  # the replay socket gave it already
                if seq > self.next_seq:
                    self._fill(seq)
                assert seq == self.next_seq + len(self.pending)
                self.pending.append(Received(seq, topic, decode_batch(payload), live=True))
            elif self.dealer is not None:
                self._fill(None)
        received = self.pending.popleft()
        self.next_seq += 1
        return received

    def batches(self, count: int) -> list[EventBatch]:
        return [self.next().batch for _ in range(count)]

    def close(self) -> None:
        self.sub.close(0)
        if self.dealer is not None:
            self.dealer.close(0)


@contextmanager
def mock_engine(port: int | None = None, **options: Any) -> Iterator[tuple[int, MockEngine]]:
    """An in-process mock engine with the prefix cache on; yields (handshake port, engine)."""
    port = port or free_port()
    settings: dict[str, Any] = {"step_interval_s": 0.002, "enable_prefix_caching": True, "block_size": BLOCK}
    settings.update(options)
    engine = MockEngine(MockConfig(handshake_address=f"tcp://127.0.0.1:{port}", **settings)).start()
    try:
        yield port, engine
    finally:
        engine.stop()


@contextmanager
def subscriber(endpoint: str, replay: str | None = None, **kwargs: Any) -> Iterator[EventStream]:
    ctx = zmq.Context()
    stream = EventStream(ctx, endpoint, replay, **kwargs)
    try:
        yield stream
    finally:
        stream.close()
        ctx.term()


@contextmanager
def engine_with_events(
    events_options: dict[str, Any] | None = None, **options: Any
) -> Iterator[tuple[int, EventStream]]:
    """A mock engine publishing on free ports (with a replay socket), and a subscriber: (handshake port, stream)."""
    handshake, events, replay = port_ranges(3)
    config = events_config(f"tcp://*:{events}", f"tcp://*:{replay}", **(events_options or {}))
    topic = str(config.get("topic", "")).encode()
    with (
        mock_engine(handshake, kv_events_config=config, **options) as (port, _),
        subscriber(f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}", topic=topic) as stream,
    ):
        yield port, stream


@asynccontextmanager
async def client(port: int, size: int = 1, feh: bool = False) -> AsyncIterator[EngineClient]:
    async with client_for(port, size, feh_enabled=feh) as engine_client:
        yield engine_client


async def generate(
    engine_client: EngineClient,
    ids: Sequence[int],
    max_tokens: int = 1,
    *,
    salt: str | None = None,
    rank: int | None = None,
    blob: bytes | None = None,
    session_id: str | None = None,
    **sampling: Any,
) -> list[EngineCoreOutput]:
    """Every output of one request, run to its end."""
    params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS, **sampling)
    request = EngineCoreRequest(f"r{next(_ids)}", list(ids), None, params, None, time.time(), None, salt, None)
    request.session_id = session_id
    stream = await engine_client.add_request(request, rank=rank, prompt_block_hashes=blob)
    return [output async for output in stream]


def tokens_of(outputs: list[EngineCoreOutput]) -> list[int]:
    return [t for output in outputs for t in output.new_token_ids]


def keys(digests: Sequence[bytes]) -> list[int]:
    return [block_key(d) for d in digests]


def stored(batch: EventBatch) -> BlockStored:
    """The batch's one event, a BlockStored."""
    assert len(batch.events) == 1 and isinstance(batch.events[0], BlockStored), batch.events
    return batch.events[0]


def check_stored(
    event: BlockStored,
    sequence: list[int],
    first: int,
    last: int,
    salt: str | None = None,
    config: HashConfig = FEH1,
    session_id: str | None = None,
) -> None:
    """`event` stores blocks first..last-1 of `sequence` (prompt + output) exactly as vLLM's cache_full_blocks."""
    chain = block_hashes(sequence, config, salt)
    assert event.block_hashes == keys(chain[first:last])
    assert event.parent_block_hash == (block_key(chain[first - 1]) if first else None)
    assert event.token_ids == sequence[first * BLOCK : last * BLOCK]
    assert (event.block_size, event.lora_id, event.medium, event.lora_name, event.group_idx) == (
        BLOCK, None, "GPU", None, 0,
    )  # fmt: skip
    assert event.extra_keys == [(salt,) if salt and first + i == 0 else None for i in range(last - first)]
    assert (event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window) == ("full_attention", None)
    assert (event.locality, event.ownership, event.session_id) == (None, None, session_id)


async def stats(engine_client: EngineClient, rank: int = 0) -> dict[str, Any]:
    return await engine_client.call_utility("mock_stats", rank=rank)


async def wait_for_batches(engine_client: EngineClient, count: int, rank: int = 0) -> dict[str, Any]:
    """mock_stats once the publisher has sent `count` batches (it counts after sending)."""
    latest: dict[str, Any] = {}

    async def sent() -> bool:
        latest.update(await stats(engine_client, rank))
        return latest["kv_event_batches"] >= count

    deadline = time.monotonic() + 20
    while not await sent():
        assert time.monotonic() < deadline, f"the publisher did not count {count} batches: {latest}"
        await asyncio.sleep(0.02)
    return latest


# --------------------------------------------------------------------------------------------- BlockStored


@pytest.mark.parametrize("feh", [False, True], ids=["recomputed", "feh-blob"])
def test_block_stored_events_are_the_feh1_chain(feh: bool) -> None:
    """Prompt blocks on admission, decode blocks once their last token's KV is computed (never the final token's)."""
    with engine_with_events(advertise_feh=feh) as (port, stream):

        async def main() -> list[list[int]]:
            async with client(port, feh=feh) as c:
                assert (c.negotiation.config is not None) == feh
                runs = [
                    (prompt(50, 1), 1, None),
                    (prompt(40, 2), 1, "tenant-a"),
                    (prompt(40, 3), 30, None),  # 70 tokens, 69 computed: decode blocks 2 and 3
                    (prompt(34, 4), 14, None),  # 48 tokens, 47 computed: block 2 never fills
                    (prompt(34, 5), 15, "tenant-b"),  # 49 tokens, 48 computed: block 2 in the last step
                ]
                sequences = []
                for ids, max_tokens, salt in runs:
                    outputs = await generate(c, ids, max_tokens, salt=salt, session_id=salt and f"session-{salt}")
                    assert len(tokens_of(outputs)) == max_tokens
                    sequences.append(ids + tokens_of(outputs))
                counters = await wait_for_batches(c, 8)
                assert counters["hashes_used"] == (5 if feh else 0)
                assert counters["cache_blocks_stored"] == 3 + 2 + 4 + 2 + 3
                assert counters["kv_event_batches"] == 8
                return sequences

        s1, s2, s3, s4, s5 = asyncio.run(main())
        batches = stream.batches(8)
    assert all(b.data_parallel_rank == 0 and isinstance(b.ts, float) for b in batches)
    check_stored(stored(batches[0]), s1, 0, 3)
    check_stored(stored(batches[1]), s2, 0, 2, salt="tenant-a", session_id="session-tenant-a")
    check_stored(stored(batches[2]), s3, 0, 2)
    check_stored(stored(batches[3]), s3, 2, 3)
    check_stored(stored(batches[4]), s3, 3, 4)
    check_stored(stored(batches[5]), s4, 0, 2)
    check_stored(stored(batches[6]), s5, 0, 2, salt="tenant-b", session_id="session-tenant-b")
    check_stored(stored(batches[7]), s5, 2, 3, salt="tenant-b", session_id="session-tenant-b")  # after block 0


def test_a_feh_blob_is_used_as_sent() -> None:
    """An FEH engine caches under the hashes it is sent; the mock does too (and counts the blob as mismatched)."""
    ids, wrong = prompt(40, 6), [bytes([n]) * 32 for n in (1, 2)]
    with engine_with_events(advertise_feh=True) as (port, stream):

        async def main() -> None:
            async with client(port, feh=True) as c:
                await generate(c, ids, blob=pack_block_hashes(wrong, BLOCK))
                assert (await stats(c))["hashes_mismatched"] == 1

        asyncio.run(main())
        event = stored(stream.next().batch)
    assert event.block_hashes == keys(wrong) and event.parent_block_hash is None and event.token_ids == ids[:32]


# ------------------------------------------------------------------------------------------ prefill_stats


def test_num_cached_tokens_on_repeated_and_extended_prompts() -> None:
    """prefill_stats in the first output only, as vLLM 0.32's scheduler sets and finalizes it."""
    p, q = prompt(50, 10), prompt(64, 12)
    extended = p + prompt(20, 11)
    with engine_with_events() as (port, stream):

        async def main() -> list[tuple[int, ...]]:
            async with client(port) as c:
                results = []
                for ids, sampling in [
                    (p, {}),
                    (p, {}),
                    (extended, {}),
                    (q, {}),
                    (q, {}),  # fully cached: the last block is recomputed (and stored again)
                    (p, {"prompt_logprobs": 0}),  # skips reading the cache, stores all the same
                    (p, {"skip_reading_prefix_cache": True}),
                ]:
                    outputs = await generate(c, ids, 3, **sampling)
                    assert len(outputs) == 3 and all(o.prefill_stats is None for o in outputs[1:])
                    ps = outputs[0].prefill_stats
                    assert ps is not None
                    results.append((
                            ps.num_prompt_tokens, ps.num_computed_tokens, ps.num_cached_tokens,
                            ps.num_local_cached_tokens, ps.num_external_cached_tokens, ps.num_cache_creation_tokens,
                        ))  # fmt: skip
                counters = await wait_for_batches(c, 6)
                assert counters["cache_queried_tokens"] == 50 + 50 + 70 + 64 + 64
                assert counters["cache_hit_tokens"] == 48 + 48 + 48
                assert counters["cache_blocks_stored"] == counters["cache_blocks"] == 3 + 1 + 4 + 1 + 3 + 3
                assert counters["cache_blocks_evicted"] == 0
                return results

        assert asyncio.run(main()) == [
            (50, 50, 0, 0, 0, 48),
            (50, 2, 48, 48, 0, 0),
            (70, 22, 48, 48, 0, 16),
            (64, 64, 0, 0, 0, 64),
            (64, 16, 48, 48, 0, 16),
            (50, 50, 0, 0, 0, 48),
            (50, 50, 0, 0, 0, 48),
        ]
        batches = stream.batches(6)  # the repeat of p stores nothing: no batch
    check_stored(stored(batches[0]), p, 0, 3)
    check_stored(stored(batches[1]), extended, 3, 4)
    check_stored(stored(batches[2]), q, 0, 4)
    check_stored(stored(batches[3]), q, 3, 4)  # a second copy of block 3, as vLLM (no de-duplication)
    check_stored(stored(batches[4]), p, 0, 3)
    check_stored(stored(batches[5]), p, 0, 3)


# ------------------------------------------------------------------------------- eviction and reset


def test_lru_eviction_emits_block_removed_tail_first() -> None:
    """Capacity 4: a hit makes blocks recent; a request's blocks go back to the LRU last block first."""
    a, b, c_ = prompt(33, 20), prompt(33, 21), prompt(33, 22)
    with engine_with_events(prefix_cache_blocks=4) as (port, stream):

        async def main() -> list[int]:
            async with client(port) as c:
                cached = []
                for ids in (a, b, a, c_, a, b):
                    outputs = await generate(c, ids)
                    assert outputs[0].prefill_stats is not None
                    cached.append(outputs[0].prefill_stats.num_cached_tokens)
                counters = await wait_for_batches(c, 4)
                assert (counters["cache_blocks_evicted"], counters["cache_blocks"]) == (4, 4)
                return cached

        assert asyncio.run(main()) == [0, 0, 32, 0, 32, 0]
        batches = stream.batches(4)
    ha, hb, hc = (keys(block_hashes(ids, FEH1)) for ids in (a, b, c_))
    check_stored(stored(batches[0]), a, 0, 2)
    check_stored(stored(batches[1]), b, 0, 2)
    # c evicts b (a was touched by its hit): b's last block first, then one BlockStored for c.
    assert batches[2].events[:2] == [BlockRemoved([hb[1]], "GPU", 0), BlockRemoved([hb[0]], "GPU", 0)]
    check_stored(batches[2].events[2], c_, 0, 2)
    # a hits again; b comes back and evicts c, the least recently used.
    assert batches[3].events[:2] == [BlockRemoved([hc[1]], "GPU", 0), BlockRemoved([hc[0]], "GPU", 0)]
    check_stored(batches[3].events[2], b, 0, 2)
    removed = [h for batch in batches for e in batch.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert not set(ha) & set(removed)


def test_reset_prefix_cache_emits_all_blocks_cleared_with_the_next_step() -> None:
    """vLLM publishes AllBlocksCleared in the next step's batch; it refuses while requests hold blocks unless told
    to preempt them, and a preempted request caches its blocks again from block 0."""
    p, long_prompt = prompt(50, 30), prompt(40, 31)
    with engine_with_events() as (port, stream):

        async def main() -> list[EventBatch]:
            async with client(port) as c:
                await generate(c, p)
                assert await c.call_utility("reset_prefix_cache", rank=0) is True  # idle: no step, no batch yet
                outputs = await generate(c, p)
                assert outputs[0].prefill_stats is not None and outputs[0].prefill_stats.num_cached_tokens == 0
                params = SamplingParams(max_tokens=100_000, eos_token_id=EOS)
                request = EngineCoreRequest("long", long_prompt, None, params, None, time.time(), None, None, None)
                running = await c.add_request(request)
                await running.get()
                assert await c.call_utility("reset_prefix_cache", rank=0) is False
                assert await c.call_utility("reset_prefix_cache", True, rank=0) is True
                seen = await asyncio.to_thread(_until_second_clear, stream)
                await c.abort(["long"])
                assert await c.call_utility("reset_prefix_cache", rank=0) is True
                return seen

        batches = asyncio.run(main())
    check_stored(stored(batches[0]), p, 0, 3)
    assert isinstance(batches[1].events[0], AllBlocksCleared) and len(batches[1].events) == 2
    check_stored(batches[1].events[1], p, 0, 3)
    check_stored(stored(batches[2]), long_prompt, 0, 2)
    decoded = [stored(batch) for batch in batches[3:-1]]  # decode blocks until the reset, one per batch
    last = batches[-1]
    assert isinstance(last.events[0], AllBlocksCleared) and len(last.events) == 2
    rebuilt = last.events[1]
    assert isinstance(rebuilt, BlockStored) and rebuilt.token_ids[:32] == long_prompt[:32]
    check_stored(rebuilt, rebuilt.token_ids, 0, len(rebuilt.block_hashes))
    before = [h for event in [stored(batches[2]), *decoded] for h in event.block_hashes]
    assert rebuilt.block_hashes[: len(before)] == before and len(rebuilt.block_hashes) >= len(before)


def _until_second_clear(stream: EventStream) -> list[EventBatch]:
    """Batches up to the second one that starts with AllBlocksCleared."""
    seen: list[EventBatch] = []
    while sum(isinstance(b.events[0], AllBlocksCleared) for b in seen) < 2:
        seen.append(stream.next().batch)
    return seen


# ------------------------------------------------------------------------------- seq, topic and replay


def test_replay_from_a_start_seq_with_topic_and_a_bounded_buffer() -> None:
    """The replay ROUTER answers [b"", topic, seq, payload] per buffered batch from start_seq on, then END_SEQ."""
    prompts = [prompt(20, 40 + n) for n in range(5)]
    with engine_with_events({"topic": "kv@mock", "buffer_steps": 3}) as (port, stream):
        before = time.time()

        async def main() -> None:
            async with client(port) as c:
                for ids in prompts:
                    await generate(c, ids)
                assert (await wait_for_batches(c, 5))["kv_event_batches"] == 5

        asyncio.run(main())
        after = time.time()
        everything = stream.replay(0)
        assert [(topic, seq) for topic, seq, _ in everything] == [(b"kv@mock", seq) for seq in (2, 3, 4)]
        assert [seq for _, seq, _ in stream.replay(3)] == [3, 4]
        assert stream.replay(5) == []
        assert stream.dealer is not None
        stream.dealer.send_multipart([b"", b"not", b"a request"])  # four frames at the ROUTER: ignored
        assert [seq for _, seq, _ in stream.replay(4)] == [4]
    for (_, _, payload), ids in zip(everything, prompts[2:], strict=True):
        batch = decode_batch(payload)
        assert before <= batch.ts <= after and batch.data_parallel_rank == 0
        check_stored(stored(batch), ids, 0, 1)


# ------------------------------------------------------------------------------------ hashes and seeds


@pytest.mark.parametrize("feh", [False, True], ids=["recomputed", "feh-blob"])
def test_hash_seed_changes_the_engines_hashes(feh: bool) -> None:
    """--hash-seed is the engine's PYTHONHASHSEED: a subscriber hashing with the default none_hash gets other
    hashes (and must recompute chains from the events' token ids); an FEH front end hashes with the advertised one."""
    seeded = HashConfig(ALGORITHM, BLOCK, seeded_none_hash("1234"))
    assert seeded.none_hash != default_none_hash()
    ids = prompt(40, 45)
    with engine_with_events(hash_seed="1234", advertise_feh=feh) as (port, stream):

        async def main() -> None:
            async with client(port, feh=feh) as c:
                assert c.negotiation.config == (seeded if feh else None)
                await generate(c, ids)
                counters = await stats(c)
                assert (counters["hashes_used"], counters["hashes_mismatched"]) == ((1, 0) if feh else (0, 0))

        asyncio.run(main())
        event = stored(stream.next().batch)
    check_stored(event, ids, 0, 2, config=seeded)
    assert not set(event.block_hashes) & set(keys(block_hashes(event.token_ids, FEH1)))


def test_block_hashes_as_digests_when_int_hashes_are_off() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the events carry the 32-byte digests, parents and removals too."""
    a, b = prompt(33, 46), prompt(33, 47)
    with engine_with_events(kv_events_int_hashes=False, prefix_cache_blocks=2) as (port, stream):

        async def main() -> None:
            async with client(port) as c:
                await generate(c, a, 17)  # 50 tokens, 49 computed: a third block from the decode
                await generate(c, b)

        asyncio.run(main())
        first, decoded, second = stream.batches(3)
    ha = block_hashes(a + [0] * 17, FEH1)[:2]
    hb = block_hashes(b, FEH1)
    assert stored(first).block_hashes == ha and stored(first).parent_block_hash is None
    assert stored(decoded).parent_block_hash == ha[1] and isinstance(stored(decoded).block_hashes[0], bytes)
    # b needs two blocks in a cache of two: a's three blocks (one over capacity while a ran) go, last block first.
    removed = [e.block_hashes[0] for e in second.events if isinstance(e, BlockRemoved)]
    assert removed == [*stored(decoded).block_hashes, ha[1], ha[0]]
    assert second.events[-1].block_hashes == hb


# -------------------------------------------------------------------------- endpoints, ranks, registration


async def until_live(engine_client: EngineClient, stream: EventStream, rank: int = 0) -> int:
    """Send small requests until the SUB socket delivers (without a replay socket, what a publisher sends before
    the connection and subscription are up is lost); every later batch arrives. The seq of the last one."""
    for attempt in range(100):
        await generate(engine_client, prompt(17, 500 + 10 * attempt + rank), rank=rank)
        if await asyncio.to_thread(stream.sub.poll, 200):
            break
    else:
        raise AssertionError("no KV event batch reached the SUB socket")
    seq = -1
    while seq < attempt:  # one batch per attempt; in order and lossless from the first one received on
        frames = await asyncio.to_thread(stream.sub.recv_multipart)
        seq = int.from_bytes(frames[1], "big")
    return seq


async def next_live(stream: EventStream) -> tuple[int, EventBatch]:
    assert await asyncio.to_thread(stream.sub.poll, 20_000), "no live KV event batch"
    _, seq, payload = await asyncio.to_thread(stream.sub.recv_multipart)
    return int.from_bytes(seq, "big"), decode_batch(payload)


def test_subscriber_binds_when_the_endpoint_names_a_host() -> None:
    """tcp://HOST:P: the engine's PUB connects (vLLM's rule), so the subscriber binds; no replay socket here."""
    events = free_port()
    endpoint = f"tcp://127.0.0.1:{events}"
    ids = prompt(40, 55)
    with (
        subscriber(endpoint, None, bind=True) as stream,
        mock_engine(kv_events_config=events_config(endpoint)) as (
            port,
            _,
        ),
    ):

        async def main() -> None:
            async with client(port) as c:
                registered = c.engines[0].registration.kv_events_config
                assert registered is not None and registered["endpoint"] == endpoint
                assert registered["replay_endpoint"] is None
                resolved = resolve_endpoints(registered, 0, "127.0.0.1", offset=False)
                assert resolved is not None and resolved.subscriber_binds
                last = await until_live(c, stream)
                await generate(c, ids)
                seq, batch = await next_live(stream)
                assert seq == last + 1
                check_stored(stored(batch), ids, 0, 2)

        asyncio.run(main())


def test_wildcard_port_zero_binds_a_port_per_rank() -> None:
    """tcp://*:0 is not offset; each rank binds a port of its own and registers the endpoint it bound."""
    with mock_engine(ranks=[0, 1], kv_events_config=events_config("tcp://*:0", "tcp://*:0")) as (port, _):

        async def main() -> None:
            async with client(port, 2) as c:
                registered = [c.engines[rank].registration.kv_events_config for rank in (0, 1)]
                endpoints = [cfg[key] for cfg in registered for key in ("endpoint", "replay_endpoint")]
                assert all(e.startswith("tcp://127.0.0.1:") and not e.endswith(":0") for e in endpoints)
                assert len(set(endpoints)) == 4
                for rank, cfg in enumerate(registered):
                    with subscriber(cfg["endpoint"], cfg["replay_endpoint"]) as stream:
                        last = await until_live(c, stream, rank)
                        ids = prompt(40, 56 + rank)
                        await generate(c, ids, rank=rank)
                        seq, batch = await next_live(stream)
                        assert (seq, batch.data_parallel_rank) == (last + 1, rank)
                        check_stored(stored(batch), ids, 0, 2)
                        assert [s for _, s, _ in stream.replay(seq)] == [seq]

        asyncio.run(main())


def test_two_ranks_of_one_process_publish_on_rank_offset_endpoints() -> None:
    """The command line: each rank's endpoints are the flag's plus its rank, as its registration says."""
    port, events, replay = port_ranges(3, width=2)
    flag = json.dumps(events_config(f"tcp://*:{events}", f"tcp://*:{replay}", topic="kv"), separators=(",", ":"))
    args = ("--step-interval", "0.002", "--enable-prefix-caching", "--kv-events-config", flag)
    with mock_process(port, [0, 1], *args), contextmanager_pair(events, replay) as streams:

        async def main() -> None:
            async with client(port, 2) as c:
                for rank in (0, 1):
                    registered = c.engines[rank].registration.kv_events_config
                    assert registered is not None and list(registered) == KV_EVENTS_KEYS
                    assert registered == {
                        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events + rank}",
                        "replay_endpoint": f"tcp://*:{replay + rank}", "buffer_steps": 10_000, "hwm": 100_000,
                        "max_queue_size": 100_000, "topic": "kv",
                    }  # fmt: skip
                for rank in (0, 1):
                    await generate(c, prompt(40, 60 + rank), rank=rank)

        asyncio.run(main())
        for rank, stream in enumerate(streams):
            received = stream.next()
            assert (received.topic, received.batch.data_parallel_rank) == (b"kv", rank)
            check_stored(stored(received.batch), prompt(40, 60 + rank), 0, 2)


@contextmanager
def contextmanager_pair(events: int, replay: int) -> Iterator[list[EventStream]]:
    """Subscribers of ranks 0 and 1 (ports events + rank, replay + rank)."""
    with (
        subscriber(f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}", topic=b"kv") as first,
        subscriber(f"tcp://127.0.0.1:{events + 1}", f"tcp://127.0.0.1:{replay + 1}", topic=b"kv") as second,
    ):
        yield [first, second]


def _registered(kv_events: dict[str, Any] | None, rank: int = 0) -> dict[str, Any] | None:
    """What a rank (not started) registers with, its publisher shut down again."""
    ctx = zmq.Context()
    config = MockConfig(handshake_address="tcp://127.0.0.1:1", enable_prefix_caching=True)
    resolved = None if kv_events is None else mock_prefix_cache.resolve_kv_events_config(kv_events)
    engine_rank = MockEngineRank(config, rank, ctx, threading.Event(), resolved)
    try:
        registration = engine_rank.registration()
        assert codec.decode_ready_response(codec.encode_ready_response(registration)) == registration
        return registration.kv_events_config
    finally:
        if engine_rank.publisher is not None:
            engine_rank.publisher.shutdown()
        ctx.term()


def test_registration_carries_the_resolved_publisher_config() -> None:
    """vLLM 0.32's scheduler.get_kv_event_publisher_config(): None without a ZMQ publisher, else every
    KVEventsConfig field with the endpoints offset by the rank (a dataclass: a map of all fields on the wire)."""
    assert _registered(None) is None
    assert _registered({"enable_kv_cache_events": False, "endpoint": "tcp://*:1"}) is None
    assert _registered({"enable_kv_cache_events": True, "publisher": "null"}) is None
    assert _registered({"publisher": "zmq"}) is None  # events off: vLLM warns and publishes nothing
    events, replay = port_ranges(2, width=4)
    registered = _registered(events_config(f"tcp://*:{events}", f"tcp://*:{replay}", hwm=5, topic="x"), rank=3)
    assert registered is not None and list(registered) == KV_EVENTS_KEYS
    assert registered == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events + 3}",
        "replay_endpoint": f"tcp://*:{replay + 3}", "buffer_steps": 10_000, "hwm": 5, "max_queue_size": 100_000,
        "topic": "x",
    }  # fmt: skip
    connecting = _registered(events_config("tcp://127.0.0.1:7000"), rank=2)
    assert connecting is not None and connecting["endpoint"] == "tcp://127.0.0.1:7002"
    inproc = _registered({"enable_kv_cache_events": True, "endpoint": "inproc://kv"}, rank=2)
    assert inproc is not None and inproc["endpoint"] == "inproc://kv_dp2"


def test_command_line_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--handshake-address", "tcp://127.0.0.1:1"]
    flag = '{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000","topic":"t"}'
    config = parse_args([
        *base, "--enable-prefix-caching", "--prefix-cache-blocks", "64", "--hash-seed", "7",
        "--prefill-tokens-per-ms", "2.5", "--kv-events-config", flag,
    ])  # fmt: skip
    assert (config.enable_prefix_caching, config.prefix_cache_blocks, config.hash_seed) == (True, 64, "7")
    assert (config.prefill_tokens_per_ms, config.kv_events_int_hashes) == (2.5, True)
    assert config.kv_events_config == json.loads(flag)
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert parse_args([*base, "--kv-events-config", flag]).kv_events_int_hashes is False
    default = parse_args(base)
    assert (default.enable_prefix_caching, default.kv_events_config, default.prefill_tokens_per_ms) == (
        False, None, None,
    )  # fmt: skip
    for bad in ('{"enable_kv_cache_events":1}', '{"publisher":"kafka"}', '{"endpoints":"x"}', "[1]", "nope"):
        with pytest.raises(SystemExit):
            parse_args([*base, "--kv-events-config", bad])
    with pytest.raises(SystemExit):
        parse_args([*base, "--hash-seed", "1", "--feh-none-hash", "00" * 32])


# ------------------------------------------------------------------------------ rank logic, no sockets


def _rank(**options: Any) -> tuple[MockEngineRank, list[EngineCoreOutputs], zmq.Context]:
    """A rank driven by hand (handle_add, step, handle_utility) whose outputs are collected instead of sent."""
    ctx = zmq.Context()
    rank = MockEngineRank(MockConfig(handshake_address="tcp://127.0.0.1:1", **options), 0, ctx, threading.Event())
    sent: list[EngineCoreOutputs] = []
    rank.send = lambda client_index, outputs: sent.append(outputs)  # type: ignore[method-assign]
    return rank, sent, ctx


def _request(request_id: str, ids: list[int], max_tokens: int = 1) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=max_tokens, eos_token_id=EOS)
    return EngineCoreRequest(request_id, ids, None, params, None, time.time(), None, None, None)


def test_prefill_clock_serializes_the_prefills_of_uncached_tokens() -> None:
    """Each prefill starts when the rank's previous one ends and takes uncached tokens / rate; decode keeps the tick."""
    rank, sent, ctx = _rank(enable_prefix_caching=True, prefill_tokens_per_ms=0.001)  # 1 s per token
    for request_id, ids in (("a", prompt(1000, 60)), ("b", prompt(50, 61)), ("c", prompt(50, 61))):
        rank.handle_add(_request(request_id, ids, 3))
    a, b, c = (rank.running[request_id] for request_id in "abc")
    assert a.first_token_at - a.prefill_start == pytest.approx(1000)
    assert b.prefill_start == a.first_token_at and b.first_token_at - b.prefill_start == pytest.approx(50)
    assert c.prefill_start == b.first_token_at and c.first_token_at - c.prefill_start == pytest.approx(2)
    assert rank.next_first_token() == a.first_token_at
    rank.step()
    assert sent == [] and not a.output  # nothing is due
    a.first_token_at = 0.0  # a's prefill is over
    rank.step(decode=False)
    [first] = sent
    assert [o.request_id for o in first.outputs] == ["a"] and first.outputs[0].prefill_stats is not None
    assert first.scheduler_stats is not None
    assert (first.scheduler_stats.num_running_reqs, first.scheduler_stats.num_waiting_reqs) == (1, 2)
    rank.step(decode=False)  # a decodes on step ticks only
    assert len(sent) == 1 and len(a.output) == 1
    rank.step()
    assert len(sent) == 2 and len(a.output) == 2
    assert rank.next_first_token() == b.first_token_at
    ctx.term()


def test_a_short_prefill_waits_behind_a_long_one() -> None:
    """End to end: with the prefill clock the second request's first token cannot come before the first's."""
    with mock_engine(prefill_tokens_per_ms=5.0) as (port, _):  # 1000 uncached tokens: 200 ms; 20: 4 ms

        async def main() -> None:
            async with client(port) as c:
                long_stream = await c.add_request(_request("long", prompt(1000, 62)))
                short_stream = await c.add_request(_request("short", prompt(20, 63)))
                long_first = asyncio.create_task(long_stream.get())
                short_first = asyncio.create_task(short_stream.get())
                done, _ = await asyncio.wait({long_first, short_first}, return_when=asyncio.FIRST_COMPLETED)
                assert long_first in done
                await short_first

        asyncio.run(main())


def test_an_aborted_request_releases_its_blocks() -> None:
    rank, sent, ctx = _rank(enable_prefix_caching=True, prefix_cache_blocks=3)
    rank.handle_add(_request("x", prompt(50, 64), 100))
    rank.handle_input(codec.encode_abort(["x"]))
    rank.handle_add(_request("y", prompt(50, 65)))
    counters = rank.stats()
    assert (counters["cache_blocks"], counters["cache_blocks_evicted"], counters["cache_blocks_stored"]) == (3, 3, 6)
    assert sent == []
    ctx.term()


def test_without_the_new_flags_the_mock_behaves_as_before() -> None:
    """No prefill_stats, no kv_events_config, reset_prefix_cache always true, zero cache counters."""
    rank, sent, ctx = _rank()
    assert rank.registration().kv_events_config is None
    rank.handle_add(_request("x", prompt(50, 66), 5))
    rank.step()
    rank.handle_utility(0, 7, "reset_prefix_cache", [])
    output, reply = sent
    assert output.outputs[0].prefill_stats is None and len(output.outputs[0].new_token_ids) == 1
    assert reply.utility_output is not None and reply.utility_output.result is not None
    assert reply.utility_output.result.result is True
    counters = rank.stats()
    assert counters["prefix_caching"] is False
    assert [counters[k] for k in counters if k.startswith(("cache_", "kv_event"))] == [0] * 6
    ctx.term()
