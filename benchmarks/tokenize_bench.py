"""Prompt tokenization of a growing agentic chat: plain ``encode`` vs the segment-memoized tokenizer.

A 50-turn chat grows by about 2k tokens per turn (a user message, an assistant answer, every fifth turn a tool call
and its result) to about 100k tokens, rendered with the bundled Qwen3 chat template. The text is real English: the
docstrings of Python's standard library. For every turn the benchmark times

* ``plain``: ``tokenizer.encode(prompt, add_special_tokens=False)``, what the server does today;
* ``segmented``: the first ``SegmentTokenizer.encode(prompt)`` of that turn, the cache holding the earlier turns
  (what a server sees when the client re-sends the history);
* ``all hits``: the same prompt again (every segment cached).

Each number is the median over ``--runs`` replays of the whole chat (a fresh cache per replay). It also compares
``encode``/``encode_batch``/``encode_batch_fast`` for encoding the cache misses, and a cold 100k-token prompt.

    python benchmarks/tokenize_bench.py [--turns 50] [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the server runs it
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer
from pyfront.server.text.segment_cache import SegmentTokenizer


def _words(text: str) -> list[str]:
    return text.split()


_MODULES = _words(
    "argparse asyncio collections concurrent.futures contextlib dataclasses datetime decimal email.message enum "
    "functools http.client http.server importlib inspect io itertools json logging multiprocessing os pathlib pickle "
    "queue random re shutil socket sqlite3 ssl statistics string subprocess tarfile threading typing unittest "
    "urllib.request uuid zipfile textwrap difflib heapq bisect csv configparser tempfile glob fnmatch calendar pydoc "
    "doctest ftplib imaplib smtplib mailbox optparse pdb pstats sched selectors shelve wave xml.dom.minidom "
    "zipimport fractions numbers ipaddress locale gettext codecs base64 hashlib hmac secrets struct copy pprint "
    "reprlib weakref types abc contextvars trace traceback warnings timeit cmd shlex platform sysconfig plistlib "
    "netrc mimetypes html.parser webbrowser"
)


def english_paragraphs() -> list[str]:
    """Docstrings (longer than 150 characters) of standard-library modules, classes, functions and methods."""
    out: list[str] = []
    seen: set[str] = set()

    def add(doc: str | None) -> None:
        if doc and len(doc) > 150 and doc not in seen:
            seen.add(doc)
            out.append(doc)

    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        add(inspect.getdoc(module))
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", "") != module.__name__:
                continue
            add(inspect.getdoc(obj))
            if inspect.isclass(obj):
                for method_name, method in sorted(vars(obj).items()):
                    if not method_name.startswith("_") and inspect.isfunction(method):
                        add(inspect.getdoc(method))
    return out


class TextSource:
    """Consecutive paragraphs, cut to roughly the requested number of tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.paragraphs = english_paragraphs()
        self.tokenizer = tokenizer
        self.index = 0

    def take(self, tokens: int) -> str:
        parts: list[str] = []
        count = 0
        while count < tokens:
            paragraph = self.paragraphs[self.index % len(self.paragraphs)]
            if self.index >= len(self.paragraphs):  # wrapped around: keep messages distinct
                paragraph = f"(part {self.index // len(self.paragraphs) + 1}) {paragraph}"
            n = len(self.tokenizer.encode(paragraph, add_special_tokens=False))
            if parts and count + n - tokens > n // 2:  # would overshoot by more than it helps: keep it for later
                break
            self.index += 1
            parts.append(paragraph)
            count += n
        return "\n\n".join(parts)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_docs",
            "description": "Read the documentation of a Python module.",
            "parameters": {"type": "object", "properties": {"module": {"type": "string"}}, "required": ["module"]},
        },
    }
]


