"""A content-keyed prefix memo: reuse the block hashes of an earlier prompt that shares a prefix.

Chat clients re-send the whole history every turn, so turn N's prompt starts with turn N-1's. Hashing
it cold costs ~1 us per block; the memo instead fingerprints the prompt at fixed checkpoints (every
`checkpoint_tokens`, rounded to whole blocks, plus the end of the full-block region) in one streaming
SHA-256 pass and reuses the chain of the deepest checkpoint some earlier prompt already reached. The
full-block ends of the most recent prompts are fingerprinted too, so the next turn of a chat resumes
exactly where the previous turn stopped instead of at the checkpoint before it.

Exactness: a checkpoint's key is (cache salt, prefix length, SHA-256 of an injective serialization of
the prefix's ids). Equal keys therefore mean equal salted prefixes, whose chains are equal by
definition of the recipe. The serialization is `marshal` version 2 of the id list: each int32 id is
b"i" + 4 bytes little-endian, and the check `m[5::5] == b"i" * n` proves every element was written that
way (marshal raises for objects it cannot write and uses other type codes for bools, floats and big
ints). Prompts that fail the check skip the memo and are hashed cold. marshal is the cheapest exact
serialization of a list of Python ints here (~6 ns per id, half of array('i')).

Memory: an entry keeps its chain as one bytes object (32 bytes per block) plus one key per checkpoint
(~150 bytes), so a 100k-token prompt costs ~200 KB at block size 16 and ~100 KB at 32; the LRU holds
at most `max_entries` prompts.
"""

from __future__ import annotations

import hashlib
import marshal
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from hashing.blocks import hash_chain, salt_extra_keys
from hashing.config import DIGEST_SIZE, HashConfig

_MARSHAL_VERSION = 2  # version 2 writes no back-references, so equal lists give equal bytes
_MARSHAL_HEADER = 5  # b"[" or b"(" + int32 element count
_MARSHAL_ITEM = 5  # b"i" + int32
_RECENT_ENDS = 16  # extra fingerprint points: full-block ends of the latest prompts

# (cache salt or None, prefix length in tokens, SHA-256 of the prefix's serialized ids)
_Key = tuple[str | None, int, bytes]


@dataclass(frozen=True, slots=True)
class MemoStats:
    requests: int = 0
    """Calls that had at least one full block."""
    hits: int = 0
    """Calls that reused an earlier prompt's chain."""
    blocks_total: int = 0
    """Full blocks across all calls."""
    blocks_hashed: int = 0
    """Blocks actually hashed (blocks_total minus the reused ones)."""
    skipped: int = 0
    """Calls whose ids the serialization cannot represent (hashed cold, not memoized)."""
    entries: int = 0
    """Prompts held now."""


class _Entry:
    __slots__ = ("chain", "keys")

    def __init__(self, chain: bytes, keys: list[_Key]) -> None:
        self.chain = chain
        self.keys = keys


