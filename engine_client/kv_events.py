"""vLLM's KV cache events on the wire: the structs, the codec, and where each engine publishes.

An engine started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``
publishes every change of its prefix cache [src: vLLM 0.32 ``vllm/distributed/kv_events.py``
``ZmqEventPublisher``, ``vllm/v1/core/block_pool.py``]:

- a PUB socket sends ``[topic, seq, payload]`` multipart messages: ``seq`` is an 8-byte big-endian
  counter that starts at 0 with the publisher (so a restarted engine starts again at 0), ``payload`` the
  msgpack of an `EventBatch` (``array_like``: ``[ts, events, data_parallel_rank]``);
- events are tagged maps (``{"type": "BlockStored", ...}``): `BlockStored`, `BlockRemoved`,
  `AllBlocksCleared`; block hashes are the low 64 bits of the engine's 32-byte digests as ints
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default), or the digests themselves when that is off;
- an optional ROUTER replay socket answers ``[b"", start_seq]`` (from a DEALER) with one
  ``[b"", topic, seq, payload]`` per buffered batch from ``start_seq`` on (the last ``buffer_steps``) and then
  ``[b"", b"", END_SEQ, b""]`` (the PUB socket's three frames behind the DEALER's empty delimiter; the end
  marker's topic is empty);
- both endpoints are offset by the DP rank (tcp: port + rank, port 0 left as is; inproc: ``_dp<rank>``); the PUB socket
  *binds* for ``*``, ``::``, ipc and inproc endpoints and *connects* otherwise, so for ``tcp://HOST:P``
  the subscriber is the one that binds; the replay socket always binds. The engine reports the resolved
  endpoints (after the offset) in its registration's ``kv_events_config``.

The structs mirror vLLM 0.32's field for field (tests/engine_client/test_kv_events.py round-trips them
with vLLM's own ``KVEventBatch`` in the real-engine venv), so the mock engine encodes with them and pyfront
decodes a real engine's batches with them.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import Struct

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEventsEndpoints",
    "block_key",
    "decode_batch",
    "encode_batch",
    "offset_endpoint",
    "publisher_binds",
]

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay socket's end-of-replay marker (its ``seq`` frame)."""

ExternalBlockHash = int | bytes


class BlockStored(Struct, tag=True, omit_defaults=True, gc=False):
    """Full blocks newly cached, in chain order: ``block_hashes[i]`` covers ``token_ids[i*bs:(i+1)*bs]``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    """One entry per block: untagged LoRA name, ``(mm_identifier, offset)`` pairs, the cache salt, ..."""
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(Struct, tag=True, omit_defaults=True, gc=False):
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM's ``KVEventBatch``: one engine step's events."""

    ts: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(EventBatch)
_encoder = msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> EventBatch:
    """One batch; msgspec.DecodeError (ValidationError included) for anything else."""
    return _decoder.decode(payload)


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def block_key(block_hash: ExternalBlockHash) -> int:
    """The index key of an engine's block hash: its low 64 bits, as vLLM's int conversion gives.

    A 32-byte digest (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) maps to the int the default setting
    would have published, so both settings key the same blocks alike.
    """
    if isinstance(block_hash, int):
        return block_hash & 0xFFFF_FFFF_FFFF_FFFF
    return int.from_bytes(block_hash[-8:], "big")


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """vLLM's ``ZmqEventPublisher.offset_endpoint_port``: rank r publishes on port + r (tcp), ``_dp<r>`` (inproc).

    A tcp port of 0 stays 0 (every rank lets the OS pick its own port and reports it in its registration).
    vLLM raises for any other transport with a rank > 0 (ipc included), so such an endpoint cannot serve
    several ranks; ValueError here too.
    """
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        if ":" not in endpoint:
            return endpoint
        base, port = endpoint.rsplit(":", 1)
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    raise ValueError(f"KV events endpoint {endpoint!r} cannot be offset for DP rank {rank} (only tcp and inproc can)")


def publisher_binds(endpoint: str) -> bool:
    """True when vLLM's PUB socket binds ``endpoint`` (so the subscriber connects), False when it connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


@dataclass(frozen=True, slots=True)
class KVEventsEndpoints:
    """Where one engine rank publishes, as the subscriber must use it."""

    endpoint: str
    """What the subscriber binds or connects to."""
    subscriber_binds: bool
    replay_endpoint: str | None
    topic: str
    registered: bool = False
    """Read from the engine's registration, where vLLM writes `tcp://*:0` as the address it bound (`tcp://IP:PORT`),
    which looks like an endpoint the engine connects to; from pyfront's own --kv-events-config it cannot be."""


def _connectable(endpoint: str, host: str) -> str:
    """A bound wildcard endpoint as a peer reaches it: ``tcp://*:P`` -> ``tcp://HOST:P``."""
    for wildcard in ("*", "0.0.0.0", "[::]", "::"):
        prefix = f"tcp://{wildcard}:"
        if endpoint.startswith(prefix):
            return f"tcp://{host}:{endpoint[len(prefix) :]}"
    return endpoint


def _bindable(endpoint: str) -> str:
    """A ``tcp://HOST:P`` the engine connects to, as this side binds it: HOST itself when it is an IP address
    (the engine reaches this host there; binding only it exposes nothing more), else every interface."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"tcp://*:{port}"
    return endpoint


def resolve_endpoints(config: dict[str, Any] | None, rank: int, host: str, *, offset: bool) -> KVEventsEndpoints | None:
    """The subscriber's view of one rank's publisher, from a ``kv_events_config`` map.

    ``config`` is either the engine's registration (endpoints already offset for its rank: ``offset=False``)
    or pyfront's own ``--kv-events-config`` (vLLM's flag value, offset here per rank). ``host`` is the engine's
    address for endpoints it binds on a wildcard. None when the config does not publish over zmq.
    """
    if not config:
        return None
    publisher = config.get("publisher")
    enabled = config.get("enable_kv_cache_events", publisher == "zmq")
    if not enabled or publisher not in (None, "zmq"):
        return None
    endpoint = config.get("endpoint") or "tcp://*:5557"
    replay = config.get("replay_endpoint")
    if offset:
        endpoint = offset_endpoint(endpoint, rank) or endpoint
        replay = offset_endpoint(replay, rank)
    binds = publisher_binds(endpoint)
    return KVEventsEndpoints(
        endpoint=_connectable(endpoint, host) if binds else _bindable(endpoint),
        subscriber_binds=not binds,
        replay_endpoint=_connectable(replay, host) if replay else None,
        topic=str(config.get("topic") or ""),
        registered=not offset,
    )


def parse_config_flag(value: str) -> dict[str, Any]:
    """``--kv-events-config``: the same JSON object vLLM's flag takes; ValueError for anything else."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    unknown = set(config) - {
        "enable_kv_cache_events",
        "publisher",
        "endpoint",
        "replay_endpoint",
        "buffer_steps",
        "hwm",
        "max_queue_size",
        "topic",
    }
    if unknown:
        raise ValueError(f"--kv-events-config: unknown keys {sorted(unknown)}")
    return config
