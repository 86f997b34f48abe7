"""Where the time of one long chat turn goes, stage by stage, in process (no HTTP, no engine).

Builds the chat of ``loadgen.py``'s ``chat`` scenario (the "multi-turn" row of ``peers.py``): every turn appends a
user message of ~``--turn-tokens`` tokens of English prose and the assistant's previous short reply, to ~100k tokens
at turn 50. It replays turns 1..T-1 through the server's own code (so the segment cache and the hash memo are warm
as in a server that saw them), then times every stage of turn T, ``--repeats`` times, and prints the medians:

    decode body     decode_chat_request (bodies > 256 KiB: on a worker thread in the server)
    message dicts   message_dicts
    render          Tokenizer.render_chat (transformers' apply_chat_template, jinja)
    tokenize        SegmentTokenizer.encode of the rendered prompt, the cache as after turn T-1 (restored before
                    every repeat): encodes the new user message and the last reply, the rest are hits
    tokenize (hits) the same with every segment cached
    sampling        sampling.build_sampling_params
    hash            PrefixMemo.chain, the memo as after turn T-1 (restored before every repeat)
    tokenize (prev) SegmentTokenizer.encode_after from turn T-1's prompt, the cache as after turn T-1 (restored
                    before every repeat): the path of a re-sent chat (RecentPrompts) and of previous_response_id
    hash (prev)     PromptHasher.hash_prompt_after_sync from turn T-1's blob (previous_response_id's path)
    encode ADD      codec.encode_add of the EngineCoreRequest with its block hashes
    thread hop      one anyio.to_thread.run_sync round trip of a no-op, on an idle event loop

    python benchmarks/turn_profile.py [--turns 50] [--turn-tokens 2000] [--repeats 30] [--tokenizer DIR] [--src DIR]

``--src DIR`` profiles another source tree (e.g. ``git archive HEAD | tar -x -C DIR``) for before/after figures.

``--tokenizer`` defaults to the bundled Qwen3 tokenizer (the same template and vocabulary as peers.py's tiny model).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _import_project(src: str | None) -> None:
    """Import the project from `src` (another source tree, e.g. a `git archive` snapshot) or from this one."""
    root = str(Path(src).resolve()) if src else str(Path(__file__).resolve().parent.parent)
    sys.path.insert(0, root)
    global body, english_messages, codec, DEFAULT_WORD_IDS, EngineCoreRequest, HashConfig, PrefixMemo, pack_header
    global decode_chat_request, message_dicts, ensure_qwen3_tokenizer, build_sampling_params, Tokenizer
    from benchmarks.loadgen import body, english_messages
    from pyfront.engine_client import codec
    from pyfront.engine_client.mock_engine import DEFAULT_WORD_IDS
    from pyfront.engine_client.protocol import EngineCoreRequest
    from pyfront.hashing import HashConfig
    from pyfront.hashing.memo import PrefixMemo
    from pyfront.hashing.wire import pack_header

    try:  # the layout since the architecture issue
        from pyfront.server.chat.render import message_dicts
        from pyfront.server.generate.sampling import build_sampling_params
        from pyfront.server.openai.decode import decode_chat_request
        from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer
        from pyfront.server.text.tokenizer import Tokenizer
    except ImportError:  # an older tree (--src): one module per step
        from pyfront.server.bundled_tokenizer import ensure_qwen3_tokenizer  # type: ignore[no-redef]
        from pyfront.server.openai_types import decode_chat_request  # type: ignore[no-redef]
        from pyfront.server.sampling import build_sampling_params  # type: ignore[no-redef]
        from pyfront.server.serving import _message_dicts as message_dicts  # type: ignore[no-redef]
        from pyfront.server.tokenizer import Tokenizer  # type: ignore[no-redef]

    where = sys.modules[Tokenizer.__module__].__file__
    if not Path(where).resolve().is_relative_to(root):
        raise SystemExit(f"imported the project from {where}, not {root}")


def _checked_chain(memo: Any) -> Callable[[list[int]], bytes]:
    """memo.chain with checked=True as the engine client calls it (trees without the flag: plain chain)."""
    if "checked" in inspect.signature(memo.chain).parameters:
        return lambda ids: memo.chain(ids, checked=True)
    return memo.chain


def snapshot(memo: Any) -> tuple[Any, ...]:
    recent = getattr(memo, "_recent", None)  # absent before the recent-prompt fast path
    return (
        OrderedDict(memo._entries),
        dict(memo._index),
        deque(memo._recent_ends, maxlen=memo._recent_ends.maxlen),
        None if recent is None else deque(recent, maxlen=recent.maxlen),
    )


def snapshot_segments(tok: Any) -> tuple[Any, ...]:
    seg = tok.segments
    return OrderedDict(seg._cache), dict(seg._counters), dict(getattr(seg, "_words", {}))


def restore_segments(tok: Any, state: tuple[Any, ...]) -> None:
    seg = tok.segments
    with seg._lock:
        seg._cache = OrderedDict(state[0])
        seg._counters = dict(state[1])
        seg._words = dict(state[2])  # the word cache of the per-pre-token path too (absent in older trees)


def restore(memo: Any, state: tuple[Any, ...]) -> None:
    entries, index, ends, recent = state
    memo._entries = OrderedDict(entries)
    memo._index = dict(index)
    memo._recent_ends = deque(ends, maxlen=ends.maxlen)
    if recent is not None:
        memo._recent = deque(recent, maxlen=recent.maxlen)


def reply_text(tok: Any, turn: int, words: int = 8) -> str:
    """What the mock engine answers with max_tokens 8: whole-word tokens."""
    ids = [DEFAULT_WORD_IDS[(turn * 7919 + j * 31) % len(DEFAULT_WORD_IDS)] for j in range(words)]
    return tok.decode(ids)


def thread_hop(repeats: int) -> list[float]:
    import anyio
    import anyio.to_thread

    out: list[float] = []

    async def main() -> None:
        await anyio.to_thread.run_sync(lambda: None)
        for _ in range(repeats):
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: None)
            out.append(time.perf_counter() - t0)

    anyio.run(main)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--turn-tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the bundled Qwen3 one)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="print the medians as one JSON line too")
    p.add_argument("--src", default=None, help="import pyfront from this source tree (default: this one)")
    a = p.parse_args(argv)
    _import_project(a.src)

    tok_dir = Path(a.tokenizer) if a.tokenizer else ensure_qwen3_tokenizer()
    tok = Tokenizer(str(tok_dir))
    texts = english_messages(str(tok_dir / "tokenizer.json"), a.turns, a.turn_tokens)
    memo = PrefixMemo(HashConfig.default(a.block_size))
    chain_of = _checked_chain(memo)
    header = pack_header(a.block_size)

    history: list[dict[str, str]] = []
    stages: dict[str, Callable[[], Any]] = {}
    continued = hasattr(tok.segments, "encode_after")  # previous_response_id's path (absent in older trees)
    previous_tokens: Any = None
    previous_blob = b""
    results: dict[str, Any] = {}
    state = seg_state = None
    for k in range(1, a.turns + 1):
        history.append({"role": "user", "content": texts[k - 1]})
        raw = body("pyfront/qwen3-tokenizer", history, 8, False)
        if k == a.turns:
            state = snapshot(memo)
            seg_state = snapshot_segments(tok)
        request = decode_chat_request(raw)
        messages = message_dicts(request)
        text = tok.render_chat(messages)
        ids = tok.segments.encode(text)
        chain = chain_of(ids)
        history.append({"role": "assistant", "content": reply_text(tok, k)})
        if k == a.turns - 1 and continued:
            previous_tokens, previous_blob = tok.segments.encode_prompt(text), header + chain
        if k < a.turns:
            continue
        assert ids == tok.hf.encode(text, add_special_tokens=False), "segmented ids differ from encode()"

        def sampling(request: Any = request, n: int = len(ids)) -> Any:
            return build_sampling_params(
                request,
                prompt_len=n,
                max_model_len=131072,
                eos_token_id=tok.eos_token_id,
                extra_eos_token_ids=tok.extra_eos_token_ids,
                vocab_size=tok.vocab_size,
                generation_defaults=tok.generation_defaults,
                streaming=False,
                tokenize=lambda t: tok.encode(t, add_special_tokens=False),
            )

        params = sampling()
        engine_request = EngineCoreRequest(
            "chatcmpl-x", ids, None, params, None, time.time(), None, None, None, priority=0, external_req_id="x"
        )
        engine_request.prompt_block_hashes = header + chain
        stages = {
            "decode body": lambda raw=raw: decode_chat_request(raw),
            "message dicts": lambda request=request: message_dicts(request),
            "render": lambda messages=messages: tok.render_chat(messages),
            "tokenize": lambda text=text: tok.segments.encode(text),
            "tokenize (hits)": lambda text=text: tok.segments.encode(text),
            "sampling": sampling,
            "hash": lambda ids=ids: chain_of(ids),
            "encode ADD": lambda r=engine_request: codec.encode_add(r, block_hashes=True),
        }
        if previous_tokens is not None:
            from pyfront.hashing import PromptHasher

            hasher = PromptHasher(HashConfig.default(a.block_size))
            after = tok.segments.encode_after(text, previous_tokens)
            assert after.ids == ids, "encode_after differs from encode()"
            assert hasher.hash_prompt_after_sync(ids, previous_blob, after.shared) == header + chain
            stages["tokenize (prev)"] = lambda text=text, prev=previous_tokens: tok.segments.encode_after(text, prev)
            stages["hash (prev)"] = lambda h=hasher, i=ids, b=previous_blob, n=after.shared: h.hash_prompt_after_sync(
                i, b, n
            )
        results = {"body_bytes": len(raw), "prompt_chars": len(text), "prompt_tokens": len(ids)}

    assert state is not None
    times: dict[str, list[float]] = {name: [] for name in stages}
    gc.collect()
    for _ in range(a.repeats):
        for name, fn in stages.items():
            if name == "hash":
                restore(memo, state)
            elif name in ("tokenize", "tokenize (prev)"):
                restore_segments(tok, seg_state)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    times["thread hop"] = thread_hop(a.repeats * 5)

    print(
        f"turn {a.turns}: body {results['body_bytes'] / 1024:.0f} KiB, prompt {results['prompt_chars']:,} chars, "
        f"{results['prompt_tokens']:,} tokens; medians of {a.repeats} repeats"
    )
    print(f"{'stage':<16}{'median ms':>10}{'min ms':>10}")
    medians = {}
    for name, values in times.items():
        medians[name] = statistics.median(values) * 1e3
        print(f"{name:<16}{medians[name]:>10.3f}{min(values) * 1e3:>10.3f}")
    alternatives = ("thread hop", "tokenize (hits)", "tokenize (prev)", "hash (prev)")
    total = sum(v for k, v in medians.items() if k not in alternatives)
    print(f"{'sum (no hops)':<16}{total:>10.3f}   (without 'tokenize (hits)' and the (prev) rows)")
    if "hash (prev)" in medians:
        prev = total - medians["tokenize"] - medians["hash"] - medians["decode body"]
        prev += medians["tokenize (prev)"] + medians["hash (prev)"]
        print(f"{'sum (prev)':<16}{prev:>10.3f}   (after a kept prompt: the (prev) rows, the body's decode left out)")
    if a.json:
        print(json.dumps({**results, "medians_ms": medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
