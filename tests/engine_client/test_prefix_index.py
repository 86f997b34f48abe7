"""The prefix index (engine_client/prefix_index.py): updates, modes, the bound, the longest-prefix lookup."""

from __future__ import annotations

import hashlib
import pickle
import threading

import pytest

from pyfront.engine_client.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from pyfront.engine_client.prefix_index import (
    APPROXIMATE,
    ENGINE_HASHES,
    RECOMPUTED,
    VERIFY_BLOCKS,
    VERIFYING,
    PrefixIndex,
    digest_key,
    prompt_keys,
)
from pyfront.hashing import HashConfig, block_hashes, pack_block_hashes
from pyfront.hashing.wire import pack_header

BS = 4
CONFIG = HashConfig.default(BS)
OTHER_SEED = HashConfig(CONFIG.algorithm, BS, hashlib.sha256(pickle.dumps("42", protocol=5)).digest())


def keys_of(tokens: list[int], config: HashConfig = CONFIG, salt: str | None = None) -> list[int]:
    return [digest_key(d) for d in block_hashes(tokens, config, salt)]


def stored(
    tokens: list[int],
    start_block: int,
    end_block: int,
    config: HashConfig = CONFIG,
    *,
    salt: str | None = None,
    medium: str | None = "GPU",
    group: int | None = 0,
) -> BlockStored:
    """What an engine hashing with `config` publishes when blocks start..end-1 of `tokens` are newly cached."""
    keys = keys_of(tokens, config, salt)
    extra: list[tuple[str, ...] | None] | None = None
    if salt:
        extra = [(salt,) if i == 0 else None for i in range(start_block, end_block)]
    return BlockStored(
        block_hashes=keys[start_block:end_block],
        parent_block_hash=keys[start_block - 1] if start_block else None,
        token_ids=tokens[start_block * BS : end_block * BS],
        block_size=BS,
        lora_id=None,
        medium=medium,
        lora_name=None,
        extra_keys=extra,
        group_idx=group,
    )


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> EventBatch:
    return EventBatch(ts=0.0, events=list(events), data_parallel_rank=0)


PROMPT = list(range(100, 100 + 10 * BS))  # 10 blocks


def index(mode: str = ENGINE_HASHES, engines: int = 2, **kw: int) -> PrefixIndex:
    idx = PrefixIndex(engines, CONFIG, **kw)
    for rank in range(engines):
        idx.set_mode(rank, mode, "test")
    return idx


def test_prompt_keys_of_a_blob_are_the_digests_low_64_bits() -> None:
    digests = block_hashes(PROMPT, CONFIG)
    good = pack_block_hashes(digests, BS)
    assert prompt_keys(good, BS, len(PROMPT)) == [digest_key(d) for d in digests]
    assert prompt_keys(None, BS, len(PROMPT)) == []
    assert all(
        k == int.from_bytes(d, "big") & (2**64 - 1)
        for k, d in zip(prompt_keys(good, BS, len(PROMPT)), digests, strict=True)
    )


def test_a_blob_the_engine_would_refuse_has_no_keys() -> None:
    """The FEH plugin tier's bad blobs (a caller may build its own): no keys, never an exception."""
    good = pack_block_hashes(block_hashes(PROMPT, CONFIG), BS)
    assert good is not None and prompt_keys(good, BS, len(PROMPT))
    bad: list[object] = [
        b"FEH2" + good[4:],  # magic
        pack_header(BS // 2) + good[8:],  # block size
        good[:6],  # short
        good[:-5],  # ragged
        good[:-32],  # one digest short of the prompt's full blocks
        good.hex(),  # a str
        12345,  # an int
        bytearray(good),  # not bytes (the wire decodes bytes)
    ]
    for blob in bad:
        assert prompt_keys(blob, BS, len(PROMPT)) == [], blob
    assert prompt_keys(good, BS, len(PROMPT) + BS) == []  # the count is for another prompt


def test_stored_then_longest_prefix_per_engine() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 6)))
    idx.apply(1, batch(stored(PROMPT, 0, 2)))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [6, 2]
    idx.apply(1, batch(stored(PROMPT, 2, 10)))  # a continuation, parent = block 1
    assert idx.longest_prefixes(keys_of(PROMPT)) == [6, 10]
    other = PROMPT[: 3 * BS] + [7] * (7 * BS)  # shares 3 blocks
    assert idx.longest_prefixes(keys_of(other)) == [3, 3]
    assert idx.longest_prefixes([]) == [0, 0]


def test_a_hole_ends_the_prefix() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 10)))
    keys = keys_of(PROMPT)
    idx.apply(0, batch(BlockRemoved(block_hashes=[keys[4]], medium="GPU")))
    assert idx.longest_prefixes(keys) == [4, 0]
    assert idx.status(0).removed == 1


