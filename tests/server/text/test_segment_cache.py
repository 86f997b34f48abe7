"""Tests for segment-memoized tokenization (server/segment_cache.py).

The property everywhere: ``SegmentTokenizer.encode(text) == tokenizer.encode(text, add_special_tokens=False)`` for
every turn of randomized conversations (appends, edits in the middle, tool calls and results, thinking on and off,
unicode, long messages), for the bundled Qwen3 tokenizer and for SentencePiece-style tokenizers trained offline
(tests/tokenizers_offline.py), including one the cache must refuse (and then still be exact).
"""

from __future__ import annotations

import json
import os
import random
import threading
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront.server.text.segment_cache import SegmentTokenizer
from tests.tokenizers_offline import STYLES, build_backend, build_tokenizer, render_chat

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@cache
def qwen() -> Any:
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer

    return AutoTokenizer.from_pretrained(ensure_qwen3_tokenizer(), local_files_only=True)


@cache
def qwen_segments() -> SegmentTokenizer:
    return SegmentTokenizer(qwen())


@cache
def family(style: str) -> Any:
    return build_tokenizer(style)


@cache
def family_segments(style: str, handle_prepend_first: bool = True) -> SegmentTokenizer:
    return SegmentTokenizer(family(style), handle_prepend_first=handle_prepend_first)


def reference(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# --------------------------------------------------------------------------- conversation strategies

QWEN_MARKERS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
QWEN_MARKERS += ["<tool_response>", "</tool_response>", "<|im_", "im_end|>", "<|", "|>", "<think", "/think>"]
SP_MARKERS = ["<s>", "</s>", "[INST]", "[/INST]", "<tool>", "<tool>>", "[TOOL_CALLS]", "<|user|>", "<|end|>"]
SP_MARKERS += ["<|system|>", "<|assistant|>", "<unk>", "<0x41>", "▁", "▁▁", "[INST", "</s", "<|end"]

CHARS = list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 ,.;:!?'\"()[]{}<>|/\\_-+=*#@$%&~`")
CHARS += ["  ", "\n", "\n\n", "\t", "\r\n", "\r", "\u3000", "\xa0", "\u2003", "\u200b", "\x1c", "\x85", "\ufeff"]
CHARS += ["日", "本", "語", "中", "文", "한", "\u1100", "\u1161", "é", "e\u0301", "\u0301", "A\u030a", "ﬁ", "①"]
CHARS += ["😀", "👩\u200d💻", "🇫🇷", "İ", "ß", "Σ", "ǅ", "\u0627", "\u0915\u094d"]
PHRASES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, we've checked.",
    'def f(x):\n    return {"x": x}\n',
    "    indented\n\tcode\n",
    "Answer: 42 (3.14159, 1e10, 0xFF).",
    "你好，世界！今天天气很好。",  # noqa: RUF001
    "日本語のテキスト、ひらがな、カタカナ。",
    "Café naïve résumé Ångström",
    "Emoji 🙂🙃👍🏽 👨‍👩‍👧‍👦 ✓",
]


def _split_words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


WORDS = _split_words(
    "the model reads every message again each turn so the server should not tokenize the same history "
    "twice when only a few new tokens were appended at the end of a very long conversation with tools "
    "and reasoning"
)


