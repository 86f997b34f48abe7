"""The mock engine's simulated prefix cache and its KV cache event publisher, as vLLM 0.32 has them.

`PrefixCache` keeps what vLLM's ``BlockPool`` keeps for prefix caching, in the shape its KV events show
[src: vLLM 0.32 ``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``, ``single_type_kv_cache_manager.py``]:

- physical cached blocks, each with one block hash and a reference count. Blocks are not de-duplicated, as
  in vLLM: a block recomputed by a second request (the last prompt block of a fully cached prompt, decode
  blocks of a repeated greedy request) is a second copy of the same hash, with a BlockStored of its own
  and, when it goes, a BlockRemoved of its own;
- a hit is the longest run of leading prompt blocks present (the first copy of each hash); its blocks are
  taken off the eviction queue while the request runs (vLLM's ``touch``);
- a request's blocks go back to the eviction queue when it ends, its last block first, so that a cached
  chain loses its tail before its head (vLLM frees a request's blocks in reverse order);
- storing blocks beyond the capacity evicts from the front of that queue first (one BlockRemoved per evicted
  block, before the step's BlockStored, as vLLM evicts while allocating). Blocks in use are never evicted;
  when every cached block is in use the cache holds more than its capacity (vLLM would keep the request
  waiting instead). Only full blocks count: the partial last block of a sequence takes no room here.

`KVEventPublisher` is vLLM's ``ZmqEventPublisher`` for one rank (``vllm/distributed/kv_events.py``): a thread
with a queue, a PUB socket sending ``[topic, seq, payload]`` (seq 8-byte big-endian from 0), a replay buffer
of the last ``buffer_steps`` payloads and an optional replay ROUTER, endpoints offset by the rank.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from pyfront.engine_client.kv_events import (
    END_SEQ,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KVCacheEvent,
    block_key,
    encode_batch,
    offset_endpoint,
    publisher_binds,
)

logger = logging.getLogger("pyfront.mock_engine")

KV_EVENTS_DEFAULTS: dict[str, Any] = {
    "enable_kv_cache_events": False,
    "publisher": None,
    "endpoint": "tcp://*:5557",
    "replay_endpoint": None,
    "buffer_steps": 10_000,
    "hwm": 100_000,
    "max_queue_size": 100_000,
    "topic": "",
}
"""vLLM 0.32's ``KVEventsConfig`` fields in declaration order (the order of the registration's map) and defaults."""

FULL_ATTENTION = "full_attention"
"""``KVCacheSpecKind.FULL_ATTENTION``: what vLLM's ``KVCacheManager.take_events`` sets on a dense model's stores."""

_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str,),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
}


def resolve_kv_events_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``--kv-events-config`` object as vLLM's ``KVEventsConfig`` takes it: defaults filled in, publisher resolved.

    vLLM's ``__post_init__`` makes a missing publisher "zmq" when events are on and "null" otherwise; the
    pydantic dataclass refuses unknown keys and ill-typed values, and so does this (ValueError).
    """
    unknown = set(raw) - set(KV_EVENTS_DEFAULTS)
    if unknown:
        raise ValueError(f"--kv-events-config: unknown keys {sorted(unknown)}")
    config = {**KV_EVENTS_DEFAULTS, **raw}
    if config["publisher"] is None:
        config["publisher"] = "zmq" if config["enable_kv_cache_events"] else "null"
    for key, types in _TYPES.items():
        value = config[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"--kv-events-config: {key} must be {' or '.join(t.__name__ for t in types)}")
    if config["publisher"] not in ("null", "zmq"):
        raise ValueError(f"--kv-events-config: unknown publisher {config['publisher']!r} (null or zmq)")
    return config


def publishes(config: Mapping[str, Any] | None) -> bool:
    """Whether vLLM's ``EventPublisherFactory`` would create a ZMQ publisher for this resolved config."""
    return config is not None and bool(config["enable_kv_cache_events"]) and config["publisher"] != "null"


# ---------------------------------------------------------------------------------------------- the cache


