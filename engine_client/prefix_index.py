"""Which engine holds which prefix-cache blocks: an index from block key to the engines that hold it.

Fed by the engines' own KV events (`kv_subscriber.KVEventSubscriber`, on its thread) or, for an engine that
publishes none, by pyfront's record of where it sent each prompt (approximate). Read by the router
(`routing.Router`) with `longest_prefixes`, on the event loop or a worker thread; one lock guards it.

Keys. A block's key is the low 64 bits of its 32-byte digest (what vLLM publishes by default,
``kv_events.block_key``), and the router looks up the keys of pyfront's own feh1 hashes of the prompt
(`hashing`). So an engine's published hashes can key the index directly only when they *are* pyfront's:

- ``engine_hashes``: FEH was negotiated (the engine hashes with what pyfront ships: equal by construction),
  or the first `VERIFY_BLOCKS` unsalted blocks the engine stored, re-hashed here from their token ids,
  gave the engine's own hashes (default sha256 prefix hashing, same seed). Chains whose blocks carry extra
  keys (a cache salt) are still re-hashed: a stock engine hashes the salt tagged, ``("salt", s)``, and
  publishes it untagged, while pyfront's feh1 recipe (what the router looks up) hashes ``(s,)``; re-hashing
  the published key gives pyfront's hash in both cases, and the block's descendants follow its chain;
- ``verifying`` (until then) and ``recomputed`` (a block differed: another ``PYTHONHASHSEED``, another
  ``--prefix-caching-hash-algo``): the key is pyfront's own chain, computed from each event's token ids and
  its parent's chain digest (kept per engine: engine key -> pyfront digest). A block whose parent was never
  seen (events missed, index bound hit) cannot be chained and is left out: a miss, never a wrong hit;
- ``approximate``: no KV events for this engine (none configured, or it stopped publishing): the keys of
  the prompts pyfront sent there, newest kept;
- ``off``: nothing recorded (cache-aware routing is off).

Bound: at most `max_blocks` keys per engine, and as many chain digests; the oldest stored go first (an
engine's cache evicts its least recently used free blocks first, and a re-stored block moves to the end
here). About 76 bytes per key and 141 per chain digest in CPython (tracemalloc, random 64-bit keys): 2^18
keys per engine is ~20 MB (engine_hashes mode), ~57 MB with the digests (verifying / recomputed).

Which blocks count: KV cache group 0 (``group_idx`` 0 or absent) and events whose ``block_size`` is the
index's; other groups of hybrid models and partial-block events (mamba ``align`` mode) are ignored, so for
such models the index under-predicts rather than over-predicts. Copies: vLLM does not de-duplicate blocks (a
request that recomputes a cached block, e.g. the last block of a fully cached prompt, stores a second copy
with its own BlockStored and, later, its own BlockRemoved), and an offloading connector stores copies in
other media (``CPU``, ...): a key counts its copies and stays until the last one is removed; every medium
counts as cached. (vLLM also re-announces reused blocks as BlockStored when a request asks for
``kv_cache_report_mode="full"``; pyfront never does, so counts are not inflated by its own requests.)
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyfront.engine_client.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, block_key
from pyfront.hashing import HashConfig
from pyfront.hashing.config import DIGEST_SIZE
from pyfront.hashing.wire import HEADER_SIZE, pack_header

VERIFY_BLOCKS = 4
"""Unsalted blocks re-hashed (all must match) before an engine's own hashes key the index."""


ENGINE_HASHES = "engine_hashes"
VERIFYING = "verifying"
RECOMPUTED = "recomputed"
APPROXIMATE = "approximate"
OFF = "off"
EVENT_MODES = (ENGINE_HASHES, VERIFYING, RECOMPUTED)


def digest_key(digest: bytes) -> int:
    """The index key of one of pyfront's 32-byte block digests (= vLLM's int form of the same hash)."""
    return int.from_bytes(digest[24:], "big")


@dataclass(slots=True)
class EngineBlocks:
    """One engine's entries and how they are keyed."""

    mode: str = OFF
    reason: str = "cache-aware routing is off"
    blocks: dict[int, int] = field(default_factory=dict)
    """key -> copies of the block the engine holds (any medium); insertion order is age."""
    chains: dict[int, bytes] = field(default_factory=dict)
    """engine key -> pyfront's digest of the same block (verifying / recomputed, and salted chains)."""
    salted: dict[int, None] = field(default_factory=dict)
    """Engine keys of blocks in chains that carry extra keys (an ordered set): re-hashed in every mode."""
    verified: int = 0
    stored: int = 0
    removed: int = 0
    skipped: int = 0
    """Stored blocks that could not be indexed (other group or block size, unknown parent)."""
    clears: int = 0
    last_clear: str = ""
    """Why the entries were last dropped (a gap in the events, the engine gone, ...)."""


