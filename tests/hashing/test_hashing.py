"""Exactness of the feh1 block hashes, the wire blob and the prefix memo against a plain reference."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import pickle
import random
import threading

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront import hashing
from pyfront.hashing import HashConfig, PrefixMemo, PromptHasher, block_hashes, pack_block_hashes, unpack_block_hashes
from pyfront.hashing import blocks as blocks_module
from pyfront.hashing.blocks import SMALL_SHA_MAX_BLOCKS

INT32_MAX = 2**31 - 1


def reference_none_hash(seed: str = "vllm-none-hash") -> bytes:
    return hashlib.sha256(pickle.dumps(seed, protocol=5)).digest()


def reference_block_hashes(token_ids, block_size, none_hash, cache_salt=None) -> list[bytes]:
    """The recipe as written in docs/engine-protocol.md#block-hash-recipe, one block at a time, nothing clever."""
    out = []
    parent = none_hash
    for i in range(len(token_ids) // block_size):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        extra = (cache_salt,) if i == 0 and isinstance(cache_salt, str) and cache_salt else None
        parent = hashlib.sha256(pickle.dumps((parent, block, extra), protocol=5)).digest()
        out.append(parent)
    return out


def config(block_size: int, none_hash: bytes | None = None) -> HashConfig:
    return HashConfig(hashing.ALGORITHM, block_size, none_hash or reference_none_hash())


# ---------------------------------------------------------------- fixed vectors


def test_worked_example_from_the_spec(protocol_vectors) -> None:
    example = protocol_vectors["feh_example"]
    results = example["results"]
    tokens = list(range(1000, 1064))
    cfg = HashConfig.default(example["block_size"])
    assert cfg.none_hash.hex() == results["NONE_HASH_feh1"]

    plain = block_hashes(tokens, cfg)
    assert [h.hex() for h in plain] == [results["block0_nosalt_feh1"], results["block1_chained_feh1"]]
    salted = block_hashes(tokens, cfg, cache_salt=example["cache_salt"])
    assert [h.hex() for h in salted] == [results["block0_salt_abc_feh1"], results["block1_salt_abc_feh1"]]

    # The exact pickle bytes of block 0: proves the recipe, not just a matching digest.
    pickled = bytes.fromhex(results["pickle5_bytes_block0_nosalt_hex"])
    assert pickled == pickle.dumps((cfg.none_hash, tuple(range(1000, 1032)), None), protocol=5)
    assert hashlib.sha256(pickled).digest() == plain[0]

    blob = pack_block_hashes(plain, 32)
    assert blob.hex() == results["wire_nosalt_hex"]
    assert len(blob) == results["wire_len"]
    assert unpack_block_hashes(blob, 32, 70) == plain  # 70 tokens: still 2 full blocks
    assert results["n_full_blocks_for_70_tokens"] == 2


def test_spec_table_values() -> None:
    """The table in docs/engine-protocol.md#block-hash-recipe, typed in by hand (independent of the vectors file)."""
    cfg = HashConfig.default(32)
    tokens = list(range(1000, 1064))
    assert cfg.none_hash.hex() == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    assert block_hashes(tokens, cfg)[1].hex() == ("3b69946cbf3e2624320dcf826abb99a18eb0ff1af9504282483b51bb134f02d2")
    assert block_hashes(tokens, cfg, "abc")[1].hex() == (
        "3a98ba998c76068058ce48b95c9576de19540df3d25bf60aea0e77037d255491"
    )


def test_none_hash_follows_pythonhashseed(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert hashing.default_none_hash().hex() == ("1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c")
    monkeypatch.delenv("PYTHONHASHSEED")
    assert hashing.default_none_hash() == reference_none_hash()


# ---------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    ("algorithm", "block_size", "none_hash"),
    [
        ("sha256-cbor", 16, bytes(32)),
        ("sha256-pickle5-feh2", 16, bytes(32)),
        (hashing.ALGORITHM, 0, bytes(32)),
        (hashing.ALGORITHM, -4, bytes(32)),
        (hashing.ALGORITHM, 16.0, bytes(32)),
        (hashing.ALGORITHM, True, bytes(32)),
        (hashing.ALGORITHM, 16, bytes(31)),
        (hashing.ALGORITHM, 16, bytes(33)),
        (hashing.ALGORITHM, 16, "0" * 32),
    ],
)
def test_hash_config_rejects_bad_values(algorithm, block_size, none_hash) -> None:
    with pytest.raises(ValueError):
        HashConfig(algorithm, block_size, none_hash)


def test_hash_config_is_frozen_and_comparable() -> None:
    a = HashConfig.default(16)
    assert a == HashConfig(hashing.ALGORITHM, 16, reference_none_hash())
    assert a != HashConfig.default(32)
    assert len({a, HashConfig.default(16)}) == 1
    with pytest.raises(AttributeError):
        a.block_size = 32  # type: ignore[misc]


# ---------------------------------------------------------------- exactness, property-based

salts = st.one_of(st.none(), st.just(""), st.text(alphabet="abcXYZ019-_", max_size=12), st.text(max_size=12))
int32_ids = st.integers(min_value=0, max_value=INT32_MAX)
# Ids cluster around the pickle encoding boundaries (1-, 2- and 4-byte BININT) as well as spread widely.
boundary_ids = st.sampled_from([0, 1, 255, 256, 257, 65535, 65536, 65537, 151643, 2**24, INT32_MAX - 1, INT32_MAX])
token_lists = st.lists(st.one_of(int32_ids, boundary_ids), max_size=5000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tokens=token_lists, block_size=st.integers(min_value=1, max_value=256), salt=salts)
def test_block_hashes_match_reference(tokens, block_size, salt) -> None:
    cfg = config(block_size)
    expected = reference_block_hashes(tokens, block_size, cfg.none_hash, salt)
    assert block_hashes(tokens, cfg, salt) == expected
    assert block_hashes(tuple(tokens), cfg, salt) == expected
    memo = PrefixMemo(cfg, checkpoint_tokens=random.choice([1, 7, 64, 1024]), direct_max_blocks=0)
    assert memo.block_hashes(tokens, salt) == expected
    assert memo.block_hashes(tokens, salt) == expected  # second time from the memo
    blob = pack_block_hashes(expected, block_size)
    if len(tokens) < block_size:
        assert blob is None
    else:
        assert unpack_block_hashes(blob, block_size, len(tokens)) == expected


@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 5, 16, 32, 128, 256, 1000])
def test_every_tuple_arity_and_partial_blocks(block_size) -> None:
    """Tuples of 1-3 items pickle with TUPLE1-3, longer ones with MARK..TUPLE: all must match."""
    rng = random.Random(block_size)
    for length in (0, block_size - 1, block_size, block_size + 1, 3 * block_size + block_size // 2):
        tokens = [rng.randrange(0, 200_000) for _ in range(max(length, 0))]
        cfg = config(block_size)
        assert block_hashes(tokens, cfg) == reference_block_hashes(tokens, block_size, cfg.none_hash)
        assert len(block_hashes(tokens, cfg)) == max(length, 0) // block_size


@pytest.mark.parametrize("blocks", [1, SMALL_SHA_MAX_BLOCKS, SMALL_SHA_MAX_BLOCKS + 1, 40])
def test_both_sha256_implementations_give_the_reference(blocks: int) -> None:
    """Chains of at most SMALL_SHA_MAX_BLOCKS blocks hash with CPython's own SHA-256, longer ones with OpenSSL's: the
    reference hashes with OpenSSL's every time."""
    built_in = any(importlib.util.find_spec(name) is not None for name in ("_sha2", "_sha256"))
    assert (blocks_module._SMALL_SHA256 is not hashlib.sha256) == built_in
    rng = random.Random(blocks)
    for block_size in (1, 16):
        tokens = [
            rng.choice([0, 255, 256, 65536, INT32_MAX, rng.randrange(200_000)]) for _ in range(block_size * blocks + 3)
        ]
        cfg = config(block_size)
        for salt in (None, "tenant"):
            assert block_hashes(tokens, cfg, salt) == reference_block_hashes(tokens, block_size, cfg.none_hash, salt)


def test_the_built_in_sha256_is_used_only_when_it_agrees(monkeypatch, caplog) -> None:
    def missing(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(blocks_module.importlib, "import_module", missing)
    with caplog.at_level(logging.INFO, logger="pyfront.hashing.blocks"):
        assert blocks_module._small_sha256() is hashlib.sha256
    assert "no built-in SHA-256" in caplog.text

    class Wrong:
        @staticmethod
        def sha256(data: bytes = b"") -> object:
            return hashlib.sha256(data + b"!")

    monkeypatch.setattr(blocks_module.importlib, "import_module", lambda name: Wrong)
    with caplog.at_level(logging.WARNING, logger="pyfront.hashing.blocks"):
        assert blocks_module._small_sha256() is hashlib.sha256
    assert "disagrees with OpenSSL's" in caplog.text


def test_ids_outside_int32_are_hashed_as_pickle_would() -> None:
    """Negative, huge and bool ids are not the engine's, but if asked they are hashed exactly."""
    cfg = config(4)
    for tokens, memoizable in (
        ([-1, -(2**31), 5, 6], True),  # int32 still: the fingerprint represents them exactly
        ([2**31, 2**40, 2**70, 7], False),
        ([True, False, 1, 0], False),
        ([1, 2, 3, -(2**31) - 1], False),
    ):
        expected = reference_block_hashes(tokens, 4, cfg.none_hash)
        assert block_hashes(tokens, cfg) == expected
        memo = PrefixMemo(cfg, checkpoint_tokens=4, direct_max_blocks=0)
        assert memo.block_hashes(tokens) == expected
        assert memo.block_hashes(tokens) == expected
        # Ids the fingerprint cannot represent exactly are never memoized (bools would collide with 0/1).
        assert memo.stats.skipped == (0 if memoizable else 2)
        assert memo.stats.hits == (1 if memoizable else 0)


def test_unpicklable_ids_are_refused() -> None:
    cfg = config(2)
    with pytest.raises(ValueError):
        block_hashes([1, lambda: 0], cfg)
    with pytest.raises(ValueError):
        PrefixMemo(cfg, direct_max_blocks=0).block_hashes([1, lambda: 0])


@pytest.mark.parametrize("salt", [b"abc", 7, ["abc"]])
def test_non_str_salt_is_refused(salt) -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3, 4], config(2), salt)