@dataclass(slots=True)
class _Block:
    digest: bytes
    refs: int


@dataclass(slots=True)
class CacheCounters:
    queried_tokens: int = 0
    """Prompt tokens of the requests that looked the cache up (vLLM's prefix-cache queries)."""
    hit_tokens: int = 0
    """Prompt tokens found in the cache (what prefill_stats.num_cached_tokens reports)."""
    blocks_stored: int = 0
    blocks_evicted: int = 0


class PrefixCache:
    """One rank's cached blocks (see the module docstring); events queue up until `take_events`."""

    def __init__(self, capacity: int, block_size: int, *, events: bool, int_hashes: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"the prefix cache needs room for at least one block, got {capacity}")
        self.capacity = capacity
        self.block_size = block_size
        self.events_enabled = events
        self.int_hashes = int_hashes
        """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: events carry the low 64 bits as ints, else the digests."""
        self.counters = CacheCounters()
        self._blocks: dict[int, _Block] = {}
        self._by_digest: dict[bytes, list[int]] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """Cached blocks no request uses, the next one to evict first."""
        self._ids = itertools.count()
        self._events: list[KVCacheEvent] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def external(self, digest: bytes) -> ExternalBlockHash:
        """The hash as events carry it (vLLM's ``maybe_convert_block_hash``)."""
        return block_key(digest) if self.int_hashes else digest

    def lookup(self, digests: Sequence[bytes], max_blocks: int, num_tokens: int) -> list[int]:
        """Take the longest run of leading blocks present (at most `max_blocks`) for a request; their ids.

        `num_tokens` is the request's prompt length, counted as queried.
        """
        hit: list[int] = []
        for digest in digests[:max_blocks]:
            ids = self._by_digest.get(digest)
            if not ids:
                break
            hit.append(ids[0])
        for block_id in hit:
            self._blocks[block_id].refs += 1
            self._evictable.pop(block_id, None)
        self.counters.queried_tokens += num_tokens
        self.counters.hit_tokens += len(hit) * self.block_size
        return hit

    def store(
        self,
        digests: Sequence[bytes],
        token_ids: Sequence[int],
        first_block: int,
        parent: bytes | None,
        cache_salt: str | None,
        session_id: str | None,
    ) -> list[int]:
        """Cache new full blocks of one request (blocks `first_block`... of its sequence); their ids.

        `token_ids` are the blocks' tokens, `parent` the digest of block `first_block - 1` (None for block 0).
        The event is vLLM's ``cache_full_blocks`` one as its KVCacheManager publishes it: extra keys per block
        are the untagged salt on block 0 of a salted request and None elsewhere (``to_event_extra_keys`` of a
        text prompt); the one KV cache group is a dense model's full attention.
        """
        if not digests:
            return []
        self._evict(len(self._blocks) + len(digests) - self.capacity)
        ids: list[int] = []
        for digest in digests:
            block_id = next(self._ids)
            self._blocks[block_id] = _Block(digest, 1)
            self._by_digest.setdefault(digest, []).append(block_id)
            ids.append(block_id)
        self.counters.blocks_stored += len(ids)
        if self.events_enabled:
            salt_key = (cache_salt,) if cache_salt else None
            self._events.append(
                BlockStored(
                    block_hashes=[self.external(d) for d in digests],
                    parent_block_hash=None if parent is None else self.external(parent),
                    token_ids=list(token_ids),
                    block_size=self.block_size,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    extra_keys=[salt_key if first_block + i == 0 else None for i in range(len(digests))],
                    group_idx=0,
                    kv_cache_spec_kind=FULL_ATTENTION,
                    session_id=session_id,
                )
            )
        return ids

    def release(self, block_ids: Sequence[int]) -> None:
        """A request ended: its blocks become evictable once no other request uses them, its last block first."""
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            block.refs -= 1
            if block.refs == 0:
                self._evictable[block_id] = None

    def _evict(self, count: int) -> None:
        while count > 0 and self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            digest = self._blocks.pop(block_id).digest
            ids = self._by_digest[digest]
            ids.remove(block_id)
            if not ids:
                del self._by_digest[digest]
            self.counters.blocks_evicted += 1
            if self.events_enabled:
                self._events.append(BlockRemoved(block_hashes=[self.external(digest)], medium=MEDIUM_GPU, group_idx=0))
            count -= 1

    def reset(self) -> None:
        """Forget every block (the caller made sure no request holds one, as vLLM requires)."""
        self._blocks.clear()
        self._by_digest.clear()
        self._evictable.clear()
        if self.events_enabled:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events


