"""The per-turn fast paths of a long chat are exact.

* ``PrefixMemo.chain(..., checked=True)``: extends a recent prompt without serializing the shared prefix; the hashes
  always equal the plain recipe.
* ``SegmentTokenizer``'s per-pre-token path for ASCII misses (byte-level BPE with a GPT-4-style regex): equals the
  tokenizer's own ``encode``, for the Qwen2 regex and the Llama 3 one (``\\p{N}{1,3}``).
* ``Tokenizer.render_chat``'s fast render: equals ``apply_chat_template`` for every chat shape the server sends, and
  falls back to it for everything else.
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront.hashing import PrefixMemo, PromptHasher
from pyfront.server.text.segment_cache import _ASCII_PRE_TOKENIZERS, SegmentTokenizer, _SplitToken
from tests.hashing.test_hashing import config, reference_block_hashes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# ---------------------------------------------------------------- memo: the checked (recent prompt) path


def _chat_turns(rng: random.Random, turns: int) -> list[tuple[list[int], str | None]]:
    """Mostly growing chats (several interleaved), with retries, truncations, edits and salt switches."""
    chats: list[list[int]] = [[rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 2000))] for _ in range(3)]
    out = []
    for _ in range(turns):
        i = rng.randrange(len(chats))
        base = chats[i]
        action = rng.random()
        if action < 0.6:
            tokens = base + [rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 1500))]
        elif action < 0.7:
            tokens = list(base)  # a retry
        elif action < 0.8:
            tokens = base[: rng.randrange(0, len(base) + 1)]
        elif action < 0.9 and base:
            cut = rng.randrange(len(base))
            tokens = [*base[:cut], rng.randrange(0, 151_000), *base[cut + 1 :]]
        else:
            tokens = [rng.randrange(0, 151_000) for _ in range(rng.randrange(0, 3000))]
        chats[i] = tokens
        out.append((tokens, rng.choice([None, None, None, "", "tenant-a"])))
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_checked_memo_equals_plain(seed, block_size) -> None:
    rng = random.Random(seed * 7919 + block_size)
    cfg = config(block_size)
    memo = PrefixMemo(
        cfg,
        checkpoint_tokens=rng.choice([64, 256, 1024]),
        max_entries=rng.choice([2, 8, 1024]),
        recent_prompts=rng.choice([1, 2, 4]),
        direct_max_blocks=0,
    )
    for tokens, salt in _chat_turns(rng, 40 if block_size > 1 else 10):
        checked = rng.random() < 0.8
        expected = reference_block_hashes(tokens, block_size, cfg.none_hash, salt)
        assert memo.block_hashes(tokens, salt, checked=checked) == expected
    stats = memo.stats
    assert stats.recent_hits > 0 or block_size == 1  # (few turns at block size 1: the reference is slow)
    assert stats.entries <= memo.max_entries


def test_checked_memo_growing_chat_serializes_only_the_new_turn() -> None:
    cfg = config(16)
    memo = PrefixMemo(cfg, direct_max_blocks=0)
    rng = random.Random(5)
    tokens: list[int] = []
    for turn in range(6):
        tokens = tokens + [rng.randrange(0, 151_000) for _ in range(2000 + turn)]
        before = memo.stats
        assert memo.block_hashes(tokens, checked=True) == reference_block_hashes(tokens, 16, cfg.none_hash)
        after = memo.stats
        if turn:
            assert after.recent_hits == before.recent_hits + 1
            # Only the blocks after the previous prompt's full-block end are hashed.
            previous_full = (len(tokens) - 2000 - turn) // 16 * 16
            assert after.blocks_hashed - before.blocks_hashed == len(tokens) // 16 - previous_full // 16
    # The keys it leaves behind are the fingerprint path's: an unchecked call finds the same prefix.
    extended = tokens + [1, 2, 3] * 40
    before = memo.stats
    assert memo.block_hashes(extended) == reference_block_hashes(extended, 16, cfg.none_hash)
    assert memo.stats.recent_hits == before.recent_hits
    assert memo.stats.blocks_hashed - before.blocks_hashed == len(extended) // 16 - len(tokens) // 16


def test_checked_memo_takes_the_deepest_known_prefix() -> None:
    cfg = config(16)
    memo = PrefixMemo(cfg, checkpoint_tokens=64, direct_max_blocks=0)
    rng = random.Random(9)
    short = [rng.randrange(0, 151_000) for _ in range(1000)]
    long = short + [rng.randrange(0, 151_000) for _ in range(3000)]
    memo.block_hashes(long, checked=True)
    memo.block_hashes(short, checked=True)  # the newest recent prompt is now the short one
    before = memo.stats.blocks_hashed
    assert memo.block_hashes(long, checked=True) == reference_block_hashes(long, 16, cfg.none_hash)
    assert memo.stats.blocks_hashed == before  # long's own end key, not short's end + 3000 tokens


def test_checked_memo_equal_values_other_objects_and_no_recent() -> None:
    cfg = config(8)
    rng = random.Random(2)
    base = [rng.randrange(1000, 151_000) for _ in range(500)]
    for recent in (0, 4):
        memo = PrefixMemo(cfg, recent_prompts=recent, direct_max_blocks=0)
        memo.block_hashes(base, checked=True)
        # Equal ids that are other int objects (as a JSON decoder makes them) compare equal and hash the same.
        copy = [int(str(t)) for t in base] + [7, 8, 9] * 10
        assert memo.block_hashes(copy, checked=True) == reference_block_hashes(copy, 8, cfg.none_hash)
        assert memo.stats.recent_hits == (1 if recent else 0)
        # Tuples and other salts never take the recent path.
        assert memo.block_hashes(tuple(copy), checked=True) == reference_block_hashes(copy, 8, cfg.none_hash)
        assert memo.block_hashes(copy, "s", checked=True) == reference_block_hashes(copy, 8, cfg.none_hash, "s")
    with pytest.raises(ValueError):
        PrefixMemo(cfg, recent_prompts=-1, direct_max_blocks=0)


def test_unchecked_bools_never_reuse_a_recent_prompt() -> None:
    cfg = config(4)
    memo = PrefixMemo(cfg, direct_max_blocks=0)
    ids = [1, 0, 1, 1, 5, 6, 7, 8]
    memo.block_hashes(ids, checked=True)
    bools = [True, False, True, True, 5, 6, 7, 8, 9, 10, 11, 12]  # == ids on the prefix, different pickles
    assert memo.block_hashes(bools) == reference_block_hashes(bools, 4, cfg.none_hash)
    assert memo.stats.recent_hits == 0


def test_checked_memo_from_threads() -> None:
    cfg = config(16)
    memo = PrefixMemo(cfg, checkpoint_tokens=128, max_entries=8, recent_prompts=3, direct_max_blocks=0)
    rng = random.Random(4)
    base = [rng.randrange(0, 151_000) for _ in range(3000)]
    prompts = [base[: rng.randrange(0, 3000)] + [rng.randrange(0, 151_000) for _ in range(300)] for _ in range(24)]
    expected = [reference_block_hashes(p, 16, cfg.none_hash) for p in prompts]
    failures: list[int] = []
    barrier = threading.Barrier(6)

    def worker(offset: int) -> None:
        barrier.wait()
        for round_ in range(3):
            for i in range(len(prompts)):
                j = (i * 5 + offset + round_) % len(prompts)
                if memo.block_hashes(prompts[j], checked=True) != expected[j]:
                    failures.append(j)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_prompt_hasher_passes_checked() -> None:
    import anyio

    cfg = config(16)
    hasher = PromptHasher(cfg)
    tokens = list(range(5000))
    longer = [*tokens, *range(300)]

    async def main() -> bytes | None:
        await hasher.hash_prompt(tokens, checked=True)
        return await hasher.hash_prompt(longer, checked=True)

    blob = anyio.run(main)
    assert hasher.memo.stats.recent_hits == 1
    assert blob is not None and blob[8:] == b"".join(reference_block_hashes(longer, 16, cfg.none_hash))


# ---------------------------------------------------------------- segment cache: the per-pre-token path


@cache
def qwen() -> Any:
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer

    return AutoTokenizer.from_pretrained(ensure_qwen3_tokenizer(), local_files_only=True)


@cache
def qwen_backend_json() -> dict[str, Any]:
    return json.loads(qwen().backend_tokenizer.to_str())


@cache
def variant(kind: str) -> Any:
    """Bare tokenizers built from Qwen's: the Llama 3 regex, or the Qwen one without a normalizer."""
    from tokenizers import Tokenizer

    cfg = json.loads(json.dumps(qwen_backend_json()))
    if kind == "llama3":
        split = cfg["pre_tokenizer"]["pretokenizers"][0]
        split["pattern"]["Regex"] = split["pattern"]["Regex"].replace(r"\p{N}|", r"\p{N}{1,3}|")
        assert split["pattern"]["Regex"] in _ASCII_PRE_TOKENIZERS
    elif kind == "no-normalizer":
        cfg["normalizer"] = None
    return Tokenizer.from_str(json.dumps(cfg))