def long_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(words // 12):
        line = " ".join(rng.choice(WORDS) for _ in range(12))
        lines.append(line.capitalize() + rng.choice([".", "!", "?", ":\n-", ".\n\n", ","]))
    return " ".join(lines)


def contents(markers: list[str]) -> st.SearchStrategy[str]:
    chunk = st.one_of(
        st.lists(st.sampled_from(CHARS), max_size=24).map("".join),
        st.sampled_from(PHRASES),
        st.sampled_from(markers),
        st.sampled_from(["", " ", "\n", "\n\n", "  \n ", "\t"]),
    )
    short = st.lists(chunk, max_size=8).map("".join)
    # Long messages: 600-3000 words (roughly 700-3500 tokens), rare.
    long = st.tuples(st.integers(0, 2**32), st.integers(600, 3000)).map(lambda a: long_text(*a))
    return st.one_of(short, short, short, short, short, short, short, long)


def operations(markers: list[str]) -> st.SearchStrategy[list[tuple]]:
    text = contents(markers)
    op = st.one_of(
        st.tuples(st.just("user"), text),
        st.tuples(st.just("assistant"), text, st.one_of(st.none(), text), st.booleans()),
        st.tuples(st.just("tool"), text),
        st.tuples(st.just("edit"), st.integers(0, 10**6), text),
        st.tuples(st.just("think"), st.booleans()),
    )
    return st.lists(op, min_size=1, max_size=10)


def apply(messages: list[dict[str, Any]], op: tuple) -> None:
    kind = op[0]
    if kind == "user":
        messages.append({"role": "user", "content": op[1]})
    elif kind == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": op[1]}
        if op[2] is not None:
            message["reasoning_content"] = op[2]
        if op[3]:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": "lookup", "arguments": {"query": op[1][:40], "n": 3}}}
            ]
        messages.append(message)
    elif kind == "tool":
        messages.append({"role": "tool", "content": op[1]})
    elif kind == "edit" and messages:
        messages[op[1] % len(messages)]["content"] = op[2]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Search the knowledge base. Returns up to n results, newest first.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]