def test_empty_salt_is_no_salt() -> None:
    cfg = config(2)
    assert block_hashes([1, 2, 3, 4], cfg, "") == block_hashes([1, 2, 3, 4], cfg)
    assert block_hashes([1, 2, 3, 4], cfg, "x") != block_hashes([1, 2, 3, 4], cfg)
    assert block_hashes([1, 2, 3, 4], cfg, "é")[0] == reference_block_hashes([1, 2, 3, 4], 2, cfg.none_hash, "é")[0]


def test_other_none_hash_changes_every_block() -> None:
    tokens = list(range(64))
    a = block_hashes(tokens, config(16))
    b = block_hashes(tokens, config(16, none_hash=bytes(range(32))))
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert b == reference_block_hashes(tokens, 16, bytes(range(32)))


# ---------------------------------------------------------------- wire blob


def test_pack_and_unpack_errors() -> None:
    hashes = block_hashes(list(range(64)), config(16))
    blob = pack_block_hashes(hashes, 16)
    assert blob[:8] == b"FEH1" + (16).to_bytes(4, "little")
    assert len(blob) == 8 + 32 * 4
    assert pack_block_hashes([], 16) is None
    with pytest.raises(ValueError):
        pack_block_hashes([b"short"], 16)
    with pytest.raises(ValueError, match="magic"):
        unpack_block_hashes(b"FEH2" + blob[4:], 16, 64)
    with pytest.raises(ValueError, match="block size"):
        unpack_block_hashes(blob, 32, 64)
    with pytest.raises(ValueError, match="multiple"):
        unpack_block_hashes(blob + b"x", 16, 64)
    with pytest.raises(ValueError, match="full blocks"):
        unpack_block_hashes(blob, 16, 80)
    with pytest.raises(ValueError, match="full blocks"):
        unpack_block_hashes(blob, 16, 63)
    with pytest.raises(ValueError, match="header"):
        unpack_block_hashes(b"FEH", 16, 0)
    assert unpack_block_hashes(blob, 16, 79) == hashes
    assert unpack_block_hashes(bytearray(blob), 16, 64) == hashes