@cache
def segments(kind: str) -> SegmentTokenizer:
    return SegmentTokenizer(qwen() if kind == "qwen" else variant(kind), log=False)


def reference(kind: str, text: str) -> list[int]:
    if kind == "qwen":
        return qwen().encode(text, add_special_tokens=False)
    return variant(kind).encode(text, add_special_tokens=False).ids


KINDS = ["qwen", "llama3", "no-normalizer"]
ASCII_PIECES = [chr(c) for c in range(128)] + [
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'Re",
    "'ve",
    "'d",
    "'x",
    "''",
    " hello",
    "World",
    "1234567",
    " 42",
    "3.14",
    "  ",
    "   ",
    "\n\n",
    " \n",
    "\r\n",
    "\t\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    " !!",
    "...\n",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "<|",
    "|>",
    "a" * 80,
    " " * 70,
    "-" * 90,
]


@pytest.mark.parametrize("kind", KINDS)
def test_word_path_is_on_and_exact_on_ascii(kind) -> None:
    seg = segments(kind)
    assert seg.supported and seg.word_reason is None
    rng = random.Random(kind)
    for _ in range(300):
        text = "".join(rng.choice(ASCII_PIECES) for _ in range(rng.randint(1, 40)))
        assert seg.encode(text) == reference(kind, text), text
    assert seg.stats.word_path_segments > 0