def run_conversation(
    segments: SegmentTokenizer, tok: Any, render, ops: list[tuple], first: str, system: str | None
) -> int:
    """Apply ``ops`` turn by turn; after each, memoized ids must equal a full tokenization, and so must the ids
    ``encode_after`` gets from the previous turn's prompt (edits in the middle included). Returns the turns."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": first})
    thinking = True
    turns = 0
    previous = None
    for op in [("noop",), *ops]:
        if op[0] == "think":
            thinking = op[1]
        else:
            apply(messages, op)
        text = render(messages, thinking)
        expected = reference(tok, text)
        assert segments.encode(text) == expected, (op, text)
        assert segments.encode(text) == expected  # all from the cache now
        tokens = segments.encode_prompt(text) if previous is None else segments.encode_after(text, previous)
        assert tokens.ids == expected and tokens.text == text, (op, text)
        previous = tokens
        turns += 1
    return turns


# --------------------------------------------------------------------------- Qwen3


def test_qwen_is_supported() -> None:
    seg = qwen_segments()
    assert seg.supported, seg.reason
    assert seg.reason is None
    assert SegmentTokenizer.check(qwen(), samples=100) is None


@PROPERTY
@given(
    ops=operations(QWEN_MARKERS),
    first=contents(QWEN_MARKERS),
    system=st.one_of(st.none(), contents(QWEN_MARKERS)),
    tools=st.booleans(),
)
def test_qwen_conversations_match_full_encode(ops, first, system, tools) -> None:
    tok = qwen()

    def render(messages, thinking):
        gen = messages[-1]["role"] != "assistant"
        return tok.apply_chat_template(
            messages,
            tools=TOOLS if tools else None,
            tokenize=False,
            add_generation_prompt=gen,
            enable_thinking=thinking,
        )

    run_conversation(qwen_segments(), tok, render, ops, first, system)


@PROPERTY
@given(text=st.lists(st.one_of(st.text(max_size=20), st.sampled_from(QWEN_MARKERS + CHARS)), max_size=20))
def test_qwen_arbitrary_strings(text) -> None:
    text = "".join(text)
    assert qwen_segments().encode(text) == reference(qwen(), text)


def _continued(style_markers: list[str]) -> st.SearchStrategy[tuple[str, int, str]]:
    """An earlier prompt, how much of it the later one keeps, and what the later one has after that."""
    text = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(style_markers + CHARS)), max_size=16).map("".join)
    return st.tuples(text, st.integers(0, 400), text)


def check_continued(seg: SegmentTokenizer, tok: Any, before: str, keep: int, after: str) -> None:
    """encode_after on a prompt that keeps ``before[:keep]``, cut anywhere (inside an added token included)."""
    text = before[:keep] + after
    previous = seg.encode_prompt(before)
    assert previous.ids == reference(tok, before)
    tokens = seg.encode_after(text, previous)
    assert tokens.ids == reference(tok, text), (before, keep, after)
    assert tokens.ids[: tokens.shared] == previous.ids[: tokens.shared]
    again = seg.encode_after(text + before, tokens)  # a chain of continuations keeps its piece starts right
    assert again.ids == reference(tok, text + before)


@PROPERTY
@given(case=_continued(QWEN_MARKERS))
def test_qwen_continued_prompts(case) -> None:
    check_continued(qwen_segments(), qwen(), *case)


def _qwen_chat(n_turns: int, long_words: int = 0, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Successive message lists of a growing chat (one per turn)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    history = []
    for turn in range(n_turns):
        content = long_text(turn, long_words) if (long_words and turn == 0) else f"Question {turn}: {WORDS[turn]}?"
        messages.append({"role": "user", "content": content})
        history.append([dict(m) for m in messages])
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + long_text(100 * seed + turn, 60)})
    return history


def _render_qwen(messages: list[dict[str, Any]]) -> str:
    return qwen().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_append_only_reencodes_the_new_message() -> None:
    tok = qwen()
    seg = SegmentTokenizer(tok, self_check=False)
    turns = _qwen_chat(4, long_words=4000)  # the first user message is one ~5k-token segment
    texts = [_render_qwen(m) for m in turns]
    assert seg.encode(texts[0]) == reference(tok, texts[0])
    first = seg.stats
    assert first.tokens_encoded > 4000
    for text in texts[1:]:
        before = seg.stats
        assert seg.encode(text) == reference(tok, text)
        after = seg.stats
        # Only the previous answer and the new question are new: far fewer tokens than the long message.
        assert 0 < after.tokens_encoded - before.tokens_encoded < 200
        assert after.tokens_from_cache - before.tokens_from_cache > 4000
    stats = seg.stats
    assert stats.requests == 4 and stats.fallback_requests == 0
    assert stats.segment_hits > 0 and 0 < stats.segment_hit_rate < 1 and stats.token_hit_rate > 0.7
    assert stats.as_dict()["segment_hits"] == stats.segment_hits


def test_edit_in_the_middle_misses_only_that_segment() -> None:
    tok = qwen()
    seg = SegmentTokenizer(tok, self_check=False)
    messages = _qwen_chat(5)[-1]
    text = _render_qwen(messages)
    assert seg.encode(text) == reference(tok, text)
    edited = [dict(m) for m in messages]
    edited[3]["content"] = "An edited question in the middle, with ünïcödé and 日本語?"
    text2 = _render_qwen(edited)
    before = seg.stats
    assert seg.encode(text2) == reference(tok, text2)
    after = seg.stats
    assert after.segments - before.segments - (after.segment_hits - before.segment_hits) == 1
    assert after.tokens_encoded - before.tokens_encoded == len(reference(tok, "user\n" + edited[3]["content"]))


def test_bounds_evict_and_stay_exact() -> None:
    tok = qwen()
    seg = SegmentTokenizer(tok, self_check=False, max_cached_tokens=300, max_entries=6)
    texts = [_render_qwen(m) for m in _qwen_chat(8)]
    for round_ in range(2):
        for text in texts if round_ == 0 else reversed(texts):
            assert seg.encode(text) == reference(tok, text)
            stats = seg.stats
            assert stats.cached_tokens <= 300 and stats.cached_entries <= 6
    assert seg.stats.evictions > 0
    # A segment larger than the whole budget is encoded but never cached.
    big = "<|im_start|>user\n" + long_text(7, 600) + "<|im_end|>\n"
    assert seg.encode(big) == reference(tok, big)
    assert seg.stats.cached_tokens <= 300
    chars = SegmentTokenizer(tok, self_check=False, max_cached_chars=100)
    assert chars.encode(texts[-1]) == reference(tok, texts[-1])
    assert 0 < chars.stats.cached_chars <= 100
    seg.clear()
    assert seg.stats.cached_entries == seg.stats.cached_tokens == 0
    with pytest.raises(ValueError):
        SegmentTokenizer(tok, self_check=False, max_cached_tokens=-1)


def test_threads_share_one_cache() -> None:
    tok = qwen()
    seg = SegmentTokenizer(tok, self_check=False, max_cached_tokens=1500)  # small: evictions race with lookups
    texts = []
    for chat in range(8):
        rng = random.Random(chat)
        for messages in _qwen_chat(6, seed=chat):
            for message in messages[1:]:
                if rng.random() < 0.2:
                    message["content"] += f" (thread {chat}) 🙂"
            texts.append(_render_qwen(messages))
    expected = {text: reference(tok, text) for text in texts}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        try:
            rng = random.Random(index)
            barrier.wait()
            for _ in range(120):
                text = rng.choice(texts)
                assert seg.encode(text) == expected[text]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    stats = seg.stats
    assert stats.requests == 8 * 120
    assert stats.cached_tokens <= 1500 and stats.evictions > 0 and stats.segment_hits > 0


def test_edge_inputs() -> None:
    tok, seg = qwen(), qwen_segments()
    for text in ["", "<|im_end|>", "<|im_end|><|im_end|>", "plain text, no added tokens", " \n ", "<|im_start|"]:
        assert seg.encode(text) == reference(tok, text)
        assert seg(text) == reference(tok, text)


# --------------------------------------------------------------------------- other tokenizer families


@pytest.mark.parametrize("style", STYLES)
def test_family_is_supported(style: str) -> None:
    seg = family_segments(style)
    assert seg.supported, seg.reason


def _family_render(style: str):
    def render(messages, thinking):
        return render_chat(style, messages, add_generation_prompt=messages[-1]["role"] != "assistant")

    return render


@pytest.mark.parametrize("style", STYLES)
@PROPERTY
@given(ops=operations(SP_MARKERS), first=contents(SP_MARKERS), system=st.one_of(st.none(), contents(SP_MARKERS)))
def test_family_conversations_match_full_encode(style, ops, first, system) -> None:
    run_conversation(family_segments(style), family(style), _family_render(style), ops, first, system)


@pytest.mark.parametrize("style", STYLES)
@PROPERTY
@given(text=st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SP_MARKERS + CHARS)), max_size=20))
def test_family_arbitrary_strings(style, text) -> None:
    text = "".join(text)
    assert family_segments(style).encode(text) == reference(family(style), text)


@pytest.mark.parametrize("style", STYLES)
@PROPERTY
@given(case=_continued(SP_MARKERS))
def test_family_continued_prompts(style, case) -> None:
    """lstrip/rstrip tokens (phi3) and Metaspace's first-piece prefix (mistral, llama2) included."""
    check_continued(family_segments(style), family(style), *case)


