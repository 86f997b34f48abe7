"""Block hashes of a prompt, byte-identical to the engine's `sha256-pickle5-feh1` recipe.

Block i = sha256(pickle.dumps((parent, tuple(block_i_token_ids), extra_keys), protocol=5)), where parent is
the config's none_hash for block 0 and the previous digest after that, and extra_keys is (cache_salt,) on
block 0 of a salted prompt, else None. Only full blocks are hashed (docs/engine-protocol.md#block-hash-recipe,
which also says where stock vLLM differs).

The loop below *is* the recipe: pickle.dumps on the very tuple the engine would build, so the result is
exact for every value pickle accepts (ids of any size or sign included). Hand-encoding pickle opcodes was
measured and lost: in CPython the per-block cost is the sha256 object (~0.3 us) plus one C pickle call,
and any cleverer slicing adds more Python-level work per block than it saves.

Two implementations of SHA-256 compute the digests, with the same result by definition (and checked at import):
OpenSSL's (``hashlib.sha256``), the faster in a loop (0.34 against 0.50 us a block on the 2-core VM), and
CPython's own (``_sha2`` / ``_sha256``) for prompts of at most :data:`SMALL_SHA_MAX_BLOCKS` blocks. A short
request's hash runs cold, its code gone from the caches since the last request, and OpenSSL's is the larger: one
block cold cost ~440 simulated last-level misses with it against ~165 (``benchmarks/request_instructions.py
--cache-sim``, stop 37 in benchmarks/README.md) and 4.1-4.4 against 2.7-3.2 us with 8 MB flushed before each.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from pyfront.hashing.config import HashConfig

logger = logging.getLogger(__name__)

_PICKLE_PROTOCOL = 5

SMALL_SHA_MAX_BLOCKS = 4
"""Chains of at most this many blocks use CPython's SHA-256: its cold saving (~1.3 us a call) is spent by its slower
loop (~0.16 us a block) at about 8 blocks."""


def _small_sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 when it is built in and agrees with OpenSSL's on a probe, else hashlib's (logged)."""
    small: Callable[[bytes], Any] | None = None
    for module in ("_sha2", "_sha256"):  # Python >= 3.12, 3.11 (a build may leave both out)
        try:
            small = importlib.import_module(module).sha256
            break
        except (ImportError, AttributeError):
            continue
    if small is None:
        logger.info("block hashes: no built-in SHA-256 in this Python; short prompts use OpenSSL's too")
        return hashlib.sha256
    probe = pickle.dumps((b"\x00" * 32, tuple(range(16)), ("salt",)), _PICKLE_PROTOCOL)
    if small(probe).digest() != hashlib.sha256(probe).digest() or small(b"").digest() != hashlib.sha256().digest():
        logger.warning("block hashes: the built-in SHA-256 disagrees with OpenSSL's; short prompts use OpenSSL's")
        return hashlib.sha256
    return small


_SMALL_SHA256 = _small_sha256()


def salt_extra_keys(cache_salt: str | None) -> tuple[str] | None:
    """Block 0's extra keys for a salt; ValueError for a salt that is not a str.

    Silently treating a non-str salt as "no salt" would share cache entries across tenants, so it is
    refused instead.
    """
    if cache_salt is None:
        return None
    if not isinstance(cache_salt, str):
        raise ValueError(f"cache_salt must be a str or None, got {type(cache_salt).__name__}")
    return (cache_salt,) if cache_salt else None


def hash_chain(
    token_ids: tuple[int, ...], block_size: int, parent: bytes, extra_keys: tuple[str] | None
) -> list[bytes]:
    """Digests of every full block of `token_ids`, chained from `parent`.

    `extra_keys` goes on the first block hashed here, so callers that resume a chain mid-prompt pass
    None (only block 0 of a prompt carries the salt).
    """
    dumps = pickle.dumps
    blocks = len(token_ids) // block_size
    if blocks == 0:
        return []
    stop = blocks * block_size
    sha256 = _SMALL_SHA256 if blocks <= SMALL_SHA_MAX_BLOCKS else hashlib.sha256
    try:
        parent = sha256(dumps((parent, token_ids[0:block_size], extra_keys), _PICKLE_PROTOCOL)).digest()
        out = [parent]
        append = out.append
        for i in range(block_size, stop, block_size):
            parent = sha256(dumps((parent, token_ids[i : i + block_size], None), _PICKLE_PROTOCOL)).digest()
            append(parent)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ValueError(f"token ids must be ints: {exc}") from None
    return out


def as_token_tuple(token_ids: Sequence[int]) -> tuple[int, ...]:
    """The ids as a tuple, so each block is one C-level slice (the recipe hashes tuples anyway)."""
    return token_ids if type(token_ids) is tuple else tuple(token_ids)


def block_hashes(token_ids: Sequence[int], config: HashConfig, cache_salt: str | None = None) -> list[bytes]:
    """The 32-byte digests of every full block of the prompt, in order."""
    extra_keys = salt_extra_keys(cache_salt)
    return hash_chain(as_token_tuple(token_ids), config.block_size, config.none_hash, extra_keys)