# ---------------------------------------------------------------- memo


def _conversation_turns(rng: random.Random, turns: int) -> list[tuple[list[int], str | None]]:
    """Multi-turn prompts: each extends, truncates or diverges from an earlier one; salts switch."""
    history: list[list[int]] = [[rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 3000))]]
    out = []
    for _ in range(turns):
        base = rng.choice(history)
        action = rng.random()
        if action < 0.5:
            tokens = base + [rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 2500))]
        elif action < 0.7:
            tokens = base[: rng.randrange(0, len(base) + 1)]
        elif action < 0.9 and base:
            cut = rng.randrange(0, len(base))
            tokens = [*base[:cut], rng.randrange(0, 151_000), *base[cut + 1 :]]
        else:
            tokens = [rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 4000))]
        history.append(tokens)
        out.append((tokens, rng.choice([None, None, None, "", "tenant-a", "tenant-ü"])))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_size", [1, 16, 32, 100])
def test_memo_equals_plain_over_random_conversations(seed, block_size) -> None:
    rng = random.Random(seed * 1000 + block_size)
    cfg = config(block_size)
    memo = PrefixMemo(
        cfg, checkpoint_tokens=rng.choice([64, 256, 1024]), max_entries=rng.choice([2, 8, 1024]), direct_max_blocks=0
    )
    for tokens, salt in _conversation_turns(rng, 30 if block_size > 1 else 8):
        assert memo.block_hashes(tokens, salt) == reference_block_hashes(tokens, block_size, cfg.none_hash, salt)
    stats = memo.stats
    assert stats.hits > 0
    assert stats.blocks_hashed < stats.blocks_total
    assert stats.entries <= memo.max_entries


