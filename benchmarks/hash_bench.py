"""Block-hash speed: the plain reference loop vs cold `block_hashes` vs `PrefixMemo` on a growing chat.

Usage: python benchmarks/hash_bench.py [--repeats 7] [--turns 50] [--tokens-per-turn 2000]

The conversation grows by about `--tokens-per-turn` tokens a turn (jittered, seeded) to about 100k tokens;
every turn re-sends the whole history, as chat clients do. Each figure is the median over `--repeats`
runs (these machines are 2-core and noisy); ratios are reference time / candidate time, so > 1 is faster.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import pickle
import random
import statistics
import time
from collections.abc import Callable

from pyfront.hashing import HashConfig, PrefixMemo, block_hashes


def reference_loop(token_ids: list[int], block_size: int, none_hash: bytes) -> list[bytes]:
    """The recipe as docs/engine-protocol.md#block-hash-recipe writes it, one block at a time."""
    out = []
    parent = none_hash
    for i in range(len(token_ids) // block_size):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        parent = hashlib.sha256(pickle.dumps((parent, block, None), protocol=5)).digest()
        out.append(parent)
    return out


def conversation(turns: int, per_turn: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    history: list[int] = []
    prompts = []
    for _ in range(turns):
        added = rng.randrange(per_turn - 200, per_turn + 200)
        history = history + [rng.randrange(0, 151_000) for _ in range(added)]
        prompts.append(history)
    return prompts


def timed(fn: Callable[[], object]) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def run(block_size: int, prompts: list[list[int]], repeats: int) -> None:
    """Print this block size's rows."""
    last = prompts[-1]
    config = HashConfig.default(block_size)
    expected = reference_loop(last, block_size, config.none_hash)
    assert block_hashes(last, config) == expected

    ref = [timed(lambda: reference_loop(last, block_size, config.none_hash)) for _ in range(repeats)]
    cold = [timed(lambda: block_hashes(last, config)) for _ in range(repeats)]
    memo_last, memo_all, memo_cold = [], [], []
    for _ in range(repeats):
        memo = PrefixMemo(config)
        memo_cold.append(timed(lambda m=memo: m.block_hashes(last)))  # memo overhead on a cold prompt
        memo = PrefixMemo(config)
        per_turn = [timed(lambda m=memo, p=p: m.block_hashes(p)) for p in prompts]
        memo_last.append(per_turn[-1])
        memo_all.append(sum(per_turn))
        assert memo.block_hashes(last) == expected
    ref_all = [sum(timed(lambda p=p: reference_loop(p, block_size, config.none_hash)) for p in prompts)]

    ref_ms = median_ms(ref)
    rows = [
        ("reference loop, last turn", ref_ms),
        ("block_hashes (cold), last turn", median_ms(cold)),
        ("PrefixMemo, cold prompt (no reuse)", median_ms(memo_cold)),
        (f"PrefixMemo, turn {len(prompts)} of the chat", median_ms(memo_last)),
    ]
    for what, ms in rows:
        print(f"{block_size:>5} {what:<40} {ms:>10.3f} {ref_ms / ms:>12.2f}x")
    total_ref = median_ms(ref_all)
    total_memo = median_ms(memo_all)
    print(
        f"{block_size:>5} {'all turns: reference / PrefixMemo':<40} "
        f"{total_ref:>6.1f}/{total_memo:<5.1f} {total_ref / total_memo:>10.2f}x"
    )
    print(f"{'':>5} per block: reference {ref_ms * 1e3 / len(expected):.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--tokens-per-turn", type=int, default=2000)
    args = parser.parse_args()

    prompts = conversation(args.turns, args.tokens_per_turn)
    last_len = len(prompts[-1])
    print(f"conversation: {args.turns} turns, last turn {last_len:,} tokens; medians of {args.repeats} runs")
    header = f"{'block':>5} {'what':<40} {'median ms':>10} {'vs reference':>13}"
    print(header)
    print("-" * len(header))
    for block_size in (16, 32):
        run(block_size, prompts, args.repeats)


if __name__ == "__main__":
    main()