def test_continued_prompts_at_the_edges() -> None:
    """A cut right after an added token, inside one, in a whitespace run an rstrip token swallows, at the end."""
    tok, seg = family("phi3"), family_segments("phi3")
    cases = [
        ("<|user|> hi<|end|>\n", 20, "<|assistant|> ok"),
        ("<|user|> hi<|end|>", 13, "|>x"),  # the later text ends the token differently
        ("<|end|>   x", 9, "  <|end|>"),  # inside the whitespace after an rstrip token
        ("a <|end|>", 2, "<|end|> b"),
        ("<|end|>", 7, ""),
        ("", 0, "<|end|>z"),
    ]
    for before, keep, after in cases:
        check_continued(seg, tok, before, keep, after)
    qwen_cases = [
        ("<|im_start|>user\nhi<|im_end|>\n", 40, "<|im_start|>assistant\n"),
        ("x<|im_end|>", 6, "end|>"),  # the later prompt spells <|im_end|> across the cut
        ("<|object_ref_start|>", 10, "ref_end|>"),
        ("ab<tool_call>", 6, "_response>"),
    ]
    for before, keep, after in qwen_cases:
        check_continued(qwen_segments(), qwen(), before, keep, after)


def test_metaspace_first_needs_the_never_variant() -> None:
    """Metaspace(prepend_scheme="first") is not segment-local: without the special handling the check refuses it."""
    seg = family_segments("mistral", handle_prepend_first=False)
    assert not seg.supported
    assert seg.reason is not None and seg.reason.startswith("self-check mismatch")
    # Non-first pieces really do differ when encoded alone (the reason for the fallback) ...
    tok = family("mistral")
    assert reference(tok, "[INST]hello") != reference(tok, "[INST]") + reference(tok, "hello")
    # ... and the supported instance handles it by encoding such pieces with prepend_scheme="never".
    assert family_segments("mistral").encode("[INST]hello") == reference(tok, "[INST]hello")


