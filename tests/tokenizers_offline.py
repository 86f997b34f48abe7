"""Small tokenizers of other families, trained offline in a second or less (no hub access in tests).

``build_tokenizer(style)`` returns a ``PreTrainedTokenizerFast`` trained with the ``tokenizers`` library on a small
built-in corpus. Styles:

* ``"llama2"``: SentencePiece-BPE as converted by transformers for Llama 2 (legacy): normalizer
  ``Prepend("▁")`` + ``Replace(" ", "▁")``, no pre-tokenizer, byte fallback (``<0x00>``..``<0xFF>`` in the model
  vocabulary), ``<unk>``/``<s>``/``</s>`` and ``[INST]``/``[/INST]`` special tokens, plus a *normalized* added
  token and two added tokens one of which is a prefix of the other;
* ``"mistral"``: the same model with no normalizer and a ``Metaspace(prepend_scheme="first", split=False)``
  pre-tokenizer (Mistral/Llama non-legacy): the ``▁`` goes only before the very first piece of the input;
* ``"phi3"``: the Llama-2 pipeline with Phi-3-style chat tokens that have ``rstrip`` (and one ``lstrip``) set;
* ``"unigram"``: a Unigram model with ``NFKC`` + ``Lowercase`` normalization and ``Metaspace(prepend_scheme="always")``
  (T5/XLNet-like);
* ``"single_word"``: ``llama2`` plus a ``single_word`` added token (unsupported by the segment cache).

``render_chat(style, messages)`` renders a conversation in that family's chat format.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

STYLES = ("llama2", "mistral", "phi3", "unigram")


def _split_words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_WORDS = _split_words(
    "the of and to in is that for it as with was on be by this are from at or an have not which but "
    "all they were can there been one more has their if will would other its so what about when into "
    "some them only time these may could then than first any new very two like over such our most "
    "after also made used must system request model token server client message response stream cache "
    "segment memory thread prompt function argument result value error return python tokenizer encode "
    "decode text unicode string number agent tool call history conversation turn assistant user "
    "thinking answer question because however"
)

_EXTRA_LINES = (
    "Hello, world! How are you today? I'm fine, thanks.",
    "def encode(text: str) -> list[int]:\n    return tokenizer(text)['input_ids']",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159",
    "日本語のテキストと中文文本，还有한국어 문장.",  # noqa: RUF001
    "Café, naïve, résumé, Ångström, façade, São Paulo, Zürich.",
    "Emoji 😀 🚀 👩‍💻 and symbols © ® ™ € £ ¥ § ¶ •",
)


def _corpus() -> list[str]:
    # Deterministic pseudo-English: a linear congruential walk over the word list.
    lines = list(_EXTRA_LINES) * 20
    state = 12345
    for _ in range(1500):
        words = []
        for _ in range(12):
            state = (state * 1103515245 + 12345) % (2**31)
            words.append(_WORDS[state % len(_WORDS)])
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + ".")
    return lines


def _train_bpe() -> tuple[dict[str, int], list[Any]]:
    """A small SentencePiece-style BPE vocabulary: specials, 256 byte tokens, then the trained pieces."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False, special_tokens=[])
    trainer_tok.train_from_iterator(_corpus(), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    return vocab, trained["merges"]


def _sentencepiece_bpe() -> Tokenizer:
    vocab, merges = _train_bpe()
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))


def _sp_decoder() -> decoders.Decoder:
    return decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )


def _llama_specials(tok: Tokenizer) -> None:
    tok.add_special_tokens(
        [
            AddedToken("<unk>", special=True, normalized=False),
            AddedToken("<s>", special=True, normalized=False),
            AddedToken("</s>", special=True, normalized=False),
            AddedToken("[INST]", special=True, normalized=False),
            AddedToken("[/INST]", special=True, normalized=False),
        ]
    )


@cache
def _build_backend(style: str) -> str:
    if style == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        trainer = trainers.UnigramTrainer(
            vocab_size=800, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False
        )
        tok.train_from_iterator(_corpus(), trainer=trainer)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.add_special_tokens(
            [
                AddedToken("<s>", special=True, normalized=False),
                AddedToken("</s>", special=True, normalized=False),
                AddedToken("<|user|>", special=True, normalized=False),
                AddedToken("<|assistant|>", special=True, normalized=False),
            ]
        )
        tok.add_tokens([AddedToken("<tool>", normalized=True), AddedToken("</tool>", normalized=True)])
        return tok.to_str()

    tok = _sentencepiece_bpe()
    tok.decoder = _sp_decoder()
    if style in ("llama2", "phi3", "single_word"):
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    elif style == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False), decoders.ByteFallback()]
        )
    else:
        raise ValueError(f"unknown tokenizer style {style!r}")
    _llama_specials(tok)
    if style == "phi3":
        tok.add_special_tokens(
            [
                AddedToken("<|user|>", special=True, normalized=False, rstrip=True),
                AddedToken("<|assistant|>", special=True, normalized=False, rstrip=True),
                AddedToken("<|end|>", special=True, normalized=False, rstrip=True),
                AddedToken("<|system|>", special=True, normalized=False, lstrip=True, rstrip=True),
            ]
        )
    # A non-special *normalized* added token (matched after normalization, inside a piece) and a plain one.
    # "<tool>" is a prefix of "<tool>>": the longest match must win.
    tok.add_tokens(
        [
            AddedToken("[TOOL_CALLS]", normalized=True),
            AddedToken("<tool>", normalized=False),
            AddedToken("<tool>>", normalized=False),
        ]
    )
    if style == "single_word":
        tok.add_tokens([AddedToken("<mask>", normalized=False, single_word=True)])
    return tok.to_str()


def build_backend(style: str) -> Tokenizer:
    """A fresh ``tokenizers.Tokenizer`` of the given style (trained once per process)."""
    return Tokenizer.from_str(_build_backend(style))


def build_tokenizer(style: str) -> Any:
    """A fresh transformers fast tokenizer of the given style."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_backend(style), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def render_chat(style: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
    """A conversation in the chat format of ``style`` (Llama-2/Mistral ``[INST]`` or Phi-3 ``<|user|>``)."""
    if style in ("phi3", "unigram"):
        out = []
        for message in messages:
            role = message["role"]
            marker = "<|user|>" if role in ("user", "tool") else "<|assistant|>"
            if role == "system":
                marker = "<|system|>" if style == "phi3" else "<|user|>"
            body = message.get("content") or ""
            if role == "tool":
                body = f"<tool>{body}</tool>"
            end = "<|end|>" if style == "phi3" else "</s>"
            out.append(f"{marker}\n{body}{end}\n")
        if add_generation_prompt:
            out.append("<|assistant|>\n")
        return "".join(out)
    out = ["<s>"]
    for message in messages:
        body = message.get("content") or ""
        if message["role"] == "assistant":
            calls = message.get("tool_calls")
            if calls:
                body += "[TOOL_CALLS] " + json.dumps([c["function"] for c in calls], ensure_ascii=False)
            out.append(f" {body}</s>")
        elif message["role"] == "tool":
            out.append(f"[INST] <tool>{body}</tool> [/INST]")
        else:
            out.append(f"[INST] {body} [/INST]")
    return "".join(out)
