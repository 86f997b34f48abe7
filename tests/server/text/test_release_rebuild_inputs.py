"""The Python copies of the vocab and merges that transformers' model tokenizer classes keep are dropped, and nothing
the tokenizer does changes: the server's ``Tokenizer`` (released) against a fresh ``AutoTokenizer`` load of the same
files (kept), on both bundled tokenizers."""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest

from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name
from pyfront.server.text.tokenizer import REBUILD_INPUTS, Tokenizer, release_rebuild_inputs

ROOT = Path(__file__).resolve().parents[3]

SAMPLES = [
    "Hello, world! It's 2026-12-04.",
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "  leading and trailing whitespace \t\n\n",
    "日本語のテキスト、中文文本、한국어 텍스트",
    "emoji 👩‍👩‍👧 and combining e\u0301 marks",
    '<tool_call>\n{"name": "f", "arguments": {"x": [1, 2.5, null]}}\n</tool_call>',
    "<|im_end|><|endoftext|><|im_start|> no space<|im_end|>",
]


def _random_text(rng: random.Random) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz ABC\n\t0123456789.,;'\"<>|_-日本語é👍"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))


@pytest.fixture(scope="module", params=["pyfront/qwen3-tokenizer", "pyfront/qwen3.6-tokenizer"])
def pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, Any]:
    from transformers import AutoTokenizer

    ours = Tokenizer(request.param)
    theirs = AutoTokenizer.from_pretrained(resolve_tokenizer_name(request.param), local_files_only=True)
    return ours, theirs


def test_the_copies_are_gone_where_transformers_keeps_them(pair: tuple[Tokenizer, Any]) -> None:
    ours, theirs = pair
    kept = [name for name in REBUILD_INPUTS if name in vars(theirs)]
    assert not [name for name in REBUILD_INPUTS if name in vars(ours.hf)]
    if kept:  # Qwen2Tokenizer (the Qwen3 files) keeps both; the Qwen3.6 files load as TokenizersBackend
        assert ours.released.startswith("released "), ours.released
        assert all(len(vars(theirs)[name]) > 100_000 for name in kept)
    else:
        assert ours.released == "nothing to release"


def test_encode_decode_vocab_and_specials_are_unchanged(pair: tuple[Tokenizer, Any]) -> None:
    ours, theirs = pair
    hf = ours.hf
    rng = random.Random(19)
    texts = SAMPLES + [_random_text(rng) for _ in range(300)]
    for text in texts:
        for special in (True, False):
            assert hf.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)
        assert ours.segments.encode(text) == theirs.encode(text, add_special_tokens=False)
    ids = list(range(len(theirs)))
    assert hf.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    for _ in range(100):
        sample = rng.sample(ids, 40)
        for skip in (True, False):
            assert hf.decode(sample, skip_special_tokens=skip) == theirs.decode(sample, skip_special_tokens=skip)
    assert hf.get_vocab() == theirs.get_vocab()
    assert len(hf) == len(theirs) and hf.vocab_size == theirs.vocab_size
    assert hf.special_tokens_map == theirs.special_tokens_map
    assert hf.all_special_ids == theirs.all_special_ids
    assert {i: str(t) for i, t in hf.added_tokens_decoder.items()} == {
        i: str(t) for i, t in theirs.added_tokens_decoder.items()
    }
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "2+2?"},
    ]
    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.render_chat(messages) == expected


class _Kept:
    """A tokenizer class whose methods read the copies later (as WhisperTokenizer.save_vocabulary does)."""

    def __init__(self) -> None:
        self._vocab = {"a": 0}
        self._merges = [("a", "b")]


class _ReadsInMethod(_Kept):
    def lookup(self, token: str) -> int:
        return self._vocab[token]


class _ReadsThroughGetattr(_Kept):
    def merges(self) -> list[tuple[str, str]]:
        return getattr(self, "_merges")  # noqa: B009 (the string form is what the check must also see)


class _ReadsInProperty(_Kept):
    @property
    def size(self) -> int:
        return len(self._vocab)


class _ReadsInNestedFunction(_Kept):
    def later(self) -> Any:
        def inner() -> int:
            return len(self._merges)

        return inner


class _OnlyInit(_Kept):
    def encode(self, text: str) -> list[int]:
        return [len(text)]


@pytest.mark.parametrize("cls", [_ReadsInMethod, _ReadsThroughGetattr, _ReadsInProperty, _ReadsInNestedFunction])
def test_a_class_that_reads_them_later_keeps_them(cls: type[_Kept]) -> None:
    tok = cls()
    reason = release_rebuild_inputs(tok)
    assert reason.startswith("kept "), reason
    assert cls.__name__ in reason
    assert vars(tok).keys() >= {"_vocab", "_merges"}


def test_a_class_that_reads_them_only_in_init_releases_them() -> None:
    tok = _OnlyInit()
    assert release_rebuild_inputs(tok) == "released _vocab (1 entries), _merges (1 entries)"
    assert not vars(tok)
    assert release_rebuild_inputs(tok) == "nothing to release"


def test_pyfront_never_reads_them() -> None:
    """The release is exact only because no code of ours reads the copies either (the tokenizer module names them
    to drop them)."""
    readers = []
    for package in ("server", "engine_client", "hashing"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "server" / "text" / "tokenizer.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr in REBUILD_INPUTS) or (
                    isinstance(node, ast.Constant) and node.value in REBUILD_INPUTS
                ):
                    readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, readers
