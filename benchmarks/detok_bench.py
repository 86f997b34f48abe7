"""Per-token cost of the text layer: `TextStream.add` with one token at a time.

Usage: python benchmarks/detok_bench.py [--repeats 7] [--tokens 20000]

Streams a long generated text (English prose, code, CJK and emoji, with multi-token characters)
through a fresh `TextStream` per run, one `add([token_id])` call per token, exactly as the server
does for a decode step, and prints the median (over `--repeats` runs) of the mean microseconds per
token for: no stop strings; two stop strings that never match; the same with
include_stop_str_in_output (no hold-back); plus the raw `DecodeStream.step` and our
`IncrementalDetokenizer.push` for reference, and the slow pure-Python path.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer
from pyfront.server.text.detokenizer import DetokenizerFactory, get_factory
from pyfront.server.text.stream import TextStream

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks "
    "were striking thirteen. ",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\n",
    "你好，世界！今天天气很好，我们一起去公园散步吧。日本語のテキストとカタカナ。",  # noqa: RUF001
    "Emoji time: 🎉🙂👍🏽 👨‍👩‍👧‍👦 🇫🇷 — done. ",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}, "text": "naïve café"}\n',
]


def make_ids(tokenizer, n_tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids.extend(tokenizer.encode(rng.choice(PARAGRAPHS)))
    return ids[:n_tokens]


def median_us_per_token(run: Callable[[], None], n_tokens: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / n_tokens * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=20000)
    args = ap.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(ensure_qwen3_tokenizer())
    factory = get_factory(tokenizer)
    slow_factory = DetokenizerFactory(tokenizer, mode="slow")
    ids = make_ids(tokenizer, args.tokens)
    singles = [[t] for t in ids]
    backend = factory.backend
    stops = ["<|stop-here|>", "\n\n\n\n"]  # never generated: measures search + hold-back cost

    def raw_decode_stream() -> None:
        step = DecodeStream(skip_special_tokens=True).step
        for t in ids:
            step(backend, t)

    def detok_push() -> None:
        push = factory.detokenizer(prompt_tail=ids[:8]).push
        for t in ids:
            push(t)

    def stream(factory_, stop, include=False) -> Callable[[], None]:
        def run() -> None:
            add = TextStream(factory_, stop, include_stop_str_in_output=include, prompt_tail=ids[:8]).add
            for one in singles:
                add(one)

        return run

    rows = [
        ("DecodeStream.step (raw, reference)", raw_decode_stream),
        ("IncrementalDetokenizer.push", detok_push),
        ("TextStream.add, no stop strings", stream(factory, ())),
        ("TextStream.add, 2 stop strings", stream(factory, stops)),
        ("TextStream.add, 2 stop strings, include_stop_str", stream(factory, stops, include=True)),
        ("TextStream.add, slow path, no stops", stream(slow_factory, ())),
    ]
    print(f"{len(ids)} tokens, {len(tokenizer.decode(ids))} chars; median of {args.repeats} runs")
    for name, run in rows:
        run()  # warm-up
        print(f"{name:50s} {median_us_per_token(run, len(ids), args.repeats):7.3f} us/token")


if __name__ == "__main__":
    main()