def test_memo_reuses_prefix_and_counts() -> None:
    cfg = config(16)
    memo = PrefixMemo(cfg, checkpoint_tokens=1024, direct_max_blocks=0)
    rng = random.Random(1)
    turn1 = [rng.randrange(0, 151_000) for _ in range(5000)]
    turn2 = turn1 + [rng.randrange(0, 151_000) for _ in range(2000)]
    memo.block_hashes(turn1)
    assert memo.stats.blocks_hashed == 5000 // 16
    assert memo.block_hashes(turn2) == reference_block_hashes(turn2, 16, cfg.none_hash)
    # turn1's full-block end (4992) is fingerprinted as a recent end: only the blocks after it are hashed.
    assert memo.stats.blocks_hashed == 5000 // 16 + (7000 // 16 - 4992 // 16)
    # A repeat of a prompt hits its own end key and hashes nothing.
    memo.block_hashes(turn2)
    assert memo.stats.blocks_hashed == 5000 // 16 + (7000 // 16 - 4992 // 16)
    assert memo.stats.hits == 2
    # Same prefix under another salt shares nothing.
    memo.block_hashes(turn2, "other")
    assert memo.stats.hits == 2
    # A diverging id inside the first checkpoint forces a full re-hash.
    diverged = [turn2[0] + 1, *turn2[1:]]
    before = memo.stats.blocks_hashed
    assert memo.block_hashes(diverged) == reference_block_hashes(diverged, 16, cfg.none_hash)
    assert memo.stats.blocks_hashed - before == 7000 // 16


def test_memo_checkpoint_rounds_to_block_size() -> None:
    assert PrefixMemo(config(48), checkpoint_tokens=1024).checkpoint_tokens == 1008
    assert PrefixMemo(config(2000), checkpoint_tokens=1024).checkpoint_tokens == 2000
    with pytest.raises(ValueError):
        PrefixMemo(config(16), max_entries=0)


def test_memo_eviction_keeps_results_exact() -> None:
    cfg = config(8)
    memo = PrefixMemo(cfg, checkpoint_tokens=64, max_entries=2, direct_max_blocks=0)
    rng = random.Random(7)
    prompts = [[rng.randrange(0, 1000) for _ in range(300)] for _ in range(5)]
    for _ in range(3):
        for prompt in prompts:
            assert memo.block_hashes(prompt) == reference_block_hashes(prompt, 8, cfg.none_hash)
            assert memo.stats.entries <= 2
    # Evicted entries leave no stale keys: what is indexed belongs to the live entries.
    assert set(memo._index.values()) <= set(memo._entries)
    assert len(memo._index) <= sum(len(e.keys) for e in memo._entries.values())