@PROPERTY
@given(text=st.lists(st.sampled_from(ASCII_PIECES), max_size=60).map("".join), kind=st.sampled_from(KINDS))
def test_word_path_property(text, kind) -> None:
    seg = segments(kind)
    assert seg.encode(text) == reference(kind, text)
    assert seg.encode(text + "<|im_end|>\n" + text[::-1]) == reference(kind, text + "<|im_end|>\n" + text[::-1])


@PROPERTY
@given(text=st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_word_path_property_any_ascii(text) -> None:
    seg = segments("qwen")
    expected = reference("qwen", text)
    assert seg.encode(text) == expected
    assert seg._encode_words(text) in (None, expected) if not seg._pattern.search(text) else True


def test_word_path_long_prose_and_eviction() -> None:
    seg = SegmentTokenizer(qwen(), log=False, max_cached_words=50)
    rng = random.Random(1)
    vocab = ["alpha", "Beta", "gamma's", "delta", "42", "3.5", "(x)", "\n\n", "  ", "end.", "don't"]
    for _ in range(30):
        text = " ".join(rng.choice(vocab) + str(rng.randrange(100)) for _ in range(rng.randrange(1, 400)))
        assert seg.encode(text) == reference("qwen", text)
        assert len(seg._words) <= 50 + 400
    assert seg.stats.words_encoded > 0


def test_word_path_without_separator_encodes_words_one_by_one(monkeypatch) -> None:
    seg = SegmentTokenizer(qwen(), log=False)
    monkeypatch.setattr(seg, "_word_separator", None)
    text = "Hello there, it's 2024 and we've got   spaces\n\nand lines."
    assert seg._encode_words(text) == reference("qwen", text)


def test_separator_choice_avoids_overlapping_tokens() -> None:
    def tokens(*contents: str, strip: bool = False) -> dict[str, _SplitToken]:
        return {c: _SplitToken(i, strip, False) for i, c in enumerate(contents)}

    assert SegmentTokenizer._pick_separator(tokens("<a>", "<b>")) == ("<a>", 0)
    # "<a>" sits inside "x<a>"; "x<a>" ends where "<a>" could start (refused, conservatively); "<b>" is free.
    assert SegmentTokenizer._pick_separator(tokens("<a>", "x<a>", "<b>")) == ("<b>", 2)
    assert SegmentTokenizer._pick_separator(tokens("<a>", "a>z")) is None  # each overlaps the other
    assert SegmentTokenizer._pick_separator(tokens("<a>", strip=True)) is None


def test_word_path_off_where_it_would_not_be_exact() -> None:
    from tokenizers import Tokenizer

    cfg = json.loads(json.dumps(qwen_backend_json()))
    cfg["normalizer"] = {"type": "Lowercase"}
    seg = SegmentTokenizer(Tokenizer.from_str(json.dumps(cfg)), log=False)
    assert seg.word_reason is not None and "normalizer" in seg.word_reason
    cfg = json.loads(json.dumps(qwen_backend_json()))
    cfg["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    seg = SegmentTokenizer(Tokenizer.from_str(json.dumps(cfg)), log=False)
    assert seg.word_reason == "unknown pre-tokenizer regex"
    assert SegmentTokenizer(qwen(), log=False, word_path=False).word_reason == "disabled"


def test_word_path_self_check_catches_a_wrong_transcription(monkeypatch) -> None:
    import pyfront.server.text.segment_cache as segment_cache

    regex = qwen_backend_json()["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    wrong = dict(segment_cache._ASCII_PRE_TOKENIZERS)
    wrong[regex] = wrong[regex].replace("\x0b\x0c", "")  # forget \v and \f in \s
    monkeypatch.setattr(segment_cache, "_ASCII_PRE_TOKENIZERS", wrong)
    seg = SegmentTokenizer(qwen(), log=False)
    assert seg.supported  # the segment cache itself stays on
    assert seg.word_reason is not None and seg._word_pattern is None


# ---------------------------------------------------------------- the fast chat render


@cache
def server_tokenizer() -> Any:
    from pyfront.server.text.tokenizer import Tokenizer

    return Tokenizer("pyfront/qwen3-tokenizer")


def _random_chat(rng: random.Random) -> dict[str, Any]:
    texts = [
        "Hi",
        "",
        "  spaced  ",
        "<think>\nplan\n</think>\n\nanswer",
        "line\nline",
        "<tool_response>r</tool_response>",
    ]
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(texts), "name": rng.choice([None, "sys"])})
    for _ in range(rng.randint(1, 8)):
        role = rng.choice(["user", "user", "assistant", "tool", "system"])
        message: dict[str, Any] = {"role": role, "content": rng.choice([*texts, None])}
        if role == "assistant":
            if rng.random() < 0.4:
                message["reasoning_content"] = rng.choice(["why", None, ""])
            if rng.random() < 0.3:
                message["reasoning"] = "alias"
            if rng.random() < 0.4:
                message["tool_calls"] = [
                    {
                        "id": f"call_{k}",
                        "type": "function",
                        "function": {
                            "name": "f",
                            "arguments": rng.choice([{"a": [1, 2.5, None, True]}, {}, '{"x": 1}']),
                        },
                    }
                    for k in range(rng.randint(1, 2))
                ]
        if role == "tool":
            message["tool_call_id"] = "call_0"
        messages.append(message)
    case: dict[str, Any] = {"messages": messages}
    if rng.random() < 0.3:
        case["tools"] = [
            {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
        ]
    if rng.random() < 0.2:
        case["documents"] = [{"title": "t", "text": "x"}]
    if rng.random() < 0.4:
        case["chat_template_kwargs"] = rng.choice([{"enable_thinking": False}, {"enable_thinking": True}, {"k": [1]}])
    case["add_generation_prompt"] = rng.random() < 0.8
    return case


def _slow(tok: Any, case: dict[str, Any], **overrides: Any) -> str:
    args = {
        "tools": case.get("tools"),
        "documents": case.get("documents"),
        "chat_template": None,
        "add_generation_prompt": case.get("add_generation_prompt", True),
        "continue_final_message": False,
        "tokenize": False,
        **(case.get("chat_template_kwargs") or {}),
        **overrides,
    }
    return tok.hf.apply_chat_template(case["messages"], **args)


def test_fast_render_is_on_and_equals_apply_chat_template() -> None:
    tok = server_tokenizer()
    assert tok._fast_chat is not None and tok.fast_chat_reason is None
    rng = random.Random(11)
    used = 0
    for _ in range(300):
        case = _random_chat(rng)
        kwargs = {
            k: case[k] for k in ("tools", "documents", "chat_template_kwargs", "add_generation_prompt") if k in case
        }
        fast = tok._fast_chat.render(
            case["messages"],
            case.get("tools"),
            case.get("documents"),
            case.get("add_generation_prompt", True),
            False,
            None,
            dict(case.get("chat_template_kwargs") or {}),
        )
        used += fast is not None
        try:
            expected = _slow(tok, case)
        except Exception:
            assert fast is None
            continue
        assert fast in (None, expected)
        assert tok.render_chat(case["messages"], **kwargs) == expected
    assert used > 200


def test_fast_render_passes_the_special_tokens_and_lets_kwargs_override_them() -> None:
    """The special tokens map is made plain once at start-up; a request's template variables still override it
    key by key, as in apply_chat_template (and the shared list stays as it was)."""
    tok = server_tokenizer()
    template = (
        "{{ eos_token }}|{{ pad_token }}|{{ additional_special_tokens | join(',') }}|{{ extra | default('-') }}"
        "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}]
    for kwargs in ({}, {"eos_token": "<override>"}, {"extra": [1, {"a": None}]}, {"additional_special_tokens": []}):
        fast = tok._fast_chat.render(messages, None, None, True, False, template, dict(kwargs))
        assert fast is not None
        assert fast == tok.hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
    assert tok._fast_chat.special_tokens == tok.hf.special_tokens_map


def test_fast_render_falls_back_where_it_does_not_apply() -> None:
    tok = server_tokenizer()
    fast = tok._fast_chat
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    args = (None, None, False, False, None)
    assert fast.render(messages, *args, {}) is not None
    assert fast.render([("user", "Hi")], *args, {}) is None
    assert fast.render([{"role": "user", "content": ("a", "b")}], *args, {}) is None  # a tuple
    assert fast.render([{"role": "user", "content": "x", 1: "y"}], *args, {}) is None  # a non-str key
    assert fast.render(messages, *args, {"tokenize": True}) is None  # a wrapper parameter as template variable
    assert fast.render(messages, *args, {"messages": []}) is None
    # Through render_chat: the same text as apply_chat_template, and its errors as TokenizerError.
    from pyfront.server.text.tokenizer import TokenizerError

    expected = tok.hf.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert tok.render_chat(messages, add_generation_prompt=False, continue_final_message=True) == expected
    with pytest.raises(TokenizerError):
        tok.render_chat(messages, chat_template="{{ raise_exception('no') }}")


def _outcome(render: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    try:
        return "ok", render(*args, **kwargs)
    except Exception as exc:  # the error itself is compared
        return type(exc).__name__, str(exc)


def test_fast_render_takes_continue_final_message_and_the_wrapper_errors_as_transformers() -> None:
    """continue_final_message (the tag and the cut) and the errors apply_chat_template raises before or around the
    render: the same text, or the same exception and words."""
    tok = server_tokenizer()
    fast = tok._fast_chat
    keep_spacing = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    trims = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
    drops = "{% for m in messages %}{{ m.role }}{% endfor %}"
    blocks = "{% for m in messages %}{% for b in m.content %}{{ b.text }}{% endfor %}{% endfor %}"
    user = {"role": "user", "content": "Hi"}
    cases = [
        ([user, {"role": "assistant", "content": "Hel"}], None, True, False),
        ([user, {"role": "assistant", "content": "Hel  "}], trims, True, False),
        ([user, {"role": "assistant", "content": "Hel  "}], keep_spacing, True, False),
        ([user, {"role": "assistant", "content": "Hel"}], drops, True, False),
        ([user, {"role": "assistant", "reasoning_content": "r"}], None, True, False),
        ([user, {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"x": 1}]}], blocks, True, False),
        ([user, {"role": "assistant", "content": [{"x": 1}]}], blocks, True, False),
        ([user, {"role": "assistant", "content": "Hel"}], "{{ messages | length }}", True, False),
        ([user, {"role": "assistant", "content": "Hel"}], None, True, True),  # with add_generation_prompt
        ([], None, False, True),
        ([user], "{% for m in messages %}{{ m.role + 1 }}{% endfor %}", False, True),
        ([user], "{{ raise_exception('no ' + messages[0].role) }}", False, True),
        ([user], "{% if %}", False, True),
    ]
    for messages, template, continue_final, generation_prompt in cases:
        args = (None, None, generation_prompt, continue_final, template, {})
        ours = _outcome(fast.render, copy.deepcopy(messages), *args)
        theirs = _outcome(
            tok.hf.apply_chat_template,
            copy.deepcopy(messages),
            chat_template=template,
            add_generation_prompt=generation_prompt,
            continue_final_message=continue_final,
            tokenize=False,
        )
        assert ours == theirs, (messages, template)


def test_fast_render_picks_among_named_templates_as_transformers() -> None:
    """A tokenizer with several named templates: tool_use with tools, default otherwise, a name picks one, and no
    default is transformers' error."""
    from pyfront.server.text.chat_template import ChatRender

    tok = server_tokenizer()
    messages = [{"role": "user", "content": "Hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    original = tok.hf.chat_template
    try:
        for templates in (
            {"default": "D{{ messages[0].content }}", "tool_use": "T{{ tools | length }}", "other": "O"},
            {"tool_use": "T", "other": "O"},
        ):
            tok.hf.chat_template = templates
            fast = ChatRender(templates, tok.hf.special_tokens_map)
            for given_tools, name in ((None, None), (tools, None), ([], None), (None, "other"), (tools, "other")):
                ours = _outcome(fast.render, messages, given_tools, None, True, False, name, {})
                theirs = _outcome(
                    tok.hf.apply_chat_template,
                    messages,
                    tools=given_tools,
                    chat_template=name,
                    add_generation_prompt=True,
                    tokenize=False,
                )
                assert ours == theirs, (templates, given_tools, name)
    finally:
        tok.hf.chat_template = original


def test_wrapper_parameters_are_transformers_parameters() -> None:
    """The template variables left to transformers are exactly the wrapper's parameter names."""
    import inspect

    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.utils import chat_template_utils as ctu

    from pyfront.server.text.chat_template import WRAPPER_PARAMETERS

    names = {"messages", "self", "conversation", "conversations"}
    for fn in (PreTrainedTokenizerBase.apply_chat_template, ctu.render_jinja_template):
        names.update(inspect.signature(fn).parameters)
    assert names == WRAPPER_PARAMETERS


def test_fast_render_self_check_turns_it_off(monkeypatch) -> None:
    from pyfront.server.text.chat_template import ChatRender

    tok = server_tokenizer()
    original = ChatRender.render

    def broken(self, *args):
        text = original(self, *args)
        return None if text is None else text + " "

    monkeypatch.setattr(ChatRender, "render", broken)
    tok._enable_fast_chat()
    try:
        assert tok._fast_chat is None and tok.fast_chat_reason
    finally:
        monkeypatch.undo()
        tok._enable_fast_chat()
    assert tok._fast_chat is not None


def test_test_extra_holds_transformers_to_the_verified_releases() -> None:
    """The test extra's ``transformers<X`` bound is the release after the newest one the fast render was read
    against, so CI cannot pick up an unread release (the fast path would fall back and these tests fail) and the
    bound cannot lag behind a newly verified release."""
    import pathlib
    import re
    import tomllib

    import pyfront.server.text.tokenizer as tokenizer_module

    root = pathlib.Path(__file__).resolve().parents[3]
    test_extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    bounds = [re.fullmatch(r"transformers<(\d+)\.(\d+)", spec.replace(" ", "")) for spec in test_extra]
    (bound,) = [match for match in bounds if match]
    newest = max(tuple(int(part) for part in v.rstrip(".").split(".")) for v in tokenizer_module.VERIFIED_TRANSFORMERS)
    assert (int(bound[1]), int(bound[2])) == (newest[0], newest[1] + 1)


def test_test_extra_holds_jinja_to_the_verified_releases() -> None:
    """The same for jinja2, whose sandbox internals ``_FastSandbox`` shortcuts (``VERIFIED_JINJA``)."""
    import pathlib
    import re
    import tomllib

    from pyfront.server.text.chat_template import VERIFIED_JINJA

    root = pathlib.Path(__file__).resolve().parents[3]
    test_extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    (bound,) = [m for m in (re.fullmatch(r"jinja2<(\d+)\.(\d+)", spec.replace(" ", "")) for spec in test_extra) if m]
    (verified,) = VERIFIED_JINJA
    major, minor = (int(part) for part in verified.rstrip(".").split("."))
    assert (int(bound[1]), int(bound[2])) == (major, minor + 1)
