"""Logprobs formatting for the OpenAI routes: engine logprob rows -> plain dicts and lists for msgspec.

:func:`token_text`, :func:`chat_logprobs_content`, :func:`completion_logprobs` and
:func:`prompt_logprobs_entries` follow vLLM 0.32's ``v1/engine/logprobs.py`` (per-token decoding with the
UTF-8 context correction ``_correct_decoded_token``) and its OpenAI layer
(``entrypoints/openai/chat_completion/serving.py`` ``_create_chat_logprobs`` / ``_get_top_logprobs``,
``entrypoints/openai/completion/serving.py`` ``_create_completion_logprobs``,
``entrypoints/generate/base/serving.py`` ``_get_decoded_token``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyfront.server.text.detokenizer import DetokenizerFactory, format_token_id, get_factory

LOGPROB_FLOOR = -9999.0
"""vLLM's OpenAI layer reports ``max(logprob, -9999.0)`` so that ``-inf`` stays JSON-serializable.
(NaN passes through ``max`` unchanged; msgspec, like pydantic, encodes it as ``null``.)"""


def token_text(tokenizer: Any, token_id: int, *, return_tokens_as_token_ids: bool = False) -> str:
    """One token's string as shown in logprobs (cached per tokenizer).

    ``"token_id:N"`` with ``return_tokens_as_token_ids``; otherwise ``decode([id])`` with
    SentencePiece leading spaces restored (vLLM ``convert_ids_list_to_tokens``). A partial UTF-8
    token gives U+FFFD here; in a generated sequence vLLM replaces that using the preceding tokens
    (see :meth:`DetokenizerFactory.decoded_token`, used by the two formatters below).
    """
    if return_tokens_as_token_ids:
        return format_token_id(token_id)
    return get_factory(tokenizer).token_text(token_id)


def _rows_of(logprobs: Any) -> Iterable[Sequence[Any]]:
    """Rows ``(ids, logprobs, ...)`` from a ``PlainLogprobs`` (columns) or an iterable of rows."""
    if hasattr(logprobs, "_fields") and hasattr(logprobs, "token_ids"):  # PlainLogprobs NamedTuple
        return zip(logprobs.token_ids, logprobs.logprobs, strict=True)
    return logprobs


def _position_tokens(
    factory: DetokenizerFactory, row_ids: Sequence[int], row_lps: Sequence[float], context: list[int]
) -> dict[int, tuple[float, str]]:
    """One position as vLLM's ``{token_id: Logprob}`` dict: insertion order of first occurrence,
    values of the last (duplicates collapse), decoded strings context-corrected; then the sampled
    id joins ``context``."""
    decoded_token = factory.decoded_token
    entries: dict[int, tuple[float, str]] = {}
    for tid, lp in zip(row_ids, row_lps, strict=False):
        entries[tid] = (lp, decoded_token(tid, context))
    context.append(row_ids[0])
    if len(context) > 4:
        del context[:-4]
    return entries


def chat_logprobs_content(
    tokenizer: Any,
    logprobs: Any,
    *,
    top_logprobs: int | None,
    return_tokens_as_token_ids: bool = False,
    return_all: bool = False,
    context: list[int] | None = None,
) -> list[dict[str, Any]]:
    """OpenAI chat ``choices[].logprobs.content`` entries, one per position.

    ``logprobs``: a ``PlainLogprobs`` or an iterable of rows ``(ids, logprobs, rank)`` where
    ``ids = [sampled, top1..topK]`` (the rank is not shown by the OpenAI formats). ``top_logprobs``
    is the request's ``top_logprobs`` (``-1`` = all); ``return_all`` mirrors vLLM's
    ``logprob_token_ids`` mode (every entry listed).

    ``context`` carries the last 4 sampled ids so partial-UTF-8 tokens are shown as vLLM shows them
    (``""`` while incomplete, the completed character on the completing token). Rows of one call
    always see the earlier rows of that call; when streaming deltas, pass the same list (start
    with ``[]``) on every call of a choice so context also crosses deltas.

    Matches vLLM's ``_create_chat_logprobs`` / ``_get_top_logprobs`` exactly, including two quirks:
    ``top_logprobs`` lists the first ``top_logprobs`` entries of the position dict, whose first
    entry is the *sampled* token (so an unlikely sampled token appears there and pushes out the
    K-th best), and the sampled entry's ``bytes`` are those of the decoded text even when
    ``token`` is ``"token_id:N"``.
    """
    factory = get_factory(tokenizer)
    ctx = [] if context is None else context
    as_ids = return_tokens_as_token_ids
    content: list[dict[str, Any]] = []
    floor = LOGPROB_FLOOR
    for row in _rows_of(logprobs):
        row_ids = row[0]
        entries = _position_tokens(factory, row_ids, row[1], ctx)
        sampled = row_ids[0]
        lp, decoded = entries[sampled]
        top: list[dict[str, Any]] = []
        for i, (tid, (tlp, tdec)) in enumerate(entries.items()):
            if not (return_all or top_logprobs == -1 or (top_logprobs is not None and i < top_logprobs)):
                break
            ttok = format_token_id(tid) if as_ids else tdec
            top.append({"token": ttok, "logprob": max(tlp, floor), "bytes": list(ttok.encode("utf-8", "replace"))})
        content.append(
            {
                "token": format_token_id(sampled) if as_ids else decoded,
                "logprob": max(lp, floor),
                "bytes": list(decoded.encode("utf-8", "replace")),
                "top_logprobs": top,
            }
        )
    return content


def completion_logprobs(
    tokenizer: Any,
    logprobs: Any,
    *,
    top_logprobs: int,
    initial_text_offset: int = 0,
    return_tokens_as_token_ids: bool = False,
    return_all: bool = False,
    context: list[int] | None = None,
    unscored_token_ids: Sequence[int] = (),
) -> dict[str, Any]:
    """Legacy completions ``choices[].logprobs``: ``{text_offset, token_logprobs, tokens, top_logprobs}``.

    ``top_logprobs`` is the request's ``logprobs`` integer. vLLM ``_create_completion_logprobs``:
    ``top_logprobs[i]`` is a dict keyed by token *string* holding the sampled token and the top
    ``top_logprobs`` (so up to ``top_logprobs + 1`` keys; tokens with equal strings collapse, the
    last value wins); ``text_offset`` advances by the length of each token string from
    ``initial_text_offset`` (streaming: pass :func:`next_text_offset` of the previous chunk — vLLM
    advances by the tokens reported, not by the text sent). ``unscored_token_ids``: leading
    positions without logprobs (the first prompt token when echoing prompt logprobs), shown as
    ``decode([id])`` with ``None`` logprob and ``None`` top dict. ``logprobs`` and ``context`` as in
    :func:`chat_logprobs_content`.
    """
    factory = get_factory(tokenizer)
    ctx = [] if context is None else context
    as_ids = return_tokens_as_token_ids
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    floor = LOGPROB_FLOOR
    offset = initial_text_offset
    for tid in unscored_token_ids:
        tok = format_token_id(tid) if as_ids else factory.decode([tid])
        tokens.append(tok)
        token_logprobs.append(None)
        tops.append(None)
        text_offset.append(offset)
        offset += len(tok)
    for row in _rows_of(logprobs):
        row_ids = row[0]
        entries = _position_tokens(factory, row_ids, row[1], ctx)
        sampled = row_ids[0]
        lp, decoded = entries[sampled]
        tok = format_token_id(sampled) if as_ids else decoded
        tokens.append(tok)
        token_logprobs.append(max(lp, floor))
        top: dict[str, float] = {}
        for i, (tid, (tlp, tdec)) in enumerate(entries.items()):
            if return_all or top_logprobs == -1 or top_logprobs >= i:
                top[format_token_id(tid) if as_ids else tdec] = max(tlp, floor)
        tops.append(top)
        text_offset.append(offset)
        offset += len(tok)
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": tops}


def prompt_logprobs_entries(tokenizer: Any, rows: Iterable[Sequence[Any]]) -> list[dict[int, dict[str, Any]] | None]:
    """The ``prompt_logprobs`` field of a response: vLLM's ``PromptLogprobs`` list as its OpenAI layer dumps it.

    ``rows``: ``(ids, logprobs, rank)`` per scored prompt position (positions 1..L-1; ``ids`` = the prompt
    token, then the top-k). Entry 0 is ``None`` (the first prompt token is never scored); entry i is
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` in vLLM's order: the prompt token first with its
    rank, then the top-k with ranks 1..k, a repeated id keeping its first place and its last value
    (``append_logprobs_for_next_position``). ``decoded_token`` is corrected with the preceding prompt
    tokens exactly as for sampled tokens (vLLM's ``_update_prompt_logprobs`` uses the same
    ``_verify_tokens``), and ``-inf`` becomes ``-9999.0`` (``clamp_prompt_logprobs``; other values pass).
    """
    factory = get_factory(tokenizer)
    context: list[int] = []
    out: list[dict[int, dict[str, Any]] | None] = [None]
    for row in rows:
        row_ids, row_lps, rank = row[0], row[1], row[2]
        entries = _position_tokens(factory, row_ids, row_lps, context)
        ranks: dict[int, int] = {}
        for i, tid in enumerate(row_ids):
            ranks[tid] = rank if i == 0 else i
        out.append(
            {
                tid: {"logprob": LOGPROB_FLOOR if lp == _NEG_INF else lp, "rank": ranks[tid], "decoded_token": dec}
                for tid, (lp, dec) in entries.items()
            }
        )
    return out


_NEG_INF = float("-inf")


def next_text_offset(completion_lp: dict[str, Any], current: int) -> int:
    """The ``initial_text_offset`` for the next streamed chunk (vLLM advances by the tokens reported,
    not by the text sent, since held-back text lags the tokens)."""
    tokens = completion_lp["tokens"]
    if not tokens:
        return current
    return completion_lp["text_offset"][-1] + len(tokens[-1])