@PROPERTY
@given(ops=operations(SP_MARKERS), first=contents(SP_MARKERS))
def test_fallback_is_still_exact(ops, first) -> None:
    seg = family_segments("mistral", handle_prepend_first=False)
    before = seg.stats.fallback_requests
    turns = run_conversation(seg, family("mistral"), _family_render("mistral"), ops, first, None)
    assert seg.stats.fallback_requests - before == 3 * turns


def test_static_fallbacks_are_exact() -> None:
    samples = ["<s>[INST] a <mask> b [/INST]", "x<mask>y", " <mask> ", "<mask>", "hello <tool>world</tool>"]
    tok = build_tokenizer("single_word")
    seg = SegmentTokenizer(tok)
    assert not seg.supported and "single_word" in seg.reason
    assert SegmentTokenizer.check(tok) == seg.reason
    for text in samples:
        assert seg.encode(text) == reference(tok, text)
    assert seg.stats.fallback_requests == len(samples)

    tok = build_tokenizer("llama2")
    tok.split_special_tokens = True
    seg = SegmentTokenizer(tok)
    assert not seg.supported and "split_special_tokens" in seg.reason
    for text in samples:
        assert seg.encode(text) == reference(tok, text)


def test_static_inspection_refuses_unknown_features() -> None:
    from tokenizers import Tokenizer
    from tokenizers.pre_tokenizers import PreTokenizer

    config = json.loads(build_backend("llama2").to_str())
    config["model"]["dropout"] = 0.1
    seg = SegmentTokenizer(Tokenizer.from_str(json.dumps(config)), log=False)
    assert not seg.supported and "dropout" in seg.reason

    class Passthrough:  # a custom Python pre-tokenizer: cannot be serialized, so cannot be inspected
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, piece: [piece])

    custom_backend = build_backend("llama2")
    custom_backend.pre_tokenizer = PreTokenizer.custom(Passthrough())
    seg = SegmentTokenizer(custom_backend, log=False)
    assert not seg.supported and "serialized" in seg.reason
    assert seg.encode("<s>Hi there") == custom_backend.encode("<s>Hi there", add_special_tokens=False).ids

    class Custom(type(family("llama2"))):
        def encode(self, text, *args, **kwargs):  # a wrapper doing its own thing
            return super().encode(text, *args, **kwargs)

    custom = Custom(tokenizer_object=build_backend("llama2"))
    seg = SegmentTokenizer(custom, log=False)
    assert not seg.supported and "overrides encode" in seg.reason
    assert seg.encode("<s>hi") == custom.encode("<s>hi", add_special_tokens=False)


def test_whitespace_around_strip_tokens() -> None:
    """lstrip/rstrip swallow Rust's White_Space (U+0085, U+3000 ...), not what Python alone calls space (U+001C)."""
    tok, seg = family("phi3"), family_segments("phi3")
    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace() or chr(c) in "\u200b\ufeff\u180e\u2060"]
    for space in spaces:
        for text in (f"<|end|>{space}x", f"x{space}<|system|>", f"<|end|>{space}<|system|>{space}", f"{space}<|user|>"):
            assert seg.encode(text) == reference(tok, text), repr(text)


def test_bare_tokenizers_backend() -> None:
    backend = build_backend("phi3")
    seg = SegmentTokenizer(backend)
    assert seg.supported, seg.reason
    text = render_chat("phi3", [{"role": "system", "content": "  sys  "}, {"role": "user", "content": " hi\t"}])
    assert seg.encode(text) == backend.encode(text, add_special_tokens=False).ids


@cache
def qwen_shared_segments() -> SegmentTokenizer:
    return SegmentTokenizer(qwen(), share_backend=True)


@PROPERTY
@given(text=st.lists(st.one_of(st.text(max_size=20), st.sampled_from(QWEN_MARKERS + CHARS)), max_size=20))
def test_shared_backend_is_exact_too(text) -> None:
    """The server shares transformers' backend instead of copying it (~120 MB): same results."""
    seg = qwen_shared_segments()
    assert seg.supported and seg._first_backend is qwen().backend_tokenizer
    text = "".join(text)
    assert seg.encode(text) == reference(qwen(), text)
    for history in _qwen_chat(4, seed=3):
        rendered = _render_qwen(history)
        assert seg.encode(rendered) == reference(qwen(), rendered)
