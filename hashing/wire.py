"""The `prompt_block_hashes` wire blob: b"FEH1", uint32-LE block size, then 32 bytes per full block.

Specified in docs/engine-protocol.md#feh-payload.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from pyfront.hashing.config import DIGEST_SIZE

MAGIC = b"FEH1"
_HEADER = struct.Struct("<4sI")
HEADER_SIZE = _HEADER.size


class BlobError(ValueError):
    """A blob that does not fit the receiving side; `kind` names the check it failed.

    The kinds ("short", "magic", "block_size", "length", "count") are stable: the engine-side plugin counts
    its fallbacks by them (pyfront.engine_client.vllm_plugin), so they are part of what operators see.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def pack_header(block_size: int) -> bytes:
    return _HEADER.pack(MAGIC, block_size)


def pack_block_hashes(hashes: Sequence[bytes], block_size: int) -> bytes | None:
    """The blob for these digests; None for a prompt shorter than one block (send nil, not a bare header)."""
    if not hashes:
        return None
    body = b"".join(hashes)
    if len(body) != DIGEST_SIZE * len(hashes):
        raise ValueError(f"every block hash must be {DIGEST_SIZE} bytes")
    return pack_header(block_size) + body


def unpack_block_hashes(blob: bytes, block_size: int, num_prompt_tokens: int) -> list[bytes]:
    """Parse and validate a blob against the receiving side's block size and the prompt's length.

    This is the engine side's check: any mismatch means the sender hashed something else, and the
    engine must then hash the prompt itself rather than trust the blob. Raises BlobError (a ValueError).
    """
    blob = bytes(blob)
    if len(blob) < HEADER_SIZE:
        raise BlobError(
            "short", f"prompt_block_hashes is {len(blob)} bytes, shorter than its {HEADER_SIZE}-byte header"
        )
    magic, blob_block_size = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise BlobError("magic", f"prompt_block_hashes has magic {magic!r}, expected {MAGIC!r}")
    if blob_block_size != block_size:
        raise BlobError("block_size", f"prompt_block_hashes has block size {blob_block_size}, expected {block_size}")
    body_len = len(blob) - HEADER_SIZE
    if body_len % DIGEST_SIZE:
        raise BlobError("length", f"prompt_block_hashes body is {body_len} bytes, not a multiple of {DIGEST_SIZE}")
    count = body_len // DIGEST_SIZE
    expected = num_prompt_tokens // block_size
    if count != expected:
        raise BlobError(
            "count",
            f"prompt_block_hashes carries {count} hashes, a {num_prompt_tokens}-token prompt has {expected} "
            f"full blocks of {block_size}",
        )
    return [blob[i : i + DIGEST_SIZE] for i in range(HEADER_SIZE, len(blob), DIGEST_SIZE)]