class PrefixMemo:
    """Thread-safe; `block_hashes` always equals `hashing.block_hashes` for the same config."""

    def __init__(self, config: HashConfig, checkpoint_tokens: int = 1024, max_entries: int = 1024) -> None:
        if checkpoint_tokens < 1:
            raise ValueError("checkpoint_tokens must be >= 1")
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        block_size = config.block_size
        self.config = config
        self.max_entries = max_entries
        self.checkpoint_tokens = max(block_size, checkpoint_tokens // block_size * block_size)
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # by end key, oldest first
        self._index: dict[_Key, _Key] = {}  # checkpoint key -> end key of the newest entry holding it
        self._recent_ends: deque[int] = deque(maxlen=_RECENT_ENDS)
        self._requests = self._hits = self._blocks_total = self._blocks_hashed = self._skipped = 0

    @property
    def stats(self) -> MemoStats:
        with self._lock:
            return MemoStats(
                self._requests,
                self._hits,
                self._blocks_total,
                self._blocks_hashed,
                self._skipped,
                len(self._entries),
            )

    def block_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
        chain = self.chain(token_ids, cache_salt)
        return [chain[i : i + DIGEST_SIZE] for i in range(0, len(chain), DIGEST_SIZE)]

    def chain(self, token_ids: Sequence[int], cache_salt: str | None = None) -> bytes:
        """The concatenated digests of every full block (b"" for a prompt shorter than one block)."""
        extra_keys = salt_extra_keys(cache_salt)
        salt = cache_salt if extra_keys else None
        block_size = self.config.block_size
        if type(token_ids) is not list and type(token_ids) is not tuple:
            token_ids = list(token_ids)
        num_blocks = len(token_ids) // block_size
        if num_blocks == 0:
            return b""
        full = num_blocks * block_size

        checkpoints = self._fingerprints(token_ids, full, salt)
        if checkpoints is None:
            hashes = hash_chain(tuple(token_ids[:full]), block_size, self.config.none_hash, extra_keys)
            with self._lock:
                self._requests += 1
                self._skipped += 1
                self._blocks_total += num_blocks
                self._blocks_hashed += num_blocks
            return b"".join(hashes)

        reused = b""
        with self._lock:
            for key in reversed(checkpoints):
                end_key = self._index.get(key)
                if end_key is not None:
                    entry = self._entries[end_key]
                    self._touch(end_key, entry)
                    reused = entry.chain[: key[1] // block_size * DIGEST_SIZE]
                    break

        start = len(reused) // DIGEST_SIZE * block_size
        if start == full:
            chain = reused
        elif start:
            rest = hash_chain(tuple(token_ids[start:full]), block_size, reused[-DIGEST_SIZE:], None)
            chain = reused + b"".join(rest)
        else:
            chain = b"".join(hash_chain(tuple(token_ids[:full]), block_size, self.config.none_hash, extra_keys))

        with self._lock:
            self._requests += 1
            self._hits += start > 0
            self._blocks_total += num_blocks
            self._blocks_hashed += num_blocks - start // block_size
            self._store(checkpoints, chain)
        return chain

    def _fingerprints(self, token_ids: list | tuple, full: int, salt: str | None) -> list[_Key] | None:
        """Keys of every checkpoint of the full-block region, shallowest first; None if not memoizable."""
        try:
            serialized = marshal.dumps(token_ids, _MARSHAL_VERSION)
        except ValueError:  # an object marshal cannot write: not a plain int list
            return None
        n = len(token_ids)
        if (
            len(serialized) != _MARSHAL_HEADER + _MARSHAL_ITEM * n
            or serialized[_MARSHAL_HEADER::_MARSHAL_ITEM] != b"i" * n
        ):
            return None
        view = memoryview(serialized)
        sha = hashlib.sha256()
        keys: list[_Key] = []
        done = _MARSHAL_HEADER
        stride = self.checkpoint_tokens
        with self._lock:
            recent = {end for end in self._recent_ends if end < full and end % stride}
        points = sorted(recent.union(range(stride, full, stride)))
        points.append(full)
        for point in points:
            end = _MARSHAL_HEADER + _MARSHAL_ITEM * point
            sha.update(view[done:end])
            done = end
            keys.append((salt, point, sha.copy().digest()))
        return keys

    def _touch(self, end_key: _Key, entry: _Entry) -> None:
        """Mark an entry newest and point its checkpoints back at it (lock held)."""
        self._entries.move_to_end(end_key)
        index = self._index
        for key in entry.keys:
            index[key] = end_key

    def _store(self, keys: list[_Key], chain: bytes) -> None:
        """Remember this prompt's chain under all its checkpoints, evicting the oldest (lock held)."""
        end_key = keys[-1]
        entry = self._entries.get(end_key)
        if entry is None:
            entry = _Entry(chain, keys)
            self._entries[end_key] = entry
            self._recent_ends.append(end_key[1])
        self._touch(end_key, entry)
        while len(self._entries) > self.max_entries:
            old_end, old = self._entries.popitem(last=False)
            for key in old.keys:
                if self._index.get(key) == old_end:
                    del self._index[key]
