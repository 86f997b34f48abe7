"""Block hashes of a prompt, byte-identical to the engine's `sha256-pickle5-feh1` recipe.

Block i = sha256(pickle.dumps((parent, tuple(block_i_token_ids), extra_keys), protocol=5)), where parent is
the config's none_hash for block 0 and the previous digest after that, and extra_keys is (cache_salt,) on
block 0 of a salted prompt, else None. Only full blocks are hashed (docs/engine-protocol.md#block-hash-recipe,
which also says where stock vLLM differs).

The loop below *is* the recipe: pickle.dumps on the very tuple the engine would build, so the result is
exact for every value pickle accepts (ids of any size or sign included). Hand-encoding pickle opcodes was
measured and lost: in CPython the per-block cost is the sha256 object (~0.3 us) plus one C pickle call,
and any cleverer slicing adds more Python-level work per block than it saves.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

from pyfront.hashing.config import HashConfig

_PICKLE_PROTOCOL = 5


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
    sha256 = hashlib.sha256
    dumps = pickle.dumps
    stop = len(token_ids) // block_size * block_size
    if stop == 0:
        return []
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
