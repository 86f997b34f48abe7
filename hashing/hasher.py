"""Async entry point: hash a prompt through the memo on a worker thread, return the wire blob."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import anyio
import anyio.to_thread

from pyfront.hashing.blocks import as_token_tuple, hash_chain
from pyfront.hashing.config import DIGEST_SIZE, HashConfig
from pyfront.hashing.memo import PrefixMemo
from pyfront.hashing.wire import HEADER_SIZE, pack_header


class PromptHasher:
    """Hashes prompts off the event loop with its own thread limiter.

    Hashing holds the GIL (pickle and the loop are Python), so extra threads add no throughput; two let
    a short prompt finish beside a 200k-token one instead of queueing behind it, and the limiter keeps
    hashing from taking every thread of anyio's default pool that tokenization also uses. Prompts of at
    most `inline_max_blocks` blocks are hashed on the caller's thread: that costs a few microseconds,
    less than the thread hop.
    """

    def __init__(
        self,
        config: HashConfig,
        memo: PrefixMemo | None = None,
        *,
        max_threads: int = 2,
        inline_max_blocks: int = 8,
    ) -> None:
        if memo is not None and memo.config != config:
            raise ValueError("the memo was built for a different hash config")
        self.config = config
        self.memo = memo if memo is not None else PrefixMemo(config)
        self._header = pack_header(config.block_size)
        self._inline_max_tokens = (inline_max_blocks + 1) * config.block_size - 1
        self._limiter = anyio.CapacityLimiter(max_threads)

    def hash_prompt_sync(
        self, token_ids: Sequence[int], cache_salt: str | None = None, *, checked: bool = False
    ) -> bytes | None:
        """The packed blob, on the calling thread; None for a prompt shorter than one block.

        `checked`: the ids are known to be a list of exact int32 ints (see `PrefixMemo.chain`).
        """
        chain = self.memo.chain(token_ids, cache_salt, checked=checked)
        return self._header + chain if chain else None

    def hash_prompt_after_sync(
        self,
        token_ids: Sequence[int],
        previous_blob: bytes | None,
        shared_tokens: int,
        cache_salt: str | None = None,
        *,
        checked: bool = False,
    ) -> bytes | None:
        """``hash_prompt_sync(token_ids, cache_salt)`` for a prompt whose first ``shared_tokens`` ids are the
        first ids of an earlier prompt that this hasher blobbed as ``previous_blob`` with the same salt.

        The caller vouches for that (the ids were copied from the earlier prompt's list, see
        ``SegmentTokenizer.encode_after``); then the earlier blob's digests of the full blocks inside the
        shared ids are those of this prompt by the recipe's definition (a block's digest is a function of the
        salt, its parent digest and its ids), and only the blocks after them are hashed, chained from the
        last one kept. The memo is bypassed: nothing before the shared ids is serialized or compared.
        ``checked`` is ``hash_prompt_sync``'s, for when nothing can be reused.
        """
        block_size = self.config.block_size
        kept = (
            0
            if previous_blob is None
            else min(shared_tokens // block_size, (len(previous_blob) - HEADER_SIZE) // DIGEST_SIZE)
        )
        if kept <= 0:
            return self.hash_prompt_sync(token_ids, cache_salt, checked=checked)
        assert previous_blob is not None and previous_blob.startswith(self._header)  # one hasher, one header
        end = HEADER_SIZE + kept * DIGEST_SIZE
        rest = hash_chain(
            as_token_tuple(token_ids[kept * block_size :]), block_size, previous_blob[end - DIGEST_SIZE : end], None
        )
        return b"".join([memoryview(previous_blob)[:end], *rest])  # one copy of the kept digests, not two

    async def hash_prompt(
        self, token_ids: Sequence[int], cache_salt: str | None = None, *, checked: bool = False
    ) -> bytes | None:
        """The packed blob for the prompt (None if shorter than one block), hashed on a worker thread."""
        num_tokens = len(token_ids)
        if num_tokens < self.config.block_size:
            return None
        if num_tokens <= self._inline_max_tokens:
            return self.hash_prompt_sync(token_ids, cache_salt, checked=checked)
        return await anyio.to_thread.run_sync(
            functools.partial(self.hash_prompt_sync, token_ids, cache_salt, checked=checked), limiter=self._limiter
        )