@dataclass(frozen=True, slots=True)
class EngineIndexStatus:
    mode: str
    reason: str
    blocks: int
    stored: int
    removed: int
    skipped: int
    clears: int


class PrefixIndex:
    """Thread-safe; every method takes the one lock for O(its arguments) work."""

    def __init__(self, num_engines: int, hash_config: HashConfig, *, max_blocks: int = 1 << 18) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.hash_config = hash_config
        self.block_size = hash_config.block_size
        self.max_blocks = max_blocks
        self._engines = [EngineBlocks() for _ in range(num_engines)]
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ modes

    def set_mode(self, rank: int, mode: str, reason: str) -> None:
        """Start `rank` afresh in `mode` (its entries dropped): after a restart, at subscription, on silence."""
        with self._lock:
            engine = self._engines[rank]
            if engine.blocks or engine.chains:
                engine.clears += 1
            self._engines[rank] = EngineBlocks(mode=mode, reason=reason, clears=engine.clears)

    def clear(self, rank: int, reason: str) -> None:
        """Drop `rank`'s entries but keep how they are keyed (a gap in its events, an engine-side clear)."""
        with self._lock:
            engine = self._engines[rank]
            engine.blocks.clear()
            engine.chains.clear()
            engine.salted.clear()
            engine.clears += 1
            engine.last_clear = reason

    def mode(self, rank: int) -> str:
        return self._engines[rank].mode

    def status(self, rank: int) -> EngineIndexStatus:
        e = self._engines[rank]
        reason = f"{e.reason}; last cleared: {e.last_clear}" if e.last_clear else e.reason
        return EngineIndexStatus(e.mode, reason, len(e.blocks), e.stored, e.removed, e.skipped, e.clears)

    # ------------------------------------------------------------------ writes

    def apply(self, rank: int, batch: EventBatch) -> None:
        """One engine's event batch, in order."""
        with self._lock:
            engine = self._engines[rank]
            if engine.mode not in EVENT_MODES:
                return
            for event in batch.events:
                if isinstance(event, BlockStored):
                    self._stored(engine, event)
                elif isinstance(event, BlockRemoved):
                    self._removed(engine, event)
                elif isinstance(event, AllBlocksCleared):
                    engine.blocks.clear()
                    engine.chains.clear()
                    engine.salted.clear()
                    engine.clears += 1

    def record_sent(self, rank: int, keys: Sequence[int]) -> None:
        """Approximate mode: `keys` (a prompt's block keys) are now on `rank` (newest last)."""
        with self._lock:
            engine = self._engines[rank]
            if engine.mode != APPROXIMATE:
                return
            blocks = engine.blocks
            for key in keys:
                blocks.pop(key, None)
                blocks[key] = 1
            self._bound(blocks)

    def _bound(self, table: dict[int, int] | dict[int, bytes] | dict[int, None]) -> None:
        excess = len(table) - self.max_blocks
        if excess > 0:
            oldest = iter(table)
            for key in [next(oldest) for _ in range(excess)]:
                del table[key]

    def _stored(self, engine: EngineBlocks, event: BlockStored) -> None:
        hashes = event.block_hashes
        size = self.block_size
        if (event.group_idx or 0) != 0 or event.block_size != size or len(event.token_ids) != len(hashes) * size:
            engine.skipped += len(hashes)
            return
        blocks = engine.blocks
        engine.stored += len(hashes)
        chains = engine.chains
        extra = event.extra_keys
        salted = engine.salted
        parent_salted = event.parent_block_hash is not None and block_key(event.parent_block_hash) in salted
        plain = engine.mode == ENGINE_HASHES and not parent_salted and (extra is None or all(k is None for k in extra))
        if plain:
            for block_hash in hashes:
                key = block_key(block_hash)
                blocks[key] = blocks.pop(key, 0) + 1
            self._bound(blocks)
            return
        parent: bytes | None
        if event.parent_block_hash is None:
            parent = self.hash_config.none_hash
        else:
            parent = chains.get(block_key(event.parent_block_hash))
        tokens = event.token_ids
        # Only blocks whose whole chain carries no extra keys can prove the engine's hashes (a salted root
        # changes every descendant, on the engine's side differently from pyfront's).
        in_salted_chain = parent_salted
        sha256, dumps = hashlib.sha256, pickle.dumps
        for i, block_hash in enumerate(hashes):
            if parent is None:
                engine.skipped += len(hashes) - i
                break
            keys = extra[i] if extra is not None and i < len(extra) else None
            extra_keys = tuple(keys) if keys is not None else None
            digest = sha256(dumps((parent, tuple(tokens[i * size : (i + 1) * size]), extra_keys), 5)).digest()
            engine_key, key = block_key(block_hash), digest_key(digest)
            chains.pop(engine_key, None)
            chains[engine_key] = digest
            blocks[key] = blocks.pop(key, 0) + 1
            parent = digest
            if extra_keys is not None:
                in_salted_chain = True
            if in_salted_chain:
                salted.pop(engine_key, None)
                salted[engine_key] = None
            elif engine.mode == VERIFYING:
                if engine_key == key:
                    engine.verified += 1
                    if engine.verified >= VERIFY_BLOCKS:
                        engine.mode = ENGINE_HASHES
                        for plain_key in [k for k in chains if k not in salted]:
                            del chains[plain_key]  # plain chains key by the engine's hashes from now on
                        engine.reason = (
                            f"the engine's block hashes of its first {VERIFY_BLOCKS} unsalted blocks equal "
                            "pyfront's, re-hashed from their token ids: keyed by the engine's hashes"
                        )
                else:
                    engine.mode = RECOMPUTED
                    engine.reason = (
                        "the engine's block hashes differ from pyfront's for the same tokens (another "
                        "PYTHONHASHSEED or --prefix-caching-hash-algo): keyed by pyfront's own chain of the "
                        "events' token ids"
                    )
        self._bound(blocks)
        self._bound(chains)
        self._bound(salted)

    def _removed(self, engine: EngineBlocks, event: BlockRemoved) -> None:
        if (event.group_idx or 0) != 0:
            return
        blocks, chains = engine.blocks, engine.chains
        trusted = engine.mode == ENGINE_HASHES
        for block_hash in event.block_hashes:
            engine_key = block_key(block_hash)
            digest = chains.get(engine_key)
            if digest is not None:
                key = digest_key(digest)
            elif trusted:
                key = engine_key
            else:
                continue
            held = blocks.get(key)
            if held is None:
                continue
            if held > 1:
                blocks[key] = held - 1
            else:
                del blocks[key]
                engine.removed += 1
                if digest is not None:
                    del chains[engine_key]
                    engine.salted.pop(engine_key, None)

    # ------------------------------------------------------------------ reads

    def longest_prefixes(self, keys: Sequence[int]) -> list[int]:
        """For each engine, how many of the leading `keys` it holds (one dict probe per held block, plus one)."""
        with self._lock:
            out = []
            for engine in self._engines:
                blocks = engine.blocks
                count = 0
                if blocks:
                    for key in keys:
                        if key not in blocks:
                            break
                        count += 1
                out.append(count)
            return out

    def sizes(self) -> list[int]:
        return [len(e.blocks) for e in self._engines]


