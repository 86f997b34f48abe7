"""Tests for the offline-built Qwen3 tokenizer (server/bundled_tokenizer.py)."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront.server.text import bundled_tokenizer as bt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIAL_TOKENS = {content: bt.QWEN3_FIRST_ADDED_ID + i for i, (content, _) in enumerate(bt.QWEN3_ADDED_TOKENS)}
SPECIAL_RE = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))

SAMPLES = [
    "Hello world",
    "Hello, world! How are you doing today? I'm fine; you're great, we've seen it, they'll go, he'd say.",
    "The QUICK brown fox JUMPS over the lazy dog's back.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }\r\n',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "你好，世界！今天天气很好。我们一起去公园散步吧。",  # noqa: RUF001
    "日本語のテキストとカタカナ、ひらがな。한국어 텍스트도 있습니다.",
    "Emoji: 🙂🙃👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✓ ✗ ★",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e10 0xDEADBEEF 1,000,000",
    "   leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\n\nline five\r\n\r\nwindows",
    "multiple     spaces      between        words",
    "\n\n\n",
    "    ",
    "",
    "a",
    "Ünïcödé àccénts: café naïve résumé façade Ångström",
    "Cyrillic: Привет, как дела? Greek: Καλημέρα κόσμε. Arabic: مرحبا بالعالم. Hebrew: שלום עולם",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, ∫ f(x) dx, √2 ≈ 1.414, ∞ ≠ \u2212∞",
    "URLs: https://example.com/path?query=1&x=y#frag and emails a.b@c.de",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|>",
    "<think>\nLet me reason.\n</think>\n\nThe answer is 4.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<tool_response>\n18C\n</tool_response><|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
    "almost special: <|im_start| <think <|not_a_token|> </think",
    "Mixed 中文 and English with numbers 123 and emoji 🎉 together!!!",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE DON'T I'M",
    "decomposed e\u0301 and composed é; angstrom A\u030a",
    "\u00a0non-breaking\u2003em space\u3000ideographic space",
    "zero\u200bwidth\u200djoiner\ufeffbom",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("pyfront-cache")
    return bt.ensure_qwen3_tokenizer(cache)


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@pytest.fixture(scope="session")
def tiktoken_encoding():
    import tiktoken

    return tiktoken.Encoding(
        "qwen3-reference",
        pat_str=bt.QWEN2_PRETOKENIZE_REGEX,
        mergeable_ranks=bt.load_qwen_ranks(),
        special_tokens=SPECIAL_TOKENS,
    )


def _reference_encode(enc, text: str) -> list[int]:
    """tiktoken with HF semantics: added tokens are matched on the raw text, the rest is NFC-normalized."""
    ids: list[int] = []
    pos = 0
    for match in SPECIAL_RE.finditer(text):
        ids += enc.encode_ordinary(unicodedata.normalize("NFC", text[pos : match.start()]))
        ids.append(SPECIAL_TOKENS[match.group()])
        pos = match.end()
    ids += enc.encode_ordinary(unicodedata.normalize("NFC", text[pos:]))
    return ids


def _normalized(text: str) -> str:
    """What decode(encode(text)) should give back: NFC outside the added tokens."""
    pieces: list[str] = []
    pos = 0
    for match in SPECIAL_RE.finditer(text):
        pieces += [unicodedata.normalize("NFC", text[pos : match.start()]), match.group()]
        pos = match.end()
    pieces.append(unicodedata.normalize("NFC", text[pos:]))
    return "".join(pieces)


# --------------------------------------------------------------------------- files


def test_tokenizer_files(tokenizer_dir: Path) -> None:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    assert model["type"] == "BPE"
    assert len(model["vocab"]) == 151643
    assert len(model["merges"]) == 151387
    assert model["merges"][0] == "Ġ Ġ"
    assert data["normalizer"] == {"type": "NFC"}
    split, byte_level = data["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"]["Regex"] == bt.QWEN2_PRETOKENIZE_REGEX
    assert byte_level["use_regex"] is False and byte_level["add_prefix_space"] is False
    assert data["decoder"]["type"] == "ByteLevel"
    added = data["added_tokens"]
    assert [t["id"] for t in added] == list(range(151643, 151669))
    assert [t["content"] for t in added][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert [t["content"] for t in added][-2:] == ["<think>", "</think>"]
    non_special = {t["content"] for t in added if not t["special"]}
    assert non_special == {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    }
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert config["bos_token"] is None
    assert config["model_max_length"] == 131072
    assert config["chat_template"] == bt.QWEN3_CHAT_TEMPLATE
    assert (tokenizer_dir / "special_tokens_map.json").is_file()
    merges_txt = (tokenizer_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges_txt[0].startswith("#version") and merges_txt[1:] == model["merges"]


def test_build_is_deterministic(tmp_path: Path, tokenizer_dir: Path) -> None:
    out = bt.build_qwen3_tokenizer(tmp_path / "again")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
        "merges.txt",
        "special_tokens_map.json",
    ):
        assert (out / name).read_bytes() == (tokenizer_dir / name).read_bytes(), name


# --------------------------------------------------------------------------- loading and ids


def test_loads_offline_and_encodes_hello_world(hf_tokenizer) -> None:
    assert hf_tokenizer.encode("Hello world") == [9707, 1879]
    assert hf_tokenizer("Hello world")["input_ids"] == [9707, 1879]
    assert hf_tokenizer.decode([9707, 1879]) == "Hello world"
    assert len(hf_tokenizer) == 151669
    assert hf_tokenizer.bos_token is None


def test_special_token_ids(hf_tokenizer) -> None:
    ids = {token: hf_tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    assert ids == SPECIAL_TOKENS
    assert ids["<|endoftext|>"] == 151643
    assert ids["<|im_start|>"] == 151644
    assert ids["<|im_end|>"] == 151645
    assert ids["<tool_call>"] == 151657
    assert ids["</tool_call>"] == 151658
    assert ids["<think>"] == 151667
    assert ids["</think>"] == 151668
    assert hf_tokenizer.eos_token_id == 151645
    assert hf_tokenizer.pad_token_id == 151643
    # Embedded in text, every added token (special or not) is one id.
    assert hf_tokenizer.encode("<think>") == [151667]
    assert hf_tokenizer.encode("a<tool_call>b")[1] == 151657
    # Only the special=true ones are dropped by skip_special_tokens.
    text = "<|im_start|>x<think>y</think><|im_end|>"
    assert hf_tokenizer.decode(hf_tokenizer.encode(text), skip_special_tokens=True) == "x<think>y</think>"


@pytest.mark.parametrize("text", SAMPLES)
def test_matches_tiktoken(hf_tokenizer, tiktoken_encoding, text: str) -> None:
    ids = hf_tokenizer.encode(text)
    expected = tiktoken_encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")
    assert ids == expected
    assert ids == _reference_encode(tiktoken_encoding, text)
    assert hf_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    assert tiktoken_encoding.decode(ids) == unicodedata.normalize("NFC", text)


def test_matches_tiktoken_on_long_mixed_text(hf_tokenizer, tiktoken_encoding) -> None:
    text = "\n".join(SAMPLES) * 3
    expected = tiktoken_encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")
    assert hf_tokenizer.encode(text) == expected


_FRAGMENTS = st.sampled_from(
    [
        *(" ", "  ", "\t", "\n", "\r\n", "\n\n", "'s", "'LL", "123", "4.5"),
        *("🙂", "é", "e\u0301", "中文", "\u00a0"),
        *sorted(SPECIAL_TOKENS),
    ]
)
_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=120)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_TEXT, _FRAGMENTS), max_size=8).map("".join))
def test_matches_tiktoken_random_text(hf_tokenizer, tiktoken_encoding, text: str) -> None:
    ids = hf_tokenizer.encode(text)
    assert ids == _reference_encode(tiktoken_encoding, text)
    assert hf_tokenizer.decode(ids) == _normalized(text)


# --------------------------------------------------------------------------- chat template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

TOOLS_SYSTEM_SUFFIX = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0], ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def _render(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_chat_plain_with_generation_prompt(hf_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hello"},
    ]
    assert _render(hf_tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(hf_tokenizer, messages, add_generation_prompt=True, enable_thinking=True) == _render(
        hf_tokenizer, messages, add_generation_prompt=True
    )
    assert _render(hf_tokenizer, messages[1:]) == "<|im_start|>user\nHello<|im_end|>\n"


def test_chat_enable_thinking_false(hf_tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert _render(hf_tokenizer, messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    # <|im_start|> user \n Hi <|im_end|> \n <|im_start|> assistant \n <think> \n\n </think> \n\n
    assert ids == [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]


def test_chat_tools_tool_calls_and_results(hf_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should call the tool twice.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C, cloudy"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.\n\n"
        + TOOLS_SYSTEM_SUFFIX
        + "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should call the tool twice.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response>\n"
        "<tool_response>\n21C, cloudy\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(hf_tokenizer, messages, tools=TOOLS, add_generation_prompt=True) == expected


def test_chat_tools_without_system_and_call_after_text(hf_tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
    ]
    assert _render(hf_tokenizer, messages, tools=TOOLS) == (
        "<|im_start|>system\n" + TOOLS_SYSTEM_SUFFIX + "<|im_start|>user\nParis?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    )


def test_chat_reasoning_only_after_last_query(hf_tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "\nR2\n"},
    ]
    assert _render(hf_tokenizer, messages) == (
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n"
    )
    # Reasoning inline in the content is split out the same way.
    inline = [*messages[:3], {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"}]
    assert _render(hf_tokenizer, inline) == _render(hf_tokenizer, messages)


def test_chat_final_assistant_without_reasoning_gets_empty_think(hf_tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert _render(hf_tokenizer, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"
    )


def test_chat_multi_step_tool_reasoning_kept(hf_tokenizer) -> None:
    # Assistant turns after the last real user query keep their reasoning, even
    # across tool round trips; a user message that only wraps a tool response
    # does not count as a query.
    messages = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "step 1",
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
        {"role": "assistant", "content": "done", "reasoning_content": "step 2"},
    ]
    assert _render(hf_tokenizer, messages, add_generation_prompt=False) == (
        "<|im_start|>user\nGo<|im_end|>\n"
        '<|im_start|>assistant\n<think>\nstep 1\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nstep 2\n</think>\n\ndone<|im_end|>\n"
    )


# --------------------------------------------------------------------------- cache, alias, CLI


def test_ensure_is_cached_and_versioned(tmp_path: Path, tokenizer_dir: Path, monkeypatch) -> None:
    cache = tokenizer_dir.parent
    stamps = {p.name: p.stat().st_mtime_ns for p in tokenizer_dir.iterdir()}
    monkeypatch.setattr(bt, "build_tokenizer", lambda *a, **k: pytest.fail("a cached tokenizer was rebuilt"))
    assert bt.ensure_qwen3_tokenizer(cache) == tokenizer_dir
    assert {p.name: p.stat().st_mtime_ns for p in tokenizer_dir.iterdir()} == stamps  # nothing written again
    monkeypatch.undo()
    assert not [p for p in cache.iterdir() if p.name.startswith(".building-")]

    monkeypatch.setattr(bt, "BUILDER_VERSION", bt.BUILDER_VERSION + 1000)
    rebuilt = bt.ensure_qwen3_tokenizer(cache)
    assert rebuilt != tokenizer_dir and rebuilt.parent == cache
    assert (rebuilt / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()


def test_default_cache_dir_and_alias(tmp_path: Path, tokenizer_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYFRONT_CACHE_DIR", str(tmp_path))
    assert bt.default_cache_dir() == tmp_path / "qwen3-tokenizer"
    monkeypatch.delenv("PYFRONT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bt.default_cache_dir() == tmp_path / "xdg" / "pyfront" / "qwen3-tokenizer"

    assert bt.is_bundled_tokenizer_name(bt.BUNDLED_TOKENIZER_NAME)
    assert bt.is_bundled_tokenizer_name("PyFront/Qwen3-Tokenizer")
    assert not bt.is_bundled_tokenizer_name("Qwen/Qwen3-0.6B")
    assert bt.resolve_tokenizer_name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert bt.resolve_tokenizer_name(bt.BUNDLED_TOKENIZER_NAME, tokenizer_dir.parent) == str(tokenizer_dir)


def test_cli_builds_and_prints_path(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli-out"
    assert bt.main([str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "tokenizer.json").is_file()


# --------------------------------------------------------------------------- mock-engine words


def test_whole_word_token_ids(hf_tokenizer) -> None:
    ids = bt.whole_word_token_ids(hf_tokenizer, 300)
    assert len(ids) == 300
    assert ids == sorted(set(ids))
    assert ids == bt.whole_word_token_ids(hf_tokenizer, 300)
    assert ids[:50] == bt.whole_word_token_ids(hf_tokenizer, 50)
    assert all(i < bt.QWEN3_FIRST_ADDED_ID for i in ids)
    words = [hf_tokenizer.decode([i]) for i in ids]
    assert all(re.fullmatch(r" [a-z]+", w) for w in words)
    assert {" the", " and", " of"} <= set(words)
    assert hf_tokenizer.encode(" model")[0] in bt.whole_word_token_ids(hf_tokenizer, 5000)
    assert " th" not in words
    # Any sequence of them detokenises to readable text that re-encodes to the same ids.
    sequence = [ids[(7 * k) % len(ids)] for k in range(100)]
    assert hf_tokenizer.encode(hf_tokenizer.decode(sequence)) == sequence
    assert bt.whole_word_token_ids(hf_tokenizer, 0) == []