# ------------------------------------------------------------------------------------------ the publisher


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind; ``tcp://*:0`` binds the node's address on a port the OS picks and returns what it bound.

    vLLM takes the node's address from VLLM_HOST_IP or from the route to a public address; the mock, a local
    test engine, takes VLLM_HOST_IP or else 127.0.0.1.
    """
    if endpoint != "tcp://*:0":
        sock.bind(endpoint)
        return endpoint
    ip = os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    host = ip
    if ":" in ip:
        sock.setsockopt(zmq.IPV6, 1)
        host = f"[{ip}]"
    sock.bind(f"tcp://{host}:0")
    port = sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1]
    return f"tcp://{host}:{port}"


class KVEventPublisher:
    """One rank's KV event publisher; `publish` queues a batch, a thread encodes, sends and serves replays.

    Sockets are made (and bound) in the constructor, so a port in use fails the engine's start, and used only
    by the publisher thread after that.
    """

    POLL_S = 0.1
    """How long the thread waits for a batch before it looks at the replay socket again (vLLM's 0.1 s)."""

    def __init__(self, ctx: zmq.Context, config: Mapping[str, Any], rank: int) -> None:
        self.rank = rank
        endpoint = offset_endpoint(config["endpoint"], rank)
        replay_endpoint = offset_endpoint(config["replay_endpoint"], rank)
        assert endpoint is not None
        self._pub: zmq.Socket = ctx.socket(zmq.PUB)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.set_hwm(config["hwm"])
            if publisher_binds(endpoint):
                endpoint = _bind(self._pub, endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                replay_endpoint = _bind(self._replay, replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.config: dict[str, Any] = {
            **config,
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": replay_endpoint,
        }
        """What vLLM's ``get_publisher_config()`` gives: the resolved endpoints, for the registration."""
        self._topic = str(config["topic"]).encode()
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(maxsize=config["max_queue_size"])
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config["buffer_steps"])
        self.published = 0
        """Batches sent on the PUB socket so far."""
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"mock-kv-events-{rank}", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVCacheEvent], ts: float) -> None:
        """Queue one step's events (blocks while the queue is full, as vLLM's ``Queue.put``)."""
        self._queue.put(EventBatch(ts=ts, events=events, data_parallel_rank=self.rank))

    def shutdown(self) -> None:
        """Send what is queued, then stop the thread and close the sockets; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._queue.put(None)
        self._thread.join(5)

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        seqs = itertools.count()
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    try:
                        self._serve_replay()
                    except Exception:  # as vLLM: replay is best effort, publishing goes on
                        logger.exception("rank %d: KV events replay failed", self.rank)
                try:
                    batch = self._queue.get(timeout=self.POLL_S)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                seq = next(seqs)
                try:
                    payload = encode_batch(batch)
                    self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                except Exception:  # as vLLM: log, back off, go on with the next batch (this one is lost)
                    logger.exception("rank %d: KV events batch %d not sent", self.rank, seq)
                    time.sleep(self.POLL_S)
                    continue
                self._buffer.append((seq, payload))
                self.published += 1
        finally:
            self._close_sockets()

    def _serve_replay(self) -> None:
        """One replay request ``[client_id, b"", start_seq]``: every buffered batch from start_seq on, then END_SEQ."""
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("rank %d: invalid KV events replay request: %r", self.rank, frames)
            return
        client_id, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client_id, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client_id, b"", b"", END_SEQ, b""))
