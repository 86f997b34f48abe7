"""Async entry point: hash a prompt through the memo on a worker thread, return the wire blob."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import anyio
import anyio.to_thread

from pyfront.hashing.config import HashConfig
from pyfront.hashing.memo import PrefixMemo
from pyfront.hashing.wire import pack_header


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