def test_removed_only_when_every_medium_dropped_it() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 3), stored(PROMPT, 0, 3, medium="CPU")))
    keys = keys_of(PROMPT)
    idx.apply(0, batch(BlockRemoved(block_hashes=keys[:3], medium="GPU")))
    assert idx.longest_prefixes(keys) == [3, 0]  # still offloaded to CPU
    idx.apply(0, batch(BlockRemoved(block_hashes=keys[:3], medium="CPU")))
    assert idx.longest_prefixes(keys) == [0, 0]


def test_all_blocks_cleared() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 10)))
    idx.apply(0, batch(AllBlocksCleared()))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [0, 0]
    assert idx.status(0).clears == 1


def test_other_groups_and_block_sizes_are_skipped() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 4, group=1)))
    partial = stored(PROMPT, 0, 1)
    partial.block_size = 2
    partial.token_ids = partial.token_ids[:2]
    idx.apply(0, batch(partial))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [0, 0]
    assert idx.status(0).skipped == 5


def test_verifying_switches_to_engine_hashes_when_they_match() -> None:
    idx = index(VERIFYING)
    idx.apply(0, batch(stored(PROMPT, 0, 2)))
    assert idx.mode(0) == VERIFYING
    idx.apply(0, batch(stored(PROMPT, 2, 8)))  # the chain continues from block 1's digest
    assert idx.mode(0) == ENGINE_HASHES and "equal pyfront's" in idx.status(0).reason
    idx.apply(0, batch(stored(PROMPT, 8, 10)))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [10, 0]
    assert VERIFY_BLOCKS <= 8


def test_a_different_seed_is_detected_and_recomputed_from_token_ids() -> None:
    idx = index(VERIFYING)
    # The engine hashes with another none_hash (another PYTHONHASHSEED): its keys are not pyfront's.
    idx.apply(0, batch(stored(PROMPT, 0, 3, OTHER_SEED)))
    assert idx.mode(0) == RECOMPUTED and "PYTHONHASHSEED" in idx.status(0).reason
    idx.apply(0, batch(stored(PROMPT, 3, 10, OTHER_SEED)))  # parent given as the engine's hash
    assert idx.longest_prefixes(keys_of(PROMPT)) == [10, 0]  # pyfront's own keys of the same tokens
    assert idx.longest_prefixes(keys_of(PROMPT, OTHER_SEED)) == [0, 0]  # never the engine's
    # Removals name the engine's hashes: mapped back through the chains.
    engine_keys = keys_of(PROMPT, OTHER_SEED)
    idx.apply(0, batch(BlockRemoved(block_hashes=[engine_keys[5]], medium="GPU")))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [5, 0]


def test_a_block_whose_parent_was_never_seen_is_left_out_in_recomputed_mode() -> None:
    idx = index(RECOMPUTED)
    idx.apply(0, batch(stored(PROMPT, 4, 10, OTHER_SEED)))  # blocks 0-3 never seen: no chain to extend
    assert idx.longest_prefixes(keys_of(PROMPT)) == [0, 0]
    assert idx.status(0).skipped == 6 and idx.status(0).blocks == 0


def test_salted_blocks_chain_with_the_salt() -> None:
    idx = index(RECOMPUTED)
    idx.apply(0, batch(stored(PROMPT, 0, 5, salt="tenant-a")))
    assert idx.longest_prefixes(keys_of(PROMPT, salt="tenant-a")) == [5, 0]
    assert idx.longest_prefixes(keys_of(PROMPT)) == [0, 0]
    assert idx.longest_prefixes(keys_of(PROMPT, salt="tenant-b")) == [0, 0]


def test_salted_chains_prove_nothing() -> None:
    idx = index(VERIFYING)
    idx.apply(0, batch(stored(PROMPT, 0, 10, salt="s")))  # FEH-style salted hashes: pyfront's, but unverifiable
    assert idx.mode(0) == VERIFYING
    assert idx.longest_prefixes(keys_of(PROMPT, salt="s")) == [10, 0]


def test_approximate_records_what_was_sent_and_events_are_ignored() -> None:
    idx = index(APPROXIMATE)
    keys = keys_of(PROMPT)
    idx.record_sent(1, keys[:7])
    assert idx.longest_prefixes(keys) == [0, 7]
    idx.apply(1, batch(AllBlocksCleared()))  # not an events engine
    assert idx.longest_prefixes(keys) == [0, 7]
    events = index(ENGINE_HASHES)
    events.record_sent(0, keys)  # an events engine learns only from its events
    assert events.longest_prefixes(keys) == [0, 0]


def test_the_bound_drops_the_oldest_and_a_restore_refreshes() -> None:
    idx = index(max_blocks=6)
    idx.apply(0, batch(stored(PROMPT, 0, 6)))
    idx.apply(0, batch(stored(PROMPT, 0, 2)))  # blocks 0-1 used again: newest now
    idx.apply(0, batch(stored(PROMPT, 6, 8)))  # two more: 2 and 3 go
    keys = keys_of(PROMPT)
    assert idx.status(0).blocks == 6
    assert idx.longest_prefixes(keys) == [2, 0]
    assert all(k in idx._engines[0].blocks for k in keys[4:8])
    approx = index(APPROXIMATE, max_blocks=3)
    approx.record_sent(0, keys)
    assert approx.status(0).blocks == 3 and approx.longest_prefixes(keys[7:]) == [3, 0]