def build_prompts(tokenizer: Any, turns: int, per_turn: int) -> list[str]:
    source = TextSource(tokenizer)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful Python expert."}]
    prompts = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn + 1}. " + source.take(per_turn // 2 - 40)})
        prompts.append(tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True))
        if turn % 5 == 4:
            call = {"name": "read_docs", "arguments": {"module": _MODULES[turn % len(_MODULES)]}}
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}
            )
            messages.append({"role": "tool", "content": source.take(per_turn // 4)})
            messages.append({"role": "assistant", "content": source.take(per_turn // 4 - 40)})
        else:
            messages.append({"role": "assistant", "content": source.take(per_turn // 2 - 40)})
    return prompts


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return (time.perf_counter() - start) * 1e3, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--tokens-per-turn", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5, help="replays of the whole chat (median per turn)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_qwen3_tokenizer(), local_files_only=True)
    prompts = build_prompts(tokenizer, args.turns, args.tokens_per_turn)

    def plain_encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    reference = [plain_encode(p) for p in prompts]
    start = time.perf_counter()
    checked = SegmentTokenizer(tokenizer, log=False)
    print(f"SegmentTokenizer start-up (copy + self-check): {(time.perf_counter() - start) * 1e3:.0f} ms")
    assert checked.supported, checked.reason

    plain: list[list[float]] = [[] for _ in prompts]
    segmented: list[list[float]] = [[] for _ in prompts]
    hits: list[list[float]] = [[] for _ in prompts]
    for _ in range(args.runs):
        seg = SegmentTokenizer(tokenizer, self_check=False, log=False)
        for turn, prompt in enumerate(prompts):
            ms, ids = timed(plain_encode, prompt)
            plain[turn].append(ms)
            ms, ids = timed(seg.encode, prompt)
            assert ids == reference[turn], f"mismatch at turn {turn + 1}"
            segmented[turn].append(ms)
            ms, ids = timed(seg.encode, prompt)
            assert ids == reference[turn]
            hits[turn].append(ms)
    stats = seg.stats

    print(f"\n{args.turns}-turn chat, Qwen3 template, median of {args.runs} replays (ms per prompt):\n")
    print(f"{'turn':>5} {'tokens':>8} {'plain':>9} {'segmented':>10} {'all hits':>9} {'speed-up':>9}")
    marks = sorted({t for t in (1, 10, 25, 50, args.turns) if t <= args.turns})
    for turn in marks:
        i = turn - 1
        p, s, h = (statistics.median(x[i]) for x in (plain, segmented, hits))
        print(f"{turn:>5} {len(reference[i]):>8} {p:>9.2f} {s:>10.2f} {h:>9.2f} {p / s:>8.1f}x")
    total_plain = sum(statistics.median(x) for x in plain)
    total_seg = sum(statistics.median(x) for x in segmented)
    print(f"{'all':>5} {'':>8} {total_plain:>9.1f} {total_seg:>10.1f} {'':>9} {total_plain / total_seg:>8.1f}x")
    print(
        f"\nlast replay: {stats.requests} encodes, segment hit rate {stats.segment_hit_rate:.1%}, "
        f"token hit rate {stats.token_hit_rate:.1%}, "
        f"{stats.cached_entries} entries / {stats.cached_tokens} tokens cached"
    )

    # Encoding the misses: one call per segment, one encode_batch, one encode_batch_fast.
    final = prompts[-1]
    seg = SegmentTokenizer(tokenizer, self_check=False, log=False)
    segments = [p for p in seg._split(final)[0::2] if p]
    backend = seg._rest_backend
    long_segments = sorted(segments, key=len)[-8:]
    short_segments = [p for p in segments if len(p) < 40][:8]
    print("\nencoding cache misses (median of 5, ms):")
    print(f"{'':>36} {'encode x N':>11} {'encode_batch':>13} {'encode_batch_fast':>18}")
    for label, batch in (
        (f"all {len(segments)} segments of the last prompt", segments),
        (f"8 long segments ({sum(map(len, long_segments))} chars)", long_segments),
        ("8 short segments ('\\n', 'user\\n', ...)", short_segments),
    ):
        row = []
        for fn in (
            lambda b: [backend.encode(t, add_special_tokens=False).ids for t in b],
            lambda b: [e.ids for e in backend.encode_batch(b, add_special_tokens=False)],
            lambda b: [e.ids for e in backend.encode_batch_fast(b, add_special_tokens=False)],
        ):
            row.append(statistics.median(timed(fn, batch)[0] for _ in range(5)))
        print(f"{label:>36} {row[0]:>11.2f} {row[1]:>13.2f} {row[2]:>18.2f}")

    cold_plain = statistics.median(timed(plain_encode, final)[0] for _ in range(5))
    cold_seg = []
    for _ in range(5):
        seg = SegmentTokenizer(tokenizer, self_check=False, log=False)
        cold_seg.append(timed(seg.encode, final)[0])
    print(
        f"\ncold {len(reference[-1])}-token prompt (nothing cached): plain {cold_plain:.1f} ms, "
        f"segmented {statistics.median(cold_seg):.1f} ms"
    )


if __name__ == "__main__":
    main()
