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

Recent prompts (the fast path of a growing chat). Serializing 100k ids costs ~0.7 ms, most of a warm
call. So the memo also keeps, for the `recent_prompts` latest prompts, a copy of their full-block ids,
their chain, their keys and the SHA-256 state at their end. A caller that vouches for its ids
(`checked=True`: every id an exact int32, as `pyfront.engine_client.validation` guarantees after
`validate_request`) gets its prompt compared against those copies with one list comparison (`==` on
lists first compares pointers, so ids shared with the tokenizer's cache cost ~1 ns each). When a copy
is a prefix, its keys, SHA-256 state and chain are taken over and only the ids after it are serialized
and hashed. Exactness: the ids are equal element by element, both lists hold exact ints only (the copy
passed the marshal check or was vouched for, the prompt is vouched for), so the prefixes' serializations,
keys and chains are equal. Without `checked` the prompt could hold `True` where the copy holds `1`
(equal under `==`, different pickles), so such calls take the fingerprint path.

Memory: an entry keeps its chain as one bytes object (32 bytes per block) plus one key per checkpoint
(~150 bytes), so a 100k-token prompt costs ~200 KB at block size 16 and ~100 KB at 32; the LRU holds
at most `max_entries` prompts. The recent copies add 8 bytes per token (a list of pointers to ints
the tokenizer holds anyway) for at most `recent_prompts` prompts: 3.2 MB for four 100k-token prompts.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyfront.hashing.blocks import hash_chain, salt_extra_keys
from pyfront.hashing.config import DIGEST_SIZE, HashConfig

_MARSHAL_VERSION = 2  # version 2 writes no back-references, so equal lists give equal bytes
_MARSHAL_HEADER = 5  # b"[" or b"(" + int32 element count
_MARSHAL_ITEM = 5  # b"i" + int32
_RECENT_ENDS = 16  # extra fingerprint points: full-block ends of the latest prompts
_RECENT_PROMPTS = 4  # prompts whose full-block ids are kept for the checked fast path

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
    recent_hits: int = 0
    """Calls (checked=True) that extended a recent prompt without serializing the shared prefix."""


class _Entry:
    __slots__ = ("chain", "keys")

    def __init__(self, chain: bytes, keys: list[_Key]) -> None:
        self.chain = chain
        self.keys = keys


class _Recent:
    """A recent prompt: its full-block ids (a private copy), salt, keys, chain and SHA-256 state at its end."""

    __slots__ = ("chain", "ids", "keys", "salt", "sha")

    def __init__(self, ids: list[int], salt: str | None, keys: list[_Key], chain: bytes, sha: Any) -> None:
        self.ids = ids
        self.salt = salt
        self.keys = keys
        self.chain = chain
        self.sha = sha


DIRECT_MAX_BLOCKS = 8
"""Prompts of at most this many full blocks are hashed outright: the memo's bookkeeping costs more than it saves.

Measured on the 2-core EPYC VM (block size 16, new prompts): 1 block 27 us through the memo against 4 us outright,
2 blocks 39 / 7 us, 8 blocks 50 / 23 us, 16 blocks 72 / 51 us. A short prompt seen before is hashed again rather
than found; a long one is memoized as before. The chain is the same either way (the memo never changes a result).
"""


class PrefixMemo:
    """Thread-safe; `block_hashes` always equals `pyfront.hashing.block_hashes` for the same config."""

    def __init__(
        self,
        config: HashConfig,
        checkpoint_tokens: int = 1024,
        max_entries: int = 1024,
        recent_prompts: int = _RECENT_PROMPTS,
        direct_max_blocks: int = DIRECT_MAX_BLOCKS,
    ) -> None:
        if checkpoint_tokens < 1:
            raise ValueError("checkpoint_tokens must be >= 1")
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        if recent_prompts < 0:
            raise ValueError("recent_prompts must be >= 0")
        block_size = config.block_size
        self.config = config
        self.max_entries = max_entries
        self.checkpoint_tokens = max(block_size, checkpoint_tokens // block_size * block_size)
        self.direct_max_blocks = direct_max_blocks
        """Prompts of at most this many full blocks are hashed without the memo (see DIRECT_MAX_BLOCKS)."""
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # by end key, oldest first
        self._index: dict[_Key, _Key] = {}  # checkpoint key -> end key of the newest entry holding it
        self._recent_ends: deque[int] = deque(maxlen=_RECENT_ENDS)
        self._recent: deque[_Recent] = deque(maxlen=recent_prompts)
        self._requests = self._hits = self._blocks_total = self._blocks_hashed = self._skipped = 0
        self._recent_hits = 0

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
                self._recent_hits,
            )

    def block_hashes(
        self, token_ids: Sequence[int], cache_salt: str | None = None, *, checked: bool = False
    ) -> list[bytes]:
        chain = self.chain(token_ids, cache_salt, checked=checked)
        return [chain[i : i + DIGEST_SIZE] for i in range(0, len(chain), DIGEST_SIZE)]

    def chain(self, token_ids: Sequence[int], cache_salt: str | None = None, *, checked: bool = False) -> bytes:
        """The concatenated digests of every full block (b"" for a prompt shorter than one block).

        `checked=True` is the caller's word that `token_ids` is a list of exact ints in int32 range (no bools,
        no int subclasses): then a prompt that extends a recent one skips serializing the shared prefix.
        """
        extra_keys = salt_extra_keys(cache_salt)
        salt = cache_salt if extra_keys else None
        block_size = self.config.block_size
        if type(token_ids) is not list and type(token_ids) is not tuple:
            token_ids = list(token_ids)
        num_blocks = len(token_ids) // block_size
        if num_blocks == 0:
            return b""
        full = num_blocks * block_size
        if num_blocks <= self.direct_max_blocks:
            hashes = hash_chain(tuple(token_ids[:full]), block_size, self.config.none_hash, extra_keys)
            with self._lock:
                self._requests += 1
                self._blocks_total += num_blocks
                self._blocks_hashed += num_blocks
            return b"".join(hashes)

        found = self._extend_recent(token_ids, full, salt) if checked and type(token_ids) is list else None
        if found is not None:
            checkpoints, sha, reused, same = found
        else:
            same = None
            fingerprinted = self._fingerprints(token_ids, full, salt)
            if fingerprinted is None:
                hashes = hash_chain(tuple(token_ids[:full]), block_size, self.config.none_hash, extra_keys)
                with self._lock:
                    self._requests += 1
                    self._skipped += 1
                    self._blocks_total += num_blocks
                    self._blocks_hashed += num_blocks
                return b"".join(hashes)
            checkpoints, sha = fingerprinted
            reused = b""

        reused_tokens = len(reused) // DIGEST_SIZE * block_size
        with self._lock:
            for key in reversed(checkpoints):
                if key[1] <= reused_tokens:
                    break  # the recent prompt already gives this much
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

        recent = same
        if recent is None and self._recent.maxlen and type(token_ids) is list:
            recent = _Recent(token_ids[:full], salt, checkpoints, chain, sha)  # the copy is made outside the lock
        with self._lock:
            self._requests += 1
            self._hits += start > 0
            self._recent_hits += found is not None
            self._blocks_total += num_blocks
            self._blocks_hashed += num_blocks - start // block_size
            self._store(checkpoints, chain)
            if recent is not None:
                if recent is same:
                    with contextlib.suppress(ValueError):
                        self._recent.remove(same)
                self._recent.append(recent)
        return chain

    def _extend_recent(
        self, token_ids: list[int], full: int, salt: str | None
    ) -> tuple[list[_Key], Any, bytes, _Recent | None] | None:
        """(keys, SHA-256 state at `full`, chain of the shared prefix, the recent prompt if it is all of
        `token_ids[:full]`) from the longest recent prompt that is a prefix of `token_ids[:full]` (same salt);
        None when there is none or the rest is not serializable."""
        with self._lock:
            candidates = sorted(
                (r for r in self._recent if r.salt == salt and len(r.ids) <= full), key=lambda r: -len(r.ids)
            )
        for recent in candidates:
            ids = recent.ids
            done = len(ids)
            # Cheap rejections first: the last and first ids, then the whole prefix at pointer speed.
            if token_ids[done - 1] != ids[-1] or token_ids[0] != ids[0]:
                continue
            if (token_ids if len(token_ids) == done else token_ids[:done]) != ids:
                continue
            if done == full:
                return recent.keys, recent.sha, recent.chain, recent
            tail = self._serialize(token_ids[done:full])
            if tail is None:
                return None
            sha = recent.sha.copy()
            keys = list(recent.keys)
            self._fingerprint_points(keys, sha, memoryview(tail), done, full, salt)
            return keys, sha, recent.chain, None
        return None

    @staticmethod
    def _serialize(token_ids: list[int] | tuple[int, ...]) -> bytes | None:
        """marshal v2 of the ids if every id is an exact int32 (b"i" + 4 bytes each), else None."""
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
        return serialized

    def _fingerprints(
        self, token_ids: list[int] | tuple[int, ...], full: int, salt: str | None
    ) -> tuple[list[_Key], Any] | None:
        """Keys of every checkpoint of the full-block region, shallowest first, and the SHA-256 state at `full`;
        None if not memoizable."""
        serialized = self._serialize(token_ids)
        if serialized is None:
            return None
        sha = hashlib.sha256()
        keys: list[_Key] = []
        self._fingerprint_points(keys, sha, memoryview(serialized), 0, full, salt)
        return keys, sha

    def _fingerprint_points(
        self, keys: list[_Key], sha: Any, serialized: memoryview, offset: int, full: int, salt: str | None
    ) -> None:
        """Append the keys of the points in (offset, full]; `serialized` is marshal of the ids from `offset` on."""
        stride = self.checkpoint_tokens
        with self._lock:
            recent = {end for end in self._recent_ends if offset < end < full and end % stride}
        points = sorted(recent.union(range((offset // stride + 1) * stride, full, stride)))
        points.append(full)
        done = _MARSHAL_HEADER
        for point in points:
            end = _MARSHAL_HEADER + _MARSHAL_ITEM * (point - offset)
            sha.update(serialized[done:end])
            done = end
            keys.append((salt, point, sha.copy().digest()))

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