def test_memo_from_eight_threads_at_once() -> None:
    cfg = config(16)
    memo = PrefixMemo(cfg, checkpoint_tokens=128, max_entries=16, direct_max_blocks=0)
    rng = random.Random(3)
    base = [rng.randrange(0, 151_000) for _ in range(4000)]
    prompts = [
        (
            base[: rng.randrange(0, 4000)] + [rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 600))],
            rng.choice([None, "s"]),
        )
        for _ in range(64)
    ]
    expected = [reference_block_hashes(p, 16, cfg.none_hash, s) for p, s in prompts]
    failures: list[int] = []
    barrier = threading.Barrier(8)

    def worker(offset: int) -> None:
        barrier.wait()
        for round_ in range(3):
            for i in range(len(prompts)):
                j = (i * 7 + offset + round_) % len(prompts)
                if memo.block_hashes(*prompts[j]) != expected[j]:
                    failures.append(j)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    stats = memo.stats
    assert stats.requests == 8 * 3 * 64 - sum(1 for p, _ in prompts if len(p) < 16) * 24
    assert stats.hits > 0


# ---------------------------------------------------------------- async hasher


def test_prompt_hasher_returns_packed_blob() -> None:
    cfg = config(16)
    hasher = PromptHasher(cfg)
    tokens = list(range(40_000, 40_000 + 1000))

    async def main() -> None:
        assert await hasher.hash_prompt(tokens[:15]) is None
        small = await hasher.hash_prompt(tokens[:40])  # inline path
        assert small == pack_block_hashes(reference_block_hashes(tokens[:40], 16, cfg.none_hash), 16)
        big = await hasher.hash_prompt(tokens, "salt")  # worker thread path
        assert big == pack_block_hashes(reference_block_hashes(tokens, 16, cfg.none_hash, "salt"), 16)

    anyio.run(main)
    with pytest.raises(ValueError):
        PromptHasher(cfg, PrefixMemo(config(32)))


def test_event_loop_keeps_ticking_while_a_long_prompt_hashes() -> None:
    cfg = config(16)
    hasher = PromptHasher(cfg)
    rng = random.Random(5)
    tokens = [rng.randrange(0, 151_000) for _ in range(200_000)]
    ticks_during = 0

    async def main() -> bytes | None:
        nonlocal ticks_during
        done = anyio.Event()
        result: list[bytes | None] = []

        async def hash_it() -> None:
            result.append(await hasher.hash_prompt(tokens))
            done.set()

        async def ticker() -> None:
            nonlocal ticks_during
            while not done.is_set():
                ticks_during += 1
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(hash_it)
            tg.start_soon(ticker)
        return result[0]

    blob = anyio.run(main)
    assert blob == pack_block_hashes(reference_block_hashes(tokens, 16, cfg.none_hash), 16)
    # Inline hashing would let the ticker run at most once or twice; off the loop it runs throughout.
    assert ticks_during > 50


@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_short_prompts_are_hashed_outright_with_the_same_chain(block_size: int) -> None:
    """PrefixMemo.direct_max_blocks: prompts of at most that many blocks bypass the memo; the chain is the same."""
    rng = random.Random(block_size)
    cfg = config(block_size)
    direct, memoized = PrefixMemo(cfg), PrefixMemo(cfg, direct_max_blocks=0)
    assert direct.direct_max_blocks == hashing.memo.DIRECT_MAX_BLOCKS == 8
    for blocks in [0, 1, 2, 7, 8, 9, 12, 8, 1]:
        ids = [rng.randrange(1 << 17) for _ in range(blocks * block_size + rng.randrange(block_size))]
        for salt in (None, "tenant-a"):
            want = block_hashes(ids, cfg, salt)
            assert direct.block_hashes(ids, salt) == want == memoized.block_hashes(ids, salt)
    stats = direct.stats
    # 16 calls had a full block; the two 9- and the two 12-block prompts went through the memo (entries, keys).
    assert stats.requests == 16 and stats.entries == 4 and stats.hits == 0
    assert stats.blocks_total == stats.blocks_hashed == 2 * (1 + 2 + 7 + 8 + 9 + 12 + 8 + 1)
