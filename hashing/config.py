"""The hash configuration an engine advertises, and the recipe's default none_hash."""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass

ALGORITHM = "sha256-pickle5-feh1"
"""The one recipe pyfront implements (docs/engine-protocol.md#block-hash-recipe)."""

DIGEST_SIZE = 32


def default_none_hash() -> bytes:
    """The parent of block 0 when no engine has told us otherwise.

    vLLM seeds it from PYTHONHASHSEED (as a str) when that is set, else from the fixed string
    "vllm-none-hash". While serving, the none_hash the engines advertise always wins: they may run
    with a seed this process does not know.
    """
    seed = os.environ.get("PYTHONHASHSEED")
    return seeded_none_hash("vllm-none-hash" if seed is None else seed)


def seeded_none_hash(seed: str) -> bytes:
    """The none_hash of an engine whose PYTHONHASHSEED is `seed` (vLLM hashes the seed string itself)."""
    return hashlib.sha256(pickle.dumps(seed, protocol=5)).digest()


@dataclass(frozen=True, slots=True)
class HashConfig:
    """What an engine accepts: the recipe, its block size and the parent of block 0.

    Two engines can share hashes only if all three fields are equal, so equality is plain field
    equality and the object is hashable (it keys memos).
    """

    algorithm: str
    block_size: int
    none_hash: bytes

    def __post_init__(self) -> None:
        if self.algorithm != ALGORITHM:
            raise ValueError(f"unknown hash algorithm {self.algorithm!r}; pyfront implements {ALGORITHM!r}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {self.block_size!r}")
        if not isinstance(self.none_hash, bytes) or len(self.none_hash) != DIGEST_SIZE:
            raise ValueError(f"none_hash must be {DIGEST_SIZE} bytes, got {self.none_hash!r}")

    @classmethod
    def default(cls, block_size: int) -> HashConfig:
        """The feh1 config with this process's default none_hash."""
        return cls(ALGORITHM, block_size, default_none_hash())

    def describe(self) -> str:
        """Short human form for logs: algorithm, block size and the first bytes of none_hash."""
        return f"{self.algorithm}/block_size={self.block_size}/none_hash={self.none_hash[:6].hex()}.."
