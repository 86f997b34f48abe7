"""The KV event subscriber (engine_client/kv_subscriber.py) against a publisher that behaves as vLLM's.

`Publisher` below is vLLM 0.32's ZmqEventPublisher reduced to what the subscriber sees: a PUB socket
sending [topic, seq, payload], a ROUTER replay socket answering from a buffer, then END_SEQ. Tests drive
it to lose batches (gaps), restart (seq from 0 again), or fall silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from pyfront.engine_client.kv_events import (
    END_SEQ,
    BlockStored,
    EventBatch,
    KVEventsEndpoints,
    encode_batch,
    resolve_endpoints,
)
from pyfront.engine_client.kv_subscriber import KVEventSubscriber
from pyfront.engine_client.prefix_index import APPROXIMATE, ENGINE_HASHES, PrefixIndex, digest_key
from pyfront.hashing import HashConfig, block_hashes

BS = 4
CONFIG = HashConfig.default(BS)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Publisher:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], *, bind: bool, port: int, replay_port: int | None) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if bind:
            self.pub.bind(f"tcp://127.0.0.1:{port}")
        else:
            self.pub.connect(f"tcp://127.0.0.1:{port}")
        self.replay = None
        if replay_port is not None:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0

    def publish(self, *events: BlockStored, send: bool = True) -> None:
        """Publish one batch (or, with send=False, only buffer it: the SUB never sees it, as after an HWM drop)."""
        payload = encode_batch(EventBatch(ts=time.time(), events=list(events), data_parallel_rank=0))
        self.buffer.append((self.seq, payload))
        if send:
            self.pub.send_multipart([b"kv", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def serve_replay(self) -> None:
        assert self.replay is not None
        while self.replay.poll(0):
            client, _, start = self.replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    self.replay.send_multipart([client, b"", b"kv", seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([client, b"", b"", END_SEQ, b""])  # vLLM 0.32's frames, topic included

    def restart(self) -> None:
        self.buffer.clear()
        self.seq = 0

    def close(self) -> None:
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)


PROMPTS = [[p * 100 + t for t in range(6 * BS)] for p in range(1, 9)]


def stored(prompt: list[int]) -> BlockStored:
    keys = [digest_key(d) for d in block_hashes(prompt, CONFIG)]
    return BlockStored(
        block_hashes=keys,
        parent_block_hash=None,
        token_ids=prompt,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )


def held(index: PrefixIndex, prompt: list[int]) -> int:
    return index.longest_prefixes([digest_key(d) for d in block_hashes(prompt, CONFIG)])[0]


def eventually(check: Callable[[], bool], what: str, publisher: Publisher | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if publisher is not None and publisher.replay is not None:
            publisher.serve_replay()
        if check():
            return
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


def start(
    ctx: zmq.Context[zmq.Socket[bytes]], *, subscriber_binds: bool, replay: bool = True, silence: float = 30.0
) -> tuple[Publisher, KVEventSubscriber, PrefixIndex]:
    port = free_port()
    replay_port = free_port() if replay else None
    endpoints = KVEventsEndpoints(
        endpoint=f"tcp://*:{port}" if subscriber_binds else f"tcp://127.0.0.1:{port}",
        subscriber_binds=subscriber_binds,
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay_port else None,
        topic="kv",
    )
    index = PrefixIndex(1, CONFIG)
    subscriber = KVEventSubscriber(index, silence_timeout_s=silence)
    if subscriber_binds:
        subscriber.add(0, endpoints, ENGINE_HASHES, "test")
        publisher = Publisher(ctx, bind=False, port=port, replay_port=replay_port)
    else:
        publisher = Publisher(ctx, bind=True, port=port, replay_port=replay_port)
        subscriber.add(0, endpoints, ENGINE_HASHES, "test")
    subscriber.start()
    return publisher, subscriber, index


@pytest.mark.parametrize("subscriber_binds", [False, True], ids=["engine-binds", "subscriber-binds"])
def test_batches_reach_the_index_and_a_late_start_is_replayed(
    ctx: zmq.Context[zmq.Socket[bytes]], subscriber_binds: bool
) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=subscriber_binds)
    try:
        # The first batches are lost while the connection forms (PUB/SUB's slow joiner): the replay fills them in.
        publisher.publish(stored(PROMPTS[0]), send=False)
        publisher.publish(stored(PROMPTS[1]), send=False)
        publisher.publish(stored(PROMPTS[2]))

        def caught_up() -> bool:
            publisher.publish(stored(PROMPTS[3]))  # keep publishing until the SUB is connected
            return all(held(index, p) == 6 for p in PROMPTS[:4])

        eventually(caught_up, "every batch, the lost ones from the replay", publisher)
        status = subscriber.status(0)
        assert status is not None and status.replayed >= 2 and status.undecodable == 0
    finally:
        subscriber.close()
        publisher.close()


def test_a_gap_is_replayed(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        publisher.publish(stored(PROMPTS[1]), send=False)  # dropped on the way
        publisher.publish(stored(PROMPTS[2]), send=False)
        publisher.publish(stored(PROMPTS[3]))
        eventually(lambda: all(held(index, p) == 6 for p in PROMPTS[:4]), "the gap replayed", publisher)
        status = subscriber.status(0)
        assert status is not None and status.gaps >= 1 and status.replayed >= 2
    finally:
        subscriber.close()
        publisher.close()


def test_a_gap_without_replay_clears_the_engine(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False, replay=False)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        publisher.publish(stored(PROMPTS[1]), send=False)  # lost for good: it might have been a removal
        publisher.publish(stored(PROMPTS[2]))
        eventually(lambda: held(index, PROMPTS[2]) == 6, "the batch after the gap")
        assert held(index, PROMPTS[0]) == 0, "entries from before an unrecoverable gap are dropped"
        assert held(index, PROMPTS[1]) == 0
        assert "there is no replay endpoint" in index.status(0).reason
    finally:
        subscriber.close()
        publisher.close()


def test_a_replay_buffer_that_lost_the_gap_clears(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        publisher.publish(stored(PROMPTS[1]), send=False)
        publisher.buffer.pop()  # the engine's buffer_steps ran out: seq k is gone from the replay too
        publisher.publish(stored(PROMPTS[2]), send=False)
        publisher.publish(stored(PROMPTS[3]))
        eventually(lambda: held(index, PROMPTS[3]) == 6, "the replayed rest", publisher)
        assert held(index, PROMPTS[0]) == 0 and held(index, PROMPTS[2]) == 6
        assert "gone from the replay buffer" in index.status(0).reason
    finally:
        subscriber.close()
        publisher.close()


def test_a_restarted_publisher_clears(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        publisher.publish(stored(PROMPTS[1]))
        eventually(lambda: held(index, PROMPTS[1]) == 6, "second batch")
        publisher.restart()
        publisher.publish(stored(PROMPTS[2]))  # seq 0 again
        eventually(lambda: held(index, PROMPTS[2]) == 6, "the restarted engine's first batch")
        assert held(index, PROMPTS[0]) == 0 and held(index, PROMPTS[1]) == 0
        assert "restarted" in index.status(0).reason
    finally:
        subscriber.close()
        publisher.close()


def test_silence_falls_back_to_approximate_and_events_bring_it_back(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False, silence=0.3)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        # A request stored blocks, routed after every batch published so far (the connect loop above may still
        # have some in flight: counting them as seen keeps them from meeting the expectation); no batch follows.
        subscriber.expect_events(0, publisher.seq)
        eventually(lambda: index.mode(0) == APPROXIMATE, "the silent engine marked approximate")
        assert held(index, PROMPTS[0]) == 0 and "no KV events" in index.status(0).reason
        status = subscriber.status(0)
        assert status is not None and status.silent
        publisher.publish(stored(PROMPTS[1]))
        eventually(lambda: index.mode(0) == ENGINE_HASHES and held(index, PROMPTS[1]) == 6, "events resumed", publisher)
    finally:
        subscriber.close()
        publisher.close()


def test_a_batch_that_came_before_the_first_output_meets_the_expectation(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """vLLM (and the mock) publish a step's events before its outputs: the batch holding a request's blocks is
    often applied before the output that raises the expectation. That engine is not silent."""
    publisher, subscriber, index = start(ctx, subscriber_binds=False, silence=0.3)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        routed_at = subscriber.batches_received(0)
        publisher.publish(stored(PROMPTS[1]))  # the request's blocks, published before its first output
        eventually(lambda: held(index, PROMPTS[1]) == 6, "the request's batch")
        subscriber.expect_events(0, routed_at)  # its first output: fewer cached tokens than full blocks
        time.sleep(0.9)  # three silence timeouts
        status = subscriber.status(0)
        assert index.mode(0) == ENGINE_HASHES and status is not None and not status.silent
        assert held(index, PROMPTS[1]) == 6
    finally:
        subscriber.close()
        publisher.close()


def test_no_subscription_polls_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """zmq.Poller.poll with no sockets returns at once: the thread must wait instead (it spun at half a core
    with DP engines that publish no events)."""
    calls = 0
    real_poll = zmq.Poller.poll

    def counting_poll(self: zmq.Poller, timeout: int | None = None) -> list:
        nonlocal calls
        calls += 1
        return real_poll(self, timeout)

    monkeypatch.setattr(zmq.Poller, "poll", counting_poll)
    subscriber = KVEventSubscriber(PrefixIndex(1, CONFIG))
    subscriber.start()
    try:
        time.sleep(0.35)
    finally:
        subscriber.close()
    assert calls == 0


def test_a_registered_endpoint_the_engine_bound_is_connected_to(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """vLLM resolves `tcp://*:0` to the engine's IP and port and registers that, which reads as an endpoint the
    engine connects to: the subscriber's bind finds it taken and connects instead."""
    port = free_port()
    publisher = Publisher(ctx, bind=True, port=port, replay_port=None)  # the engine bound it
    index = PrefixIndex(1, CONFIG)
    subscriber = KVEventSubscriber(index)
    endpoints = resolve_endpoints(
        {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}, 0, "127.0.0.1", offset=False
    )
    assert endpoints is not None and endpoints.subscriber_binds
    subscriber.add(0, endpoints, ENGINE_HASHES, "test")
    subscriber.start()
    try:
        eventually(lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected")
        status = subscriber.status(0)
        assert status is not None and not status.subscriber_binds
    finally:
        subscriber.close()
        publisher.close()


def test_an_undecodable_batch_is_counted_and_skipped(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    publisher, subscriber, index = start(ctx, subscriber_binds=False)
    try:
        eventually(
            lambda: (publisher.publish(stored(PROMPTS[0])), held(index, PROMPTS[0]) == 6)[1], "connected", publisher
        )
        publisher.pub.send_multipart([b"kv", publisher.seq.to_bytes(8, "big"), b"\xc1 not msgpack"])
        publisher.seq += 1
        publisher.pub.send_multipart([b"kv", b"short"])
        publisher.publish(stored(PROMPTS[1]))
        eventually(lambda: held(index, PROMPTS[1]) == 6, "the batch after the bad ones")
        status = subscriber.status(0)
        assert status is not None and status.undecodable == 2 and status.gaps == 0
    finally:
        subscriber.close()
        publisher.close()


def test_resolve_endpoints_follows_vllms_rules() -> None:
    flag = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5600",
        "topic": "t",
    }
    rank2 = resolve_endpoints(flag, 2, "10.0.0.7", offset=True)
    assert rank2 == KVEventsEndpoints("tcp://10.0.0.7:5559", False, "tcp://10.0.0.7:5602", "t")
    connecting = dict(flag, endpoint="tcp://10.0.0.1:7000", replay_endpoint=None)
    # The engine connects to 10.0.0.1: that is this host's address, and only it is bound.
    assert resolve_endpoints(connecting, 1, "h", offset=True) == KVEventsEndpoints(
        "tcp://10.0.0.1:7001", True, None, "t"
    )
    registered = dict(flag, endpoint="tcp://10.0.0.1:7001")  # what rank 1 reports: already offset
    assert resolve_endpoints(registered, 1, "h", offset=False).endpoint == "tcp://10.0.0.1:7001"  # type: ignore[union-attr]
    named = dict(flag, endpoint="tcp://frontend.local:7000")  # a name: every interface
    assert resolve_endpoints(named, 0, "h", offset=True).endpoint == "tcp://*:7000"  # type: ignore[union-attr]
    assert resolve_endpoints({"enable_kv_cache_events": False}, 0, "h", offset=True) is None
    assert resolve_endpoints(None, 0, "h", offset=False) is None
    assert resolve_endpoints(dict(flag, publisher="null"), 0, "h", offset=True) is None
    with pytest.raises(ValueError, match="cannot be offset"):
        resolve_endpoints(dict(flag, endpoint="ipc:///tmp/kv"), 1, "h", offset=True)
    ipc0 = resolve_endpoints(dict(flag, endpoint="ipc:///tmp/kv", replay_endpoint=None), 0, "h", offset=True)
    assert ipc0 == KVEventsEndpoints("ipc:///tmp/kv", False, None, "t")


def test_a_taken_endpoint_from_pyfronts_own_flag_is_not_connected_to(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """From --kv-events-config, `tcp://HOST:P` is the engine's to connect to: a port still taken (a closing socket)
    is the caller's to retry, never connected to (two connecting peers would never meet)."""
    port = free_port()
    taken = ctx.socket(zmq.SUB)
    taken.bind(f"tcp://127.0.0.1:{port}")
    subscriber = KVEventSubscriber(PrefixIndex(1, CONFIG))
    endpoints = resolve_endpoints(
        {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}"}, 0, "127.0.0.1", offset=True
    )
    try:
        assert endpoints is not None and endpoints.subscriber_binds and not endpoints.registered
        with pytest.raises(zmq.ZMQError):
            subscriber.add(0, endpoints, ENGINE_HASHES, "test")
    finally:
        subscriber.close()
        taken.close(0)
