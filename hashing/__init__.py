"""Front-end block hashing (FEH): the engine's prefix-cache block hashes, computed by pyfront."""

from pyfront.hashing.blocks import block_hashes
from pyfront.hashing.config import ALGORITHM, HashConfig, default_none_hash, seeded_none_hash
from pyfront.hashing.hasher import PromptHasher
from pyfront.hashing.memo import MemoStats, PrefixMemo
from pyfront.hashing.wire import pack_block_hashes, unpack_block_hashes

__all__ = [
    "ALGORITHM",
    "HashConfig",
    "MemoStats",
    "PrefixMemo",
    "PromptHasher",
    "block_hashes",
    "default_none_hash",
    "pack_block_hashes",
    "seeded_none_hash",
    "unpack_block_hashes",
]