def prompt_keys(blob: object, block_size: int, num_tokens: int) -> list[int]:
    """The index keys of a packed FEH blob (header, then 32-byte digests): the low 64 bits of each, big-endian.

    A blob the engine would refuse (not bytes, short, wrong magic or block size, ragged, the wrong count for
    the prompt: the checks of `unpack_block_hashes`) yields no keys: it says nothing about what any engine
    holds, and a caller-built blob must not crash the request it rides on.

    One C-level unpack of the whole blob (every digest as four big-endian u64s, the last kept): about 20 ns
    a block, so even a 200k-token prompt's keys cost well under a millisecond.
    """
    if not isinstance(blob, bytes) or len(blob) < HEADER_SIZE:
        return []
    count, ragged = divmod(len(blob) - HEADER_SIZE, DIGEST_SIZE)
    if ragged or count != num_tokens // block_size or blob[:HEADER_SIZE] != pack_header(block_size):
        return []
    return list(struct.unpack_from(f">{4 * count}Q", blob, HEADER_SIZE)[3::4])


__all__ = [
    "APPROXIMATE",
    "ENGINE_HASHES",
    "EVENT_MODES",
    "OFF",
    "RECOMPUTED",
    "VERIFYING",
    "VERIFY_BLOCKS",
    "EngineIndexStatus",
    "PrefixIndex",
    "digest_key",
    "prompt_keys",
]
