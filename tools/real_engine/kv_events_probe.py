"""Listen to real vLLM engines' KV cache events: a SUB socket per rank plus a replay client.

For the real-engine tier and for checking facts by hand. Every batch is decoded with pyfront's own
decoder (``pyfront.engine_client.kv_events.decode_batch``), so what this records is what pyfront's router
would see::

    from pyfront.engine_client.kv_events import resolve_endpoints
    from tools.real_engine.kv_events_probe import KVEventsProbe

    # from an engine's registration (endpoints already offset for its rank) ...
    eps = [resolve_endpoints(reg.kv_events_config, reg.data_parallel_rank, "127.0.0.1", offset=False) for reg in regs]
    # ... or from the --kv-events-config value the engines were started with
    eps = [resolve_endpoints(flag_config, rank, "127.0.0.1", offset=True) for rank in range(2)]
    with KVEventsProbe(eps) as probe:
        ...                                   # send requests
        probe.wait_for(lambda got: len(got) >= 1, timeout=10)
        probe.stored(rank=0)                  # every BlockStored seen from rank 0, in order
        probe.replay(0, start_seq=0)          # [(seq, EventBatch), ...] from the engine's replay buffer

vLLM's publisher (``vllm/distributed/kv_events.py`` ``ZmqEventPublisher``): PUB frames ``[topic, seq, payload]``
(seq 8-byte big-endian, from 0); the PUB socket binds wildcard/ipc/inproc endpoints and connects to the rest,
so for ``tcp://127.0.0.1:P`` this side binds (``subscriber_binds``). The replay ROUTER always binds; a DEALER
sends ``[b"", start_seq]`` (8-byte big-endian) and gets ``[b"", topic, seq, payload]`` per buffered batch
with ``seq >= start_seq`` (the last ``buffer_steps``), then ``[b"", b"", END_SEQ, b""]`` (``_service_replay``:
the topic frame is there too, empty in the end marker).
PUB/SUB drops what was sent before the subscription reached the publisher: start the probe before the
engines publish anything that matters, or fill the gap with `replay`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import zmq

from pyfront.engine_client.kv_events import (
    END_SEQ,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventsEndpoints,
    decode_batch,
)

__all__ = ["KVEventsProbe", "Received", "ReplayError", "free_port_run"]


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_run(n: int, *, avoid: set[int] | frozenset[int] = frozenset()) -> int:
    """A base port P with P..P+n-1 all free, below the kernel's ephemeral range.

    The KV events ports are offset per rank (P + rank) and some of them are bound late (by an engine, ~40 s
    after start). A port from the ephemeral range (what bind(0) gives) can meanwhile become the source port
    of any outgoing connection on the machine (seen: a SUB socket reconnecting to P took P+1, and engine 1
    died with EADDRINUSE), so these runs come from below it. Never 62100.
    """
    import socket

    low = _ephemeral_range()[0]
    for _ in range(500):
        base = random.randrange(20000, max(20001, low - n))
        ports = range(base, base + n)
        if any(p in avoid or p == 62100 for p in ports):
            continue
        ok = True
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no run of {n} free ports below {low}")


class ReplayError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Received:
    """One PUB message as it arrived."""

    rank: int
    """The index of the endpoint it came in on (the engine's DP rank when the endpoints are given in rank order)."""
    topic: bytes
    seq: int
    batch: EventBatch
    arrived: float
    """time.monotonic() when the probe read it."""


class KVEventsProbe:
    """Subscribes to each endpoint in a background thread and keeps every decoded batch."""

    def __init__(self, endpoints: Sequence[KVEventsEndpoints], *, ctx: zmq.Context[zmq.Socket[bytes]] | None = None):
        self.endpoints = list(endpoints)
        self._ctx = ctx or zmq.Context.instance()
        self._received: list[Received] = []
        self.undecodable: list[tuple[int, list[bytes], str]] = []
        """Messages that were not ``[topic, seq, payload]`` or whose payload did not decode: (rank, frames, error)."""
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._sockets: list[zmq.Socket[bytes]] = []
        for ep in self.endpoints:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.SUBSCRIBE, ep.topic.encode())
            if ep.subscriber_binds:
                sock.bind(ep.endpoint)
            else:
                sock.connect(ep.endpoint)
            self._sockets.append(sock)
        self._thread = threading.Thread(target=self._run, name="kv-events-probe", daemon=True)
        self._thread.start()

    def __enter__(self) -> KVEventsProbe:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in self._sockets:
            poller.register(sock, zmq.POLLIN)
        index = {sock: i for i, sock in enumerate(self._sockets)}
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                rank = index[sock]
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._keep(rank, frames)

    def _keep(self, rank: int, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.undecodable.append((rank, frames, f"{len(frames)} frames"))
            return
        topic, seq, payload = frames
        try:
            batch = decode_batch(payload)
        except Exception as exc:  # msgspec.DecodeError, ValidationError
            self.undecodable.append((rank, frames, repr(exc)))
            return
        with self._cond:
            self._received.append(Received(rank, topic, int.from_bytes(seq, "big"), batch, time.monotonic()))
            self._cond.notify_all()

    # ------------------------------------------------------------------ reading

    def received(self, rank: int | None = None) -> list[Received]:
        with self._cond:
            return [r for r in self._received if rank is None or r.rank == rank]

    def clear(self) -> None:
        with self._cond:
            self._received.clear()

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float) -> bool:
        """Wait until ``predicate(all batches so far)`` holds; False after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._received)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_quiet(self, quiet_s: float, timeout: float) -> int:
        """Wait until nothing arrived for `quiet_s` s, counted from the call at the earliest (or until `timeout` s
        passed); returns the batch count."""
        called = time.monotonic()
        deadline = called + timeout
        with self._cond:
            while True:
                last = max(self._received[-1].arrived if self._received else 0.0, called)
                now = time.monotonic()
                if now - last >= quiet_s or now >= deadline:
                    return len(self._received)
                self._cond.wait(min(quiet_s - (now - last), deadline - now))

    def events(self, rank: int | None = None) -> list[tuple[int, object]]:
        """(rank, event) of every event received, in arrival order per rank."""
        return [(r.rank, e) for r in self.received(rank) for e in r.batch.events]

    def stored(self, rank: int | None = None) -> list[BlockStored]:
        return [e for _, e in self.events(rank) if isinstance(e, BlockStored)]

    def removed(self, rank: int | None = None) -> list[BlockRemoved]:
        return [e for _, e in self.events(rank) if isinstance(e, BlockRemoved)]

    # ------------------------------------------------------------------ replay

    def replay(self, rank: int, start_seq: int, timeout: float = 10.0) -> list[tuple[int, EventBatch]]:
        """Ask rank's replay socket for every buffered batch from `start_seq` on: [(seq, batch), ...]."""
        endpoint = self.endpoints[rank].replay_endpoint
        if endpoint is None:
            raise ReplayError(f"rank {rank} has no replay endpoint")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
            out: list[tuple[int, EventBatch]] = []
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sock.poll(int(remaining * 1000) + 1):
                    raise ReplayError(f"no END_SEQ from {endpoint} within {timeout:g} s ({len(out)} batches so far)")
                frames = sock.recv_multipart()
                # vLLM 0.32 replies [b"", topic, seq, payload] and ends with [b"", b"", END_SEQ, b""].
                if len(frames) != 4 or frames[0] != b"":
                    raise ReplayError(f"unexpected replay reply of {len(frames)} frames: {frames!r:.200}")
                _, topic, seq, payload = frames
                if seq == END_SEQ:
                    if payload != b"" or topic != b"":
                        raise ReplayError(f"END_SEQ with topic {topic!r} and a payload of {len(payload)} bytes")
                    return out
                if topic != self.endpoints[rank].topic.encode():
                    raise ReplayError(f"replayed batch {int.from_bytes(seq, 'big')} has topic {topic!r}")
                out.append((int.from_bytes(seq, "big"), decode_batch(payload)))
        finally:
            sock.close(linger=0)
