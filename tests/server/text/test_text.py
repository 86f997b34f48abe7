"""Tests for the text layer (server/text.py): incremental detokenization, stop strings, logprobs.

Expected behaviours were checked against vLLM 0.32's own code (``v1/engine/detokenizer.py``,
``v1/engine/logprobs.py``, the OpenAI serving layer) with its virtualenv; the suite itself does not
need vLLM.
"""

from __future__ import annotations

import math
import os

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront.engine_client.protocol import PlainLogprobs
from pyfront.server.text.detokenizer import (
    DetokenizerFactory,
    FastIncrementalDetokenizer,
    IncrementalDetokenizer,
    SlowIncrementalDetokenizer,
    get_factory,
)
from pyfront.server.text.logprobs import (
    LOGPROB_FLOOR,
    chat_logprobs_content,
    completion_logprobs,
    next_text_offset,
    token_text,
)
from pyfront.server.text.stream import TextStream

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EOS = 151645  # <|im_end|>
ENDOFTEXT = 151643
THINK, END_THINK = 151667, 151668  # added, not special

SAMPLES = [
    "Hello world",
    "Hello, world! How are you doing today? I'm fine; you're great.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "你好，世界！今天天气很好。我们一起去公园散步吧。",  # noqa: RUF001
    "日本語のテキストとカタカナ、ひらがな。한국어 텍스트도 있습니다.",
    "Emoji: 🙂🙃👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✓ ✗ ★ 🎉",
    "Rare CJK split into byte tokens: 𠀀𪚥𡃁 龘 and 鱻",
    "Mixed 中文 and English with numbers 123 and emoji 🎉 together!!!",
    "   leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs\nline two\n\n\nline five\r\n\r\nwindows",
    "\u00a0non-breaking\u2003em space\u3000ideographic space zero\u200bwidth",
    "Ünïcödé àccénts: café naïve résumé façade Ångström",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me reason.\n</think>\n\nThe answer is 4.<|im_end|>",
    "text<|endoftext|>more text<|im_end|><|im_end|>",
    "",
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer

    return AutoTokenizer.from_pretrained(str(ensure_qwen3_tokenizer()), local_files_only=True)


@pytest.fixture(scope="module")
def slow_factory(tok) -> DetokenizerFactory:
    return DetokenizerFactory(tok, mode="slow")


@pytest.fixture(scope="module")
def sp_tok():
    """A tiny SentencePiece-style tokenizer (Metaspace, byte fallback, decoder strips the leading space)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁", "▁Hello", "▁world", "Hello", "!", "▁the", "▁cat", "▁caf", "é", "▁你", "好", "a", "b"]
    vocab = [(p, 0.0) for p in pieces] + [(w, -1.0 - i * 0.01) for i, w in enumerate(words)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _stream_detok(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(t) for t in ids]


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i = [], 0
    for size in sizes:
        if i >= len(ids):
            break
        out.append(ids[i : i + size])
        i += size
    if i < len(ids):
        out.append(ids[i:])
    return out


def _run(ts: TextStream, chunks: list[list[int]], *, eos_end: bool = False) -> list[str]:
    deltas = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        deltas.append(ts.add(chunk, finished_by_engine=last, stop_token_finished=last and eos_end))
        if ts.finished:
            break
    return deltas


# --------------------------------------------------------------------------- detokenizer


def test_dispatch_and_factory(tok, slow_factory) -> None:
    assert isinstance(IncrementalDetokenizer(tok), FastIncrementalDetokenizer)
    assert isinstance(IncrementalDetokenizer(slow_factory), SlowIncrementalDetokenizer)
    assert get_factory(tok) is get_factory(tok)
    assert get_factory(slow_factory) is slow_factory
    assert isinstance(get_factory(tok).detokenizer(), FastIncrementalDetokenizer)
    # A bare tokenizers.Tokenizer works on the fast path too.
    bare = IncrementalDetokenizer(tok.backend_tokenizer)
    assert "".join(bare.push(t) for t in tok.encode("héllo 🎉")) == "héllo 🎉"


@pytest.mark.parametrize("mode", ["fast", "slow"])
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", SAMPLES)
def test_streaming_equals_decode(tok, slow_factory, mode: str, skip: bool, text: str) -> None:
    factory = get_factory(tok) if mode == "fast" else slow_factory
    ids = tok.encode(text)
    detok = factory.detokenizer(skip_special_tokens=skip)
    deltas = _stream_detok(detok, ids)
    assert detok.flush() == ""
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in d for d in deltas)


def test_multibyte_characters_come_out_whole(tok) -> None:
    for char in ["🎉", "𠀀", "𪚥", "👍", "龘"]:  # single code points
        ids = tok.encode(f"a {char} b")
        pieces = [tok.convert_ids_to_tokens(i) for i in ids]
        assert len(ids) > 3, (char, pieces)  # the character really is split over several tokens
        deltas = _stream_detok(IncrementalDetokenizer(tok), ids)
        assert any(char in d for d in deltas), deltas
        assert "".join(deltas) == f"a {char} b"
    # A 3-token emoji: nothing until the last byte arrives, then the whole character.
    ids = tok.encode(" 🎉")
    assert len(ids) == 3
    assert _stream_detok(IncrementalDetokenizer(tok), ids) == ["", "", " 🎉"]


def test_flush_gives_replacement_for_incomplete_bytes(tok, slow_factory) -> None:
    ids = tok.encode("ok 🎉")[:-1]  # the last byte of the emoji never arrives
    for factory in (get_factory(tok), slow_factory):
        detok = factory.detokenizer()
        text = "".join(_stream_detok(detok, ids))
        assert "\ufffd" not in text
        tail = detok.flush()
        assert text + tail == tok.decode(ids)
        assert tail.endswith("\ufffd")
        assert detok.flush() == ""  # only once


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(exclude_categories=("Cs",)), max_size=60),
    sizes=st.lists(st.integers(1, 5), max_size=40),
    skip=st.booleans(),
)
def test_random_text_random_chunks(tok, text: str, sizes: list[int], skip: bool) -> None:
    ids = tok.encode(text)
    ts = TextStream(tok, skip_special_tokens=skip)
    deltas = _run(ts, _chunks(ids, sizes)) if ids else [ts.finish()]
    expected = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == expected == ts.text
    if "\ufffd" not in text:
        assert not any("\ufffd" in d for d in deltas)
    assert ts.token_ids == ids and ts.num_tokens == len(ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(
        st.one_of(st.integers(0, 255), st.integers(0, 151668), st.sampled_from([EOS, ENDOFTEXT, THINK])),
        max_size=16,
    ),
    skip=st.booleans(),
    slow=st.booleans(),
)
def test_random_ids_push_plus_flush_equals_decode(tok, slow_factory, ids, skip, slow) -> None:
    factory = slow_factory if slow else get_factory(tok)
    detok = factory.detokenizer(skip_special_tokens=skip)
    assert "".join(_stream_detok(detok, ids)) + detok.flush() == tok.decode(ids, skip_special_tokens=skip)


def test_spaces_between_special_tokens_false(tok) -> None:
    ids = tok.encode("a<think><|im_start|></think>b<|im_end|>")
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip, spaces_between_special_tokens=False)
        assert "".join(_stream_detok(detok, ids)) == tok.decode(ids, skip_special_tokens=skip)


def test_prompt_tail_primes_sentencepiece_space(sp_tok) -> None:
    prompt = sp_tok.encode("the cat")
    gen = sp_tok.encode("Hello world")  # "▁Hello", "▁world"
    assert sp_tok.convert_ids_to_tokens(gen[:1]) == ["▁Hello"]
    slow = DetokenizerFactory(sp_tok, mode="slow")
    for factory in (get_factory(sp_tok), slow):
        assert factory.fast == (factory is not slow)
        # Without context the decoder strips the leading space, as decode() does.
        assert "".join(_stream_detok(factory.detokenizer(), gen)) == "Hello world"
        # Primed with the prompt tail the first token keeps its space (vLLM primes with the prompt).
        primed = factory.detokenizer(prompt_tail=prompt[-8:])
        assert _stream_detok(primed, gen) == [" Hello", " world"]
    # Byte-fallback pieces stream whole.
    ids = sp_tok.encode("a ☃ b")
    assert "".join(_stream_detok(IncrementalDetokenizer(sp_tok, prompt_tail=prompt), ids)) == " a ☃ b"


def _byte_ids(tok, lo: int, hi: int) -> list[int]:
    """The ids of the single-byte tokens for bytes lo..hi (ByteLevel's character for each byte)."""
    from pyfront.server.text.detokenizer import _BYTE_OF_CHAR

    char_of_byte = {b: c for c, b in _BYTE_OF_CHAR.items()}
    ids = [tok.convert_tokens_to_ids(char_of_byte[b]) for b in range(lo, hi + 1)]
    return [i for i in ids if i is not None and i != tok.unk_token_id]


@pytest.fixture(scope="module")
def prefill_pool(tok) -> list[int]:
    """Ids whose bytes start a character, continue one, start one that never ends, or are none (skipped specials)."""
    words = tok.encode("the café 你好 € 😀 a\n b", add_special_tokens=False)
    pool = words + _byte_ids(tok, 0x80, 0xBF)[:24] + _byte_ids(tok, 0xC3, 0xF0)[:12] + _byte_ids(tok, 0x20, 0x7E)[:8]
    return [*pool, EOS, ENDOFTEXT, THINK, tok.convert_tokens_to_ids("<|im_start|>")]


def _steps(backend, prime: list[int], gen: list[int], skip: bool) -> list[str | None]:
    """What DecodeStream primed with `prime` returns for each of `gen` (an error's name ends the list)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prime, skip_special_tokens=skip)
    out: list[str | None] = []
    for token_id in gen:
        try:
            out.append(stream.step(backend, token_id))
        except Exception as exc:  # the same error either way, at the same step
            out.append(type(exc).__name__)
            break
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), skip=st.booleans())
def test_byte_level_prefill_decodes_as_the_whole_prompt(tok, prefill_pool, data, skip: bool) -> None:
    """DetokenizerFactory.stream_prefill's suffix primes DecodeStream to the same steps as the whole prompt, vLLM's
    priming: prompts of up to 30 ids (below MAX_PREFILL_TOKENS) mixing every kind of byte, specials included."""
    factory = get_factory(tok)
    prompt = data.draw(st.lists(st.sampled_from(prefill_pool), max_size=30))
    gen = data.draw(st.lists(st.sampled_from(prefill_pool), min_size=1, max_size=12))
    prime = factory.stream_prefill(prompt, skip)
    assert factory.prefill_reason is None
    assert prime == prompt[len(prompt) - len(prime) :]
    whole = _steps(factory.backend, prompt, gen, skip)
    part = _steps(factory.backend, prime, gen, skip)
    if not factory.backend.decode(prompt, skip_special_tokens=skip).endswith("\ufffd"):
        assert part == whole
        return
    # The prompt's text ends inside a character: no prefix is set, and the first text carries the primed text
    # (the whole prompt's in vLLM, the suffix's here); everything after it is the same.
    first = next((i for i, text in enumerate(whole) if text is not None), len(whole))
    assert part[:first] == whole[:first] and part[first + 1 :] == whole[first + 1 :]
    if first < len(whole):
        assert whole[first].endswith(part[first])


def test_prefill_is_one_id_for_a_chat_prompt_and_bounded(tok) -> None:
    from pyfront.server.text.detokenizer import MAX_PREFILL_TOKENS

    factory = get_factory(tok)
    chat = tok.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert factory.stream_prefill(chat, True) == chat[-1:]
    assert factory.stream_prefill(chat, False) == chat[-1:]
    # Trailing specials: skipped ones have no bytes, kept ones are their text's.
    ended = [*chat[:-1], EOS, ENDOFTEXT]
    assert factory.stream_prefill(ended, True) == ended[-3:]
    assert factory.stream_prefill(ended, False) == ended[-1:]
    # No id that starts a character among the last MAX_PREFILL_TOKENS: those.
    continuations = _byte_ids(tok, 0x80, 0xBF)
    long = chat + continuations + continuations
    assert len(continuations) * 2 > MAX_PREFILL_TOKENS
    assert factory.stream_prefill(long, True) == long[-MAX_PREFILL_TOKENS:]
    assert factory.stream_prefill([], True) == []


def test_prefill_falls_back_to_the_tail_without_a_byte_level_decoder(sp_tok) -> None:
    from pyfront.server.text.detokenizer import PROMPT_TAIL_TOKENS

    factory = DetokenizerFactory(sp_tok)
    ids = list(range(3, 30))
    assert factory.stream_prefill(ids, True) == ids[-PROMPT_TAIL_TOKENS:]
    assert factory.prefill_reason is not None and "not ByteLevel" in factory.prefill_reason


def test_prefill_falls_back_when_the_probe_disagrees(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyfront.server.text import detokenizer

    monkeypatch.setattr(detokenizer, "_token_bytes", lambda token: token.encode("utf-8"))  # a wrong byte map
    factory = DetokenizerFactory(tok)
    ids = tok.encode("hello there\n")
    assert factory.stream_prefill(ids, True) == ids[-detokenizer.PROMPT_TAIL_TOKENS :]
    assert factory.prefill_reason is not None and "UTF-8 decoding" in factory.prefill_reason


# --------------------------------------------------------------------------- stop strings


def test_no_stops_streams_immediately(tok) -> None:
    ids = tok.encode("Hello world, 你好")
    ts = TextStream(tok)
    deltas = [ts.add([t]) for t in ids]
    assert "".join(deltas) == "Hello world, 你好"
    assert deltas[0] == "Hello"
    assert ts.finish() == ""
    assert ts.text == "Hello world, 你好" and not ts.stopped and ts.stop_reason is None


def test_hold_back_and_release_at_finish(tok) -> None:
    ids = tok.encode("Hello world and more")
    ts = TextStream(tok, ["abcd", "xy"])  # longest stop 4 -> hold back 3 characters
    deltas = [ts.add([t]) for t in ids]
    assert "".join(deltas) == "Hello world and m"
    assert ts.add([], finished_by_engine=True) == "ore"
    assert ts.text == "Hello world and more" and ts.finished and not ts.stopped
    assert ts.add(tok.encode(" ignored")) == ""  # finished: later outputs are ignored
    # finish() releases too (client abort / no more outputs).
    ts = TextStream(tok, "abcd")
    assert "".join(ts.add([t]) for t in ids) + ts.finish() == "Hello world and more"
    # Finishing with the last token releases everything at once.
    ts = TextStream(tok, ["abcd"])
    out = [ts.add([t], finished_by_engine=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert out[-1].endswith("more") and "".join(out) == "Hello world and more"


def test_stop_string_across_tokens(tok) -> None:
    ids = tok.encode("Hello world peace now")
    assert len(ids) == 4
    ts = TextStream(tok, ["world peace"])
    deltas = [ts.add([t]) for t in ids]
    assert ts.stopped and ts.stop_reason == "world peace"
    assert "".join(deltas) == ts.text == "Hello "
    assert ts.token_ids == ids[:3] and ts.num_tokens == 3  # up to the completing token
    assert deltas[3] == ""  # after the stop nothing more


def test_stop_string_split_inside_multitoken_char(tok) -> None:
    ids = tok.encode("ab 🎉 cd")
    ts = TextStream(tok, ["🎉"])
    deltas = [ts.add([t]) for t in ids]
    assert ts.stopped and ts.text == "ab " and "".join(deltas) == "ab "
    assert ts.num_tokens == len(tok.encode("ab 🎉"))


def test_stop_string_spanning_three_tokens(tok) -> None:
    ids = tok.encode("one two three four")
    ts = TextStream(tok, ["o three f"], include_stop_str_in_output=True)
    deltas = [ts.add([t]) for t in ids]
    assert "".join(deltas) == ts.text == "one two three f"
    assert ts.num_tokens == 4


def test_multi_token_add_trims_tokens(tok) -> None:
    ids = tok.encode("alpha beta gamma delta epsilon")
    ts = TextStream(tok, ["gamma"])
    assert ts.add(ids) == "alpha beta "
    assert ts.stopped and ts.token_ids == ids[:3] and ts.num_new_tokens == 3
    # include_stop_str_in_output keeps the stop text, still drops later tokens.
    ts = TextStream(tok, ["gamma"], include_stop_str_in_output=True)
    assert ts.add(ids[:1]) == "alpha"
    assert ts.add(ids[1:]) == " beta gamma"
    assert ts.num_new_tokens == 2 and ts.num_tokens == 3


def test_earliest_match_wins(tok) -> None:
    ids = tok.encode("a b c xyz d")
    ts = TextStream(tok, ["xyz", "b c"])
    assert ts.add(ids) == "a " and ts.stop_reason == "b c"
    # Same end position: the first listed stop string wins.
    ts = TextStream(tok, ["c", "b c"])
    assert ts.add(ids) == "a b " and ts.stop_reason == "c"
    ts = TextStream(tok, ["b c", "c"])
    assert ts.add(ids) == "a " and ts.stop_reason == "b c"
    # Token by token: the first completed match stops.
    ts = TextStream(tok, ["xyz d", "c x"])
    assert "".join(ts.add([t]) for t in ids) == "a b " and ts.stop_reason == "c x"


def test_min_tokens(tok) -> None:
    ids = tok.encode("one two one two one")
    assert len(ids) == 5
    ts = TextStream(tok, [" two"])
    assert "".join(ts.add([t]) for t in ids) == "one"
    for min_tokens in (2, 3):
        ts = TextStream(tok, [" two"], min_tokens=min_tokens)
        assert "".join(ts.add([t]) for t in ids) == "one two one"
        assert ts.num_tokens == 4
    ts = TextStream(tok, [" two"], min_tokens=3)  # all at once: boundary inside the chunk
    assert ts.add(ids) == "one two one" and ts.num_tokens == 4
    ts = TextStream(tok, [" two"], min_tokens=5)
    assert "".join(ts.add([t]) for t in ids) + ts.finish() == "one two one two one" and not ts.stopped
    # vLLM searches from len(stop) - 1 characters before the boundary: a match that starts inside
    # the first min_tokens tokens but completes after them does stop.
    ts = TextStream(tok, ["two one"], min_tokens=2)
    assert "".join(ts.add([t]) for t in ids) == "one " and ts.num_tokens == 3


def test_stop_token_finished(tok) -> None:
    ids = [*tok.encode("Hello there"), EOS]
    # EOS text not added (and with skip_special_tokens=False it would be visible), but counted.
    ts = TextStream(tok, skip_special_tokens=False)
    out = "".join(_run(ts, [[t] for t in ids], eos_end=True))
    assert out == ts.text == "Hello there"
    assert ts.num_tokens == len(ids) and ts.token_ids[-1] == EOS and not ts.stopped
    # include_stop_str_in_output adds it.
    ts = TextStream(tok, skip_special_tokens=False, include_stop_str_in_output=True)
    assert "".join(_run(ts, [ids], eos_end=True)) == "Hello there<|im_end|>"
    # Non-special stop token id (e.g. "\n\n" in stop_token_ids): skipped the same way.
    nl = tok.encode("\n\n")
    assert len(nl) == 1
    ts = TextStream(tok, ["zzz"])
    out = _run(ts, [ids[:1], [*ids[1:-1], nl[0]]], eos_end=True)
    assert "".join(out) == "Hello there" and ts.num_tokens == len(ids)
    # A stop string completed before the stop token: stop string wins, later tokens dropped.
    ts = TextStream(tok, ["lo"])
    assert ts.add(ids, finished_by_engine=True, stop_token_finished=True) == "Hel"
    assert ts.stop_reason == "lo" and ts.num_tokens == 1


def test_flush_partial_utf8_option(tok) -> None:
    ids = tok.encode("ok 🎉")[:-1]
    assert "".join(_run(TextStream(tok), [ids])) == "ok"  # vLLM drops the incomplete bytes
    ts = TextStream(tok, ["zz"], flush_partial_utf8=True)
    assert "".join(_run(ts, [[t] for t in ids])) == tok.decode(ids)


def test_empty_stop_string_rejected(tok) -> None:
    with pytest.raises(ValueError):
        TextStream(tok, ["a", ""])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.sampled_from("ab c\n你🎉"), max_size=30),
    stops=st.lists(st.text(st.sampled_from("ab c\n你🎉"), min_size=1, max_size=4), max_size=3),
    sizes=st.lists(st.integers(1, 4), max_size=30),
    include=st.booleans(),
    min_tokens=st.integers(0, 4),
)
def test_stop_strings_match_reference(tok, text, stops, sizes, include, min_tokens) -> None:
    """Streaming result == a direct, non-incremental computation of vLLM's rule."""
    ids = tok.encode(text)
    ts = TextStream(tok, stops, include_stop_str_in_output=include, min_tokens=min_tokens)
    chunks = _chunks(ids, sizes)
    got = "".join(_run(ts, chunks)) if ids else ts.finish()

    # Reference: walk the chunks, decode everything visible so far, look for a match ending past
    # the min_tokens boundary and inside this chunk. Visible text after k tokens = decode of the
    # longest prefix that does not end inside a character (what incremental decoding has released).
    def visible(k: int) -> str:
        while k and tok.decode(ids[:k]).endswith("\ufffd"):
            k -= 1
        return tok.decode(ids[:k])

    expected, n_tokens, seen, stopped = tok.decode(ids), len(ids), 0, None
    for chunk in chunks:
        seen += len(chunk)
        full = visible(seen)
        if seen <= min_tokens:
            continue
        check_from = len(visible(max(min_tokens, seen - len(chunk))))
        if check_from == len(full):
            continue
        matches = []
        for order, stop in enumerate(stops):
            idx = full.find(stop, max(check_from - len(stop) + 1, 0))
            if idx != -1:
                matches.append((idx + len(stop), order, idx, stop))
        if matches:
            end, _, idx, stopped = min(matches)
            expected = full[:end] if include else full[:idx]
            n_tokens = next(k for k in range(seen - len(chunk) + 1, seen + 1) if len(visible(k)) >= end)
            break
    assert got == expected == ts.text
    assert ts.stop_reason == stopped and ts.stopped == (stopped is not None)
    assert ts.num_tokens == n_tokens


# --------------------------------------------------------------------------- logprobs

# Rows [sampled, top1, top2] for the tokens of " 🎉!" (the emoji is 3 byte-level tokens). Expected
# values were produced by vLLM 0.32 (LogprobsProcessor + _create_chat_logprobs /
# _create_completion_logprobs) on the same tokenizer.
LP_ROWS = PlainLogprobs(
    [[11162, 11162, 100], [236, 17, 236], [231, 231, 100], [0, 1, 2]],
    [[-0.5, -0.5, float("-inf")], [-1.25, -0.75, -1.25], [-0.25, -0.25, -3.0], [-2.5, -1.0, -2.0]],
    [1, 2, 1, 7],
)


def _row_list(plain: PlainLogprobs) -> list[tuple]:
    return list(zip(plain.token_ids, plain.logprobs, plain.ranks, strict=True))


PARTY = [32, 240, 159, 142, 137]  # " 🎉"


def test_lp_rows_tokenization(tok) -> None:
    assert tok.encode(" 🎉!") == [11162, 236, 231, 0]


def test_token_text(tok) -> None:
    assert token_text(tok, 9707) == "Hello"
    assert token_text(tok, EOS) == "<|im_end|>"  # special tokens are shown
    assert token_text(tok, 236) == "\ufffd"  # lone byte: decode() form
    assert token_text(tok, 236, return_tokens_as_token_ids=True) == "token_id:236"
    assert token_text(tok, 9707) is token_text(tok, 9707)  # cached


def test_token_text_sentencepiece_leading_space(sp_tok) -> None:
    hello = sp_tok.convert_tokens_to_ids("▁Hello")
    assert sp_tok.decode([hello]) == "Hello"
    assert token_text(sp_tok, hello) == " Hello"  # vLLM restores the Metaspace space


def test_chat_logprobs_content(tok) -> None:
    content = chat_logprobs_content(tok, LP_ROWS, top_logprobs=2, context=[])
    assert content == [
        {
            "token": "",
            "logprob": -0.5,
            "bytes": [],
            "top_logprobs": [
                {"token": "", "logprob": -0.5, "bytes": []},
                {"token": "", "logprob": -9999.0, "bytes": []},
            ],
        },
        {
            "token": "",
            "logprob": -1.25,
            "bytes": [],
            "top_logprobs": [
                {"token": "", "logprob": -1.25, "bytes": []},
                {"token": "2", "logprob": -0.75, "bytes": [50]},
            ],
        },
        {
            "token": " 🎉",
            "logprob": -0.25,
            "bytes": PARTY,
            "top_logprobs": [
                {"token": " 🎉", "logprob": -0.25, "bytes": PARTY},
                {"token": " 🎧", "logprob": -3.0, "bytes": [32, 240, 159, 142, 167]},
            ],
        },
        {
            "token": "!",
            "logprob": -2.5,
            "bytes": [33],
            # vLLM lists the first top_logprobs entries of the position dict, sampled token first.
            "top_logprobs": [
                {"token": "!", "logprob": -2.5, "bytes": [33]},
                {"token": '"', "logprob": -1.0, "bytes": [34]},
            ],
        },
    ]
    one = chat_logprobs_content(tok, LP_ROWS, top_logprobs=1, context=[])
    assert [len(c["top_logprobs"]) for c in one] == [1, 1, 1, 1]
    assert [len(c["top_logprobs"]) for c in chat_logprobs_content(tok, LP_ROWS, top_logprobs=-1)] == [2, 2, 2, 3]
    # Rows given as (ids, logprobs, rank) tuples, and without an explicit context: same result.
    assert chat_logprobs_content(tok, _row_list(LP_ROWS), top_logprobs=2) == content
    # Streaming in deltas with a shared context gives the same entries.
    ctx: list[int] = []
    streamed = []
    rows = _row_list(LP_ROWS)
    for lo, hi in ((0, 1), (1, 3), (3, 4)):
        streamed += chat_logprobs_content(tok, rows[lo:hi], top_logprobs=2, context=ctx)
    assert streamed == content and ctx == [11162, 236, 231, 0]
    # Without a shared context, a character completed in a later delta is not recovered.
    cut = chat_logprobs_content(tok, rows[:2], top_logprobs=2) + chat_logprobs_content(tok, rows[2:], top_logprobs=2)
    assert cut[2]["token"] == ""


def test_chat_logprobs_token_ids(tok) -> None:
    content = chat_logprobs_content(tok, LP_ROWS, top_logprobs=2, return_tokens_as_token_ids=True, context=[])
    assert [c["token"] for c in content] == ["token_id:11162", "token_id:236", "token_id:231", "token_id:0"]
    # vLLM quirk: the sampled entry's bytes are those of the decoded text, top entries' are the id form.
    assert [c["bytes"] for c in content] == [[], [], PARTY, [33]]
    assert content[0]["top_logprobs"][1] == {
        "token": "token_id:100",
        "logprob": -9999.0,
        "bytes": list(b"token_id:100"),
    }


def test_completion_logprobs(tok) -> None:
    out = completion_logprobs(tok, LP_ROWS, top_logprobs=2, initial_text_offset=5, context=[])
    assert out == {
        "text_offset": [5, 5, 5, 7],
        "token_logprobs": [-0.5, -1.25, -0.25, -2.5],
        "tokens": ["", "", " 🎉", "!"],
        "top_logprobs": [
            {"": -9999.0},  # ids 11162 and 100 both show "" -> collapse, last value wins
            {"": -1.25, "2": -0.75},
            {" 🎉": -0.25, " 🎧": -3.0},
            {"!": -2.5, '"': -1.0, "#": -2.0},  # sampled + top-K (K + 1 keys)
        ],
    }
    assert next_text_offset(out, 5) == 8
    assert next_text_offset(completion_logprobs(tok, [], top_logprobs=2), 8) == 8
    out = completion_logprobs(tok, LP_ROWS, top_logprobs=1, context=[])
    assert out["top_logprobs"][3] == {"!": -2.5, '"': -1.0}
    out = completion_logprobs(tok, LP_ROWS, top_logprobs=2, initial_text_offset=5, return_tokens_as_token_ids=True)
    assert out["text_offset"] == [5, 19, 31, 43]
    assert out["top_logprobs"][3] == {"token_id:0": -2.5, "token_id:1": -1.0, "token_id:2": -2.0}
    # Echoed prompt: the first prompt token has no logprob.
    out = completion_logprobs(tok, [([0, 0], [-1.0, -1.0], 1)], top_logprobs=1, unscored_token_ids=[9707])
    assert out == {
        "text_offset": [0, 5],
        "token_logprobs": [None, -1.0],
        "tokens": ["Hello", "!"],
        "top_logprobs": [None, {"!": -1.0}],
    }


def test_logprobs_non_finite_are_json_safe(tok) -> None:
    rows = PlainLogprobs([[9707, 0]], [[float("nan"), float("-inf")]], [1])
    content = chat_logprobs_content(tok, rows, top_logprobs=2)
    assert math.isnan(content[0]["logprob"])  # max(nan, -9999.0) is nan, as in vLLM ...
    assert content[0]["top_logprobs"][1]["logprob"] == LOGPROB_FLOOR
    encoded = msgspec.json.decode(msgspec.json.encode(content))
    assert encoded[0]["logprob"] is None  # ... and encodes as null (pydantic does the same)
    comp = completion_logprobs(tok, rows, top_logprobs=1)
    assert msgspec.json.decode(msgspec.json.encode(comp))["top_logprobs"] == [{"Hello": None, "!": -9999.0}]