def test_recomputed_chains_are_bounded_too() -> None:
    idx = index(RECOMPUTED, max_blocks=4)
    idx.apply(0, batch(stored(PROMPT, 0, 10, OTHER_SEED)))
    engine = idx._engines[0]
    assert len(engine.blocks) == 4 and len(engine.chains) == 4


def test_set_mode_and_clear() -> None:
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 10)))
    idx.clear(0, "a gap")
    assert idx.longest_prefixes(keys_of(PROMPT)) == [0, 0]
    assert idx.mode(0) == ENGINE_HASHES and "a gap" in idx.status(0).reason
    idx.apply(0, batch(stored(PROMPT, 0, 10)))
    idx.set_mode(0, VERIFYING, "restarted")
    assert idx.status(0).blocks == 0 and idx.mode(0) == VERIFYING


def test_concurrent_writers_and_readers() -> None:
    """The subscriber thread applies while the event loop (or a worker) looks up: no torn state, no errors."""
    idx = index(ENGINE_HASHES, max_blocks=1000)
    prompts = [[i * 1000 + t for t in range(10 * BS)] for i in range(50)]
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for p in prompts:
                idx.apply(0, batch(stored(p, 0, 10)))
                idx.apply(0, batch(BlockRemoved(block_hashes=keys_of(p)[5:], medium="GPU")))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    while thread.is_alive():
        for p in prompts[::7]:
            seen.add(idx.longest_prefixes(keys_of(p))[0])
    thread.join()
    assert not errors
    assert seen <= {0, 5, 10}
    assert all(idx.longest_prefixes(keys_of(p)) == [5, 0] for p in prompts)


def test_bad_bound() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(1, CONFIG, max_blocks=0)


def stock_salted(tokens: list[int], salt: str, start_block: int, end_block: int) -> BlockStored:
    """What a stock vLLM engine publishes for a salted prompt: hashes with the tagged key ("salt", s) on
    block 0 (so every block's hash differs from pyfront's feh1), extra_keys published untagged, (s,)."""
    parent = CONFIG.none_hash
    digests = []
    for i in range(len(tokens) // BS):
        extra = (("salt", salt),) if i == 0 else None
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i * BS : (i + 1) * BS]), extra), 5)).digest()
        digests.append(parent)
    keys = [digest_key(d) for d in digests]
    return BlockStored(
        block_hashes=keys[start_block:end_block],
        parent_block_hash=keys[start_block - 1] if start_block else None,
        token_ids=tokens[start_block * BS : end_block * BS],
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[(salt,) if i == 0 else None for i in range(start_block, end_block)],
        group_idx=0,
    )


@pytest.mark.parametrize("mode", [VERIFYING, ENGINE_HASHES])
def test_stock_salted_chains_are_rehashed_to_pyfronts_keys(mode: str) -> None:
    """A stock engine's salted blocks never equal pyfront's feh1 hashes; their published (untagged) key and
    token ids give pyfront's, in every mode, and neither they nor their descendants fail verification."""
    idx = index(mode)
    idx.apply(0, batch(stock_salted(PROMPT, "tenant", 0, 3)))
    idx.apply(0, batch(stock_salted(PROMPT, "tenant", 3, 10)))  # a continuation: no extra keys, salted chain
    assert idx.mode(0) == mode, "salted chains prove nothing either way"
    assert idx.longest_prefixes(keys_of(PROMPT, salt="tenant")) == [10, 0]
    stock_keys = [k for k in stock_salted(PROMPT, "tenant", 0, 10).block_hashes]
    idx.apply(0, batch(BlockRemoved(block_hashes=[stock_keys[6]], medium="GPU")))
    assert idx.longest_prefixes(keys_of(PROMPT, salt="tenant")) == [6, 0]
    idx.apply(0, batch(stored(PROMPT, 0, 10)))  # unsalted: verifies (or is trusted)
    assert idx.mode(0) == ENGINE_HASHES
    assert idx.longest_prefixes(keys_of(PROMPT)) == [10, 0]


def test_copies_of_a_block_are_counted() -> None:
    """vLLM stores a recomputed block as a second copy (own BlockStored, later own BlockRemoved): the block is
    cached until both copies are gone."""
    idx = index()
    idx.apply(0, batch(stored(PROMPT, 0, 10)))
    idx.apply(0, batch(stored(PROMPT, 9, 10)))  # the last block recomputed by a repeat of the prompt
    last = keys_of(PROMPT)[9]
    idx.apply(0, batch(BlockRemoved(block_hashes=[last], medium="GPU")))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [10, 0]
    idx.apply(0, batch(BlockRemoved(block_hashes=[last], medium="GPU")))
    assert idx.longest_prefixes(keys_of(PROMPT)) == [9, 0]
