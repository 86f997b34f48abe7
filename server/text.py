"""The text layer: engine token ids -> OpenAI text, one instance per choice.

This is the hot streaming path (one call per engine output, usually one new token), so every
per-token step is a handful of attribute look-ups plus one call into the Rust ``DecodeStream``.
Nothing here re-decodes the whole text or primes with the whole prompt.

Pieces, all modelled on vLLM 0.32 (paths relative to the ``vllm`` package):

* :class:`IncrementalDetokenizer` — token ids -> text deltas that never split a UTF-8 character.
  Fast path = ``v1/engine/detokenizer.py`` ``FastIncrementalDetokenizer`` (``tokenizers``'
  ``DecodeStream``, including its recovery from "Invalid prefix" errors and its
  ``spaces_between_special_tokens=False`` handling); slow path = ``SlowIncrementalDetokenizer``
  / ``tokenizers/detokenizer_utils.py`` ``detokenize_incrementally`` for tokenizers without a
  ``tokenizers.Tokenizer`` backend. The right one is chosen automatically.
* :class:`TextStream` — detokenization + stop strings + hold-back, i.e. vLLM's
  ``BaseIncrementalDetokenizer.update`` / ``check_stop_strings`` / ``get_next_output_text`` and
  the token trimming of ``v1/engine/output_processor.py`` ``_trim_surplus_tokens``.
* Logprobs formatting — :func:`token_text`, :func:`chat_logprobs_content`,
  :func:`completion_logprobs`: ``v1/engine/logprobs.py`` (per-token decoding with the UTF-8
  context correction ``_correct_decoded_token``) and the OpenAI layer
  (``entrypoints/openai/chat_completion/serving.py`` ``_create_chat_logprobs`` /
  ``_get_top_logprobs``, ``entrypoints/openai/completion/serving.py``
  ``_create_completion_logprobs``, ``entrypoints/generate/base/serving.py``
  ``_get_decoded_token``), producing plain dicts/lists for msgspec.

Per-tokenizer data (backend handle, added-token table, per-token text caches) lives in one
:class:`DetokenizerFactory` per tokenizer (:func:`get_factory` caches them); every per-choice
object accepts either a tokenizer or a factory.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

try:  # tokenizers >= 0.21
    from tokenizers import Tokenizer as _BackendTokenizer
    from tokenizers.decoders import DecodeStream as _DecodeStream
except ImportError:  # pragma: no cover - exercised only without a recent `tokenizers`
    _DecodeStream = None
    try:
        from tokenizers import Tokenizer as _BackendTokenizer
    except ImportError:
        _BackendTokenizer = None

__all__ = [
    "LOGPROB_FLOOR",
    "PROMPT_TAIL_TOKENS",
    "DetokenizerFactory",
    "FastIncrementalDetokenizer",
    "IncrementalDetokenizer",
    "SlowIncrementalDetokenizer",
    "TextStream",
    "chat_logprobs_content",
    "completion_logprobs",
    "format_token_id",
    "get_factory",
    "next_text_offset",
    "prompt_logprobs_entries",
    "token_text",
]

log = logging.getLogger(__name__)

PROMPT_TAIL_TOKENS = 8
"""How many trailing prompt ids to pass as ``prompt_tail``. vLLM primes ``DecodeStream`` with the
whole prompt and its slow path uses the last 7 (``INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 2``);
only the last few matter (SentencePiece leading spaces, a prompt ending inside a UTF-8 character)."""

LOGPROB_FLOOR = -9999.0
"""vLLM's OpenAI layer reports ``max(logprob, -9999.0)`` so that ``-inf`` stays JSON-serializable.
(NaN passes through ``max`` unchanged; msgspec, like pydantic, encodes it as ``null``.)"""

_INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"  # tokenizers' DecodeStream error text
_REPLACEMENT = "\ufffd"
_NO_MARKER = object()


def format_token_id(token_id: int) -> str:
    """``return_tokens_as_token_ids`` form (vLLM ``format_token_id_placeholder``)."""
    return f"token_id:{token_id}"


# --------------------------------------------------------------------------------------
# Per-tokenizer shared data
# --------------------------------------------------------------------------------------


def _backend_of(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` (or ``tokenizer`` itself), else None."""
    if _BackendTokenizer is None:
        return None
    if isinstance(tokenizer, _BackendTokenizer):
        return tokenizer
    for attr in ("_tokenizer", "backend_tokenizer"):
        backend = getattr(tokenizer, attr, None)
        if isinstance(backend, _BackendTokenizer):
            return backend
    return None


class DetokenizerFactory:
    """Everything about one tokenizer that every choice shares; build once, reuse everywhere.

    ``mode``: ``"auto"`` uses ``DecodeStream`` when the tokenizer has a ``tokenizers`` backend
    (vLLM's ``uses_fast_detokenizer``) and the slow pure-Python path otherwise; ``"fast"`` /
    ``"slow"`` force one (``"fast"`` raises if impossible).
    """

    def __init__(self, tokenizer: Any, *, mode: Literal["auto", "fast", "slow"] = "auto") -> None:
        self.tokenizer = tokenizer
        self.backend = _backend_of(tokenizer)
        # A bare tokenizers.Tokenizer has no HF-level decode(); its own decode() skips specials by
        # default, whereas vLLM's per-token decode calls HF decode() (skip_special_tokens=False).
        self._bare_backend = self.backend is not None and self.backend is tokenizer
        can_fast = self.backend is not None and _DecodeStream is not None
        if mode == "fast" and not can_fast:
            raise ValueError("the fast detokenizer needs a tokenizers.Tokenizer backend and DecodeStream")
        if mode == "slow" and self._bare_backend:
            raise ValueError("the slow detokenizer needs a transformers tokenizer")
        self.fast = can_fast and mode != "slow"
        self._added_token_ids: dict[int, str] | None = None
        self._slow_info: tuple[frozenset[str], frozenset[str]] | None = None
        self._raw_text: dict[int, str] = {}
        self._shown_text: dict[int, str] = {}
        self._marker: Any = _NO_MARKER
        self._correct_cached = lru_cache(maxsize=16384)(self._correct_uncached)

    # -- detokenizers -------------------------------------------------------------------

    def detokenizer(
        self,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        prompt_tail: Sequence[int] = (),
    ) -> IncrementalDetokenizer:
        """A new per-choice :class:`IncrementalDetokenizer` (fast or slow per ``self.fast``)."""
        cls = FastIncrementalDetokenizer if self.fast else SlowIncrementalDetokenizer
        return cls(
            self,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
            prompt_tail=prompt_tail,
        )

    @property
    def added_token_ids(self) -> dict[int, str]:
        """id -> content of every added token (vLLM builds the same map for the fast path)."""
        table = self._added_token_ids
        if table is None:
            if self.backend is not None:
                decoder = self.backend.get_added_tokens_decoder()
            else:
                decoder = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
            table = {int(tid): getattr(tok, "content", str(tok)) for tid, tok in decoder.items()}
            self._added_token_ids = table
        return table

    def slow_info(self) -> tuple[frozenset[str], frozenset[str]]:
        """(added vocab, all special tokens) for the slow path, computed once."""
        info = self._slow_info
        if info is None:
            tok = self.tokenizer
            info = (frozenset(tok.get_added_vocab()), frozenset(tok.all_special_tokens))
            self._slow_info = info
        return info

    # -- whole-sequence decoding (HF semantics) ------------------------------------------

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """``tokenizer.decode(ids)`` with HF's default ``skip_special_tokens=False``."""
        if self._bare_backend:
            return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    # -- per-token strings for logprobs --------------------------------------------------

    def raw_token_text(self, token_id: int) -> str:
        """``tokenizer.decode([token_id])`` (cached): U+FFFD for partial UTF-8 tokens."""
        text = self._raw_text.get(token_id)
        if text is None:
            text = self.decode([token_id]) or ""
            self._raw_text[token_id] = text
        return text

    def token_text(self, token_id: int) -> str:
        """One token's string as vLLM's ``convert_ids_list_to_tokens`` gives it (cached).

        ``decode([id])``, plus the leading spaces that decode() strips from a SentencePiece
        (Metaspace) piece restored, as vLLM does.
        """
        text = self._shown_text.get(token_id)
        if text is None:
            text = self.raw_token_text(token_id)
            marker = self.space_marker
            if marker is not None:
                raw = self._convert_id_to_piece(token_id)
                if raw:
                    text = _restore_leading_spaces(raw, text, marker)
            self._shown_text[token_id] = text
        return text

    def _convert_id_to_piece(self, token_id: int) -> str | None:
        if self.backend is not None:
            return self.backend.id_to_token(token_id)
        return self.tokenizer.convert_ids_to_tokens([token_id])[0]

    @property
    def space_marker(self) -> str | None:
        """The Metaspace replacement character if the pre-tokenizer uses one (vLLM
        ``get_leading_space_marker``), else None."""
        marker = self._marker
        if marker is _NO_MARKER:
            marker = None
            pre = getattr(self.backend, "pre_tokenizer", None) if self.backend is not None else None
            if pre is not None:
                try:
                    config = json.loads(pre.__getstate__())
                except Exception:
                    config = {}
                if config.get("type") == "Metaspace":
                    marker = config.get("replacement", "\u2581")
                elif config.get("type") == "Sequence":
                    for sub in config.get("pretokenizers", []):
                        if sub.get("type") == "Metaspace":
                            marker = sub.get("replacement", "\u2581")
                            break
            self._marker = marker
        return marker

    def decoded_token(self, token_id: int, context: Sequence[int]) -> str:
        """The string vLLM stores as ``Logprob.decoded_token`` for ``token_id`` at a position whose
        preceding sampled tokens are ``context`` (oldest first; only the last 4 matter).

        Equals :meth:`token_text` unless that ends with U+FFFD (a partial UTF-8 token); then vLLM's
        ``LogprobsProcessor._correct_decoded_token`` re-decodes it with 1..4 context tokens: the
        completed character(s) if the token completes one, else ``""``.
        """
        text = self.token_text(token_id)
        if not text.endswith(_REPLACEMENT):
            return text
        if not context:
            return ""
        return self._correct_cached(tuple(context[-4:]), token_id)

    def _correct_uncached(self, context: tuple[int, ...], token_id: int) -> str:
        decode = self.decode
        for num_ctx in range(1, len(context) + 1):
            ctx = list(context[-num_ctx:])
            full = decode([*ctx, token_id])
            if full.endswith(_REPLACEMENT):
                continue
            # Byte-fallback context tokens were shown as "" when sampled, so their text belongs to
            # this completing token: only the clean prefix before them is removed.
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if self.raw_token_text(ctx[j]).endswith(_REPLACEMENT):
                    clean_end = j
                else:
                    break
            clean_prefix = decode(ctx[:clean_end]) if clean_end > 0 else ""
            if full.startswith(clean_prefix):
                return full[len(clean_prefix) :]
            common = 0
            for a, b in zip(clean_prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def _restore_leading_spaces(raw_token: str, token_str: str, marker: str) -> str:
    """vLLM ``_restore_leading_spaces``: put back leading spaces decode() stripped."""
    num_markers = len(raw_token) - len(raw_token.lstrip(marker))
    if num_markers == 0:
        return token_str
    missing = num_markers - (len(token_str) - len(token_str.lstrip(" ")))
    return " " * missing + token_str if missing > 0 else token_str


_FACTORIES: dict[int, tuple[Any, DetokenizerFactory]] = {}
_FACTORIES_LOCK = threading.Lock()


def get_factory(tokenizer: Any) -> DetokenizerFactory:
    """The shared :class:`DetokenizerFactory` of ``tokenizer`` (``tokenizer`` itself if it is one)."""
    if isinstance(tokenizer, DetokenizerFactory):
        return tokenizer
    entry = _FACTORIES.get(id(tokenizer))
    if entry is not None and entry[0] is tokenizer:
        return entry[1]
    with _FACTORIES_LOCK:
        entry = _FACTORIES.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = (tokenizer, DetokenizerFactory(tokenizer))
            _FACTORIES[id(tokenizer)] = entry  # keeps the tokenizer alive: ids cannot be reused
        return entry[1]


# --------------------------------------------------------------------------------------
# Incremental detokenizers
# --------------------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Token ids -> text deltas for one choice.

    ``IncrementalDetokenizer(tokenizer_or_factory, ...)`` returns a
    :class:`FastIncrementalDetokenizer` (``DecodeStream``) or a :class:`SlowIncrementalDetokenizer`
    as appropriate. ``push(id)`` returns the newly completed text (often ``""``), never a split
    UTF-8 character; ``flush()`` (once, at the very end) returns the still-pending text, with
    U+FFFD for bytes that never completed, as ``tokenizer.decode`` would show them.

    ``prompt_tail``: the last few prompt ids (see :data:`PROMPT_TAIL_TOKENS`), decoded only as
    context, never output.
    """

    __slots__ = ()

    def __new__(cls, tokenizer: Any = None, **kwargs: Any) -> IncrementalDetokenizer:
        if cls is IncrementalDetokenizer:
            cls = FastIncrementalDetokenizer if get_factory(tokenizer).fast else SlowIncrementalDetokenizer
        return object.__new__(cls)

    def push(self, token_id: int) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def push_many(self, token_ids: Iterable[int]) -> str:
        push = self.push
        return "".join([push(t) for t in token_ids])

    def flush(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


class FastIncrementalDetokenizer(IncrementalDetokenizer):
    """``tokenizers.decoders.DecodeStream`` based (vLLM ``FastIncrementalDetokenizer``)."""

    __slots__ = (
        "_added",
        "_backend",
        "_factory",
        "_flushed",
        "_last",
        "_last_special",
        "_pending",
        "_skip",
        "_step",
        "_stream",
        "push",
    )

    def __init__(
        self,
        tokenizer: Any,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        prompt_tail: Sequence[int] = (),
    ) -> None:
        factory = get_factory(tokenizer)
        if factory.backend is None or _DecodeStream is None:
            raise ValueError("FastIncrementalDetokenizer needs a tokenizers.Tokenizer backend and DecodeStream")
        self._factory = factory
        self._backend = factory.backend
        self._skip = skip_special_tokens
        tail = [int(t) for t in prompt_tail]
        # vLLM primes the stream with the whole prompt (native prefill); the tail is enough.
        self._stream = _DecodeStream(ids=tail, skip_special_tokens=skip_special_tokens)
        self._step = self._stream.step
        self._pending: list[int] = []  # ids since the last step that produced text (for flush)
        self._last: int | None = tail[-1] if tail else None  # last id that produced text (flush context)
        self._flushed = False
        self._last_special = False
        self._added: dict[int, str] | None = None
        # vLLM: spaces_between_special_tokens = skip_special_tokens or spaces_between_special_tokens
        if not (skip_special_tokens or spaces_between_special_tokens):
            added = factory.added_token_ids
            if added:
                self._added = added
        # Bind the specialised hot path as an instance attribute (no per-call branching).
        self.push = self._push_plain if self._added is None else self._push_no_special_spaces

    def _push_plain(self, token_id: int) -> str:
        try:
            text = self._step(self._backend, token_id)
        except Exception as exc:
            text = self._recover(token_id, exc)
        if text is None:
            self._pending.append(token_id)
            return ""
        if self._pending:
            self._pending.clear()
        self._last = token_id
        return text

    def _push_no_special_spaces(self, token_id: int) -> str:
        # vLLM FastIncrementalDetokenizer.decode_next with spaces_between_special_tokens=False:
        # an added token right after another added token is emitted as its raw content.
        text = self._push_plain(token_id)
        special = self._added.get(token_id)
        if special is not None and self._last_special:
            text = special
        self._last_special = special is not None
        return text

    def _recover(self, token_id: int, exc: Exception) -> str | None:
        if isinstance(exc, (OverflowError, TypeError)):
            # vLLM logs and treats an invalid token id as producing no text (vllm issue 21951).
            log.warning("detokenizer: invalid token id %r", token_id)
            return None
        if not str(exc).startswith(_INVALID_PREFIX_ERR_MSG):
            raise exc
        # Non-monotonic UTF-8 output broke DecodeStream's state (vllm issue 17448): restart it.
        log.warning("detokenizer: invalid prefix, resetting the decode stream")
        self._stream = _DecodeStream(skip_special_tokens=self._skip)
        self._step = self._stream.step
        self._pending.clear()
        self._last = None
        return self._step(self._backend, token_id)

    def flush(self) -> str:
        """Pending text (decoded with U+FFFD for incomplete bytes); call once, at the end."""
        if self._flushed or not self._pending:
            self._flushed = True
            return ""
        self._flushed = True
        decode = self._backend.decode  # what DecodeStream itself uses (no HF clean-up)
        ctx = [] if self._last is None else [self._last]
        full = decode([*ctx, *self._pending], skip_special_tokens=self._skip)
        prefix = decode(ctx, skip_special_tokens=self._skip) if ctx else ""
        self._pending.clear()
        if full.startswith(prefix):
            return full[len(prefix) :]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]


class SlowIncrementalDetokenizer(IncrementalDetokenizer):
    """Pure-Python incremental detokenization (vLLM ``SlowIncrementalDetokenizer`` /
    ``detokenize_incrementally``) for tokenizers without a ``tokenizers`` backend."""

    __slots__ = (
        "_added_vocab",
        "_factory",
        "_flushed",
        "_len",
        "_prefix_offset",
        "_read_offset",
        "_skip",
        "_spaces",
        "_special",
        "_tok",
        "_tokens",
        "_use_plain",
    )

    # vLLM INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET
    _OFFSET = 5

    def __init__(
        self,
        tokenizer: Any,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        prompt_tail: Sequence[int] = (),
    ) -> None:
        factory = get_factory(tokenizer)
        tok = factory.tokenizer
        if factory._bare_backend:
            raise ValueError("SlowIncrementalDetokenizer needs a transformers tokenizer")
        self._factory = factory
        self._tok = tok
        self._skip = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self._len = len(tok)
        self._flushed = False
        # convert_prompt_ids_to_tokens: only the last OFFSET + 2 prompt ids matter.
        tail = [int(t) for t in prompt_tail][-self._OFFSET - 2 :]
        tokens = tok.convert_ids_to_tokens(tail, skip_special_tokens=skip_special_tokens) if tail else []
        self._tokens: list[str] = [t if t is not None else "" for t in tokens]
        self._read_offset = len(self._tokens)
        self._prefix_offset = max(self._read_offset - self._OFFSET, 0)
        added_vocab, special = factory.slow_info()
        self._use_plain = bool(getattr(tok, "is_fast", False)) or not added_vocab
        self._added_vocab = added_vocab
        self._special = special if skip_special_tokens else frozenset()

    def _to_string(self, tokens: list[str]) -> str:
        if self._use_plain:
            return self._tok.convert_tokens_to_string(tokens)
        # vLLM _convert_tokens_to_string_with_added_encoders
        convert = self._tok.convert_tokens_to_string
        sub_texts: list[str] = []
        current: list[str] = []
        for token in tokens:
            if token in self._special:
                continue
            if token in self._added_vocab:
                if current:
                    sub_texts.append(convert(current))
                    current = []
                sub_texts.append(token)
            else:
                current.append(token)
        if current:
            sub_texts.append(convert(current))
        return (" " if self._spaces else "").join(sub_texts)

    def push(self, token_id: int) -> str:
        if 0 <= token_id < self._len:
            new = self._tok.convert_ids_to_tokens([token_id], skip_special_tokens=self._skip)
            new = [new] if isinstance(new, str) else [t if t is not None else "" for t in new]
        else:
            new = [""]
        tokens = self._tokens
        tokens.extend(new)
        prefix_offset, read_offset = self._prefix_offset, self._read_offset
        prefix_text = self._to_string(tokens[prefix_offset:read_offset])
        new_text = self._to_string(tokens[prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            # Possibly an unfinished byte sequence (byte fallback): wait for more tokens.
            return ""
        self._prefix_offset = read_offset
        self._read_offset = len(tokens)
        if read_offset > 64:  # keep the token list short on long generations
            del tokens[:read_offset]
            self._prefix_offset = 0
            self._read_offset -= read_offset
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        if self._flushed:
            return ""
        self._flushed = True
        tokens = self._tokens
        if self._read_offset >= len(tokens):
            return ""
        prefix_text = self._to_string(tokens[self._prefix_offset : self._read_offset])
        new_text = self._to_string(tokens[self._prefix_offset :])
        self._read_offset = len(tokens)
        return new_text[len(prefix_text) :] if new_text.startswith(prefix_text) else new_text


# --------------------------------------------------------------------------------------
# TextStream: detokenization + stop strings for one choice
# --------------------------------------------------------------------------------------


class TextStream:
    """One choice's text: incremental detokenization, stop strings, hold-back (vLLM semantics).

    ``tokenizer``: a tokenizer, a :class:`DetokenizerFactory` (preferred: shared by all choices),
    or a ready :class:`IncrementalDetokenizer` (then the detokenization options are its own).
    ``prompt_tail``: the last :data:`PROMPT_TAIL_TOKENS` prompt ids (context only, never output).

    ``add(new_token_ids, finished_by_engine=..., stop_token_finished=...)`` returns the text
    delta that may be sent now. ``finished_by_engine``: the engine output carried a
    finish_reason (any); ``stop_token_finished``: that finish_reason is STOP, i.e. EOS or a
    ``stop_token_ids`` entry (implies ``finished_by_engine``). ``finish()`` ends the stream
    without new tokens (e.g. client abort) and returns whatever was held back.

    Behaviour (vLLM 0.32 ``v1/engine/detokenizer.py`` ``BaseIncrementalDetokenizer``):

    * Stop strings are searched only once more than ``min_tokens`` tokens exist, in the text of
      the tokens past the ``min_tokens`` boundary plus ``len(stop) - 1`` earlier characters (so
      matches spanning tokens are found). The match completing earliest wins; ties go to the
      earlier entry of ``stop``.
    * On a match: text is cut before the stop string (after it with
      ``include_stop_str_in_output``), tokens after the one completing it are dropped,
      ``stopped=True``, ``stop_reason`` = the string; the caller must ABORT the engine request.
    * While running, ``max(len(s) for s in stop) - 1`` characters are held back when stop strings
      exist and ``include_stop_str_in_output`` is false (vLLM ``stop_buffer_length``); they are
      released when the request finishes.
    * ``stop_token_finished``: the last token (EOS / stop token) is not detokenized unless
      ``include_stop_str_in_output``, but it *is* kept in ``token_ids`` and counted in
      ``num_tokens``. vLLM does the same: ``update()`` re-appends the skipped id to
      ``token_ids`` and the OpenAI layer sums ``len(output.token_ids)``, so ``usage.
      completion_tokens`` includes the EOS/stop token while the text does not show it.
    * ``num_tokens`` / ``token_ids`` are the kept tokens (after stop-string trimming) — use them
      for ``completion_tokens``; ``num_new_tokens`` says how many ids of the last ``add`` were
      kept (slice logprobs rows with it, as vLLM's ``_trim_surplus_tokens`` does).
    * Bytes of a never-completed UTF-8 character at the end are dropped, as vLLM does
      (``DecodeStream`` never yields them); ``flush_partial_utf8=True`` emits them as U+FFFD
      instead, like ``tokenizer.decode`` of the whole sequence.
    """

    __slots__ = (
        "_buffer_len",
        "_detok",
        "_done",
        "_emitted",
        "_flush_partial",
        "_include",
        "_max_stop_len",
        "_min_tokens",
        "_pieces",
        "_push",
        "_stop_items",
        "_stops",
        "_tail",
        "_tail_start",
        "num_new_tokens",
        "stop_reason",
        "stopped",
        "token_ids",
    )

    def __init__(
        self,
        tokenizer: Any,
        stop: Sequence[str] | str | None = (),
        *,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        min_tokens: int = 0,
        prompt_tail: Sequence[int] = (),
        flush_partial_utf8: bool = False,
    ) -> None:
        if isinstance(tokenizer, IncrementalDetokenizer):
            detok = tokenizer
        else:
            detok = get_factory(tokenizer).detokenizer(
                skip_special_tokens=skip_special_tokens,
                spaces_between_special_tokens=spaces_between_special_tokens,
                prompt_tail=prompt_tail,
            )
        self._detok = detok
        self._push = detok.push
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        else:
            stops = tuple(stop)
        if any(not s for s in stops):
            raise ValueError("stop cannot contain an empty string.")
        self._stops = stops
        self._stop_items = tuple((st, len(st) - 1) for st in stops)
        self._include = include_stop_str_in_output
        self._min_tokens = min_tokens
        self._max_stop_len = max((len(s) for s in stops), default=0)
        self._buffer_len = self._max_stop_len - 1 if stops and not include_stop_str_in_output else 0
        self._flush_partial = flush_partial_utf8
        self.token_ids: list[int] = []
        self._pieces: list[str] = []  # emitted deltas; ``text`` joins them lazily
        # With stop strings: ``_tail`` is the output text from absolute offset ``_tail_start``
        # on; it covers everything not yet emitted plus max_stop_len - 1 characters of context.
        self._tail = ""
        self._tail_start = 0
        self._emitted = 0
        self._done = False
        self.stopped = False
        self.stop_reason: str | None = None
        self.num_new_tokens = 0

    # -- read-only views ----------------------------------------------------------------

    @property
    def text(self) -> str:
        """All text emitted so far (the concatenation of the returned deltas)."""
        pieces = self._pieces
        if len(pieces) > 1:
            joined = "".join(pieces)
            pieces[:] = [joined]
            return joined
        return pieces[0] if pieces else ""

    @property
    def num_tokens(self) -> int:
        """Kept tokens, i.e. ``usage.completion_tokens`` for this choice."""
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self._done

    # -- the hot path ---------------------------------------------------------------------

    def add(
        self,
        token_ids: Sequence[int],
        *,
        finished_by_engine: bool = False,
        stop_token_finished: bool = False,
    ) -> str:
        if self._done:
            self.num_new_tokens = 0
            return ""
        finished = finished_by_engine or stop_token_finished
        n = len(token_ids)
        self.num_new_tokens = n
        if self._stops:
            if n != 1 or finished:
                return self._add_with_stops(token_ids, n, finished, stop_token_finished)
            # Hot path: one token, request still running.
            tid = token_ids[0]
            ids = self.token_ids
            ids.append(tid)
            piece = self._push(tid)
            if not piece:
                return ""
            tail = self._tail
            s = tail + piece
            if len(ids) > self._min_tokens:
                check_from = len(tail)
                best = None
                best_idx = 0
                best_end = sys.maxsize
                for stop_str, k in self._stop_items:  # k = len(stop_str) - 1
                    idx = s.find(stop_str, check_from - k if check_from > k else 0)
                    if idx != -1 and idx + k + 1 < best_end:
                        best, best_idx, best_end = stop_str, idx, idx + k + 1
                if best is not None:
                    return self._stop_single(s, best, best_idx, best_end)
            base = self._tail_start
            emitted = self._emitted
            end = base + len(s) - self._buffer_len
            if end > emitted:
                delta = s[emitted - base : end - base]
                self._emitted = emitted = end
                self._pieces.append(delta)
            else:
                delta = ""
            keep_from = base + len(s) - self._max_stop_len + 1
            if emitted < keep_from:
                keep_from = emitted
            if keep_from > base:
                s = s[keep_from - base :]
                self._tail_start = keep_from
            self._tail = s
            return delta
        if not n:
            return self._finish_plain() if finished else ""
        ids = self.token_ids
        push = self._push
        skip_last = stop_token_finished and not self._include
        if n == 1:
            ids.append(token_ids[0])
            text = "" if skip_last else push(token_ids[0])
        else:
            ids.extend(token_ids)
            text = "".join([push(t) for t in (token_ids[:-1] if skip_last else token_ids)])
        if finished:
            self._done = True
            if self._flush_partial:
                text += self._detok.flush()
        if text:
            self._pieces.append(text)
        return text

    def _finish_plain(self) -> str:
        self._done = True
        text = self._detok.flush() if self._flush_partial else ""
        if text:
            self._pieces.append(text)
        return text

    def finish(self) -> str:
        """End the stream (no more tokens) and return the held-back text."""
        if self._done:
            return ""
        if self._stops:
            return self._add_with_stops((), 0, True, False)
        return self._finish_plain()

    def _stop_single(self, s: str, stop_str: str, idx: int, end: int) -> str:
        """A stop string completed by the single token just added (no tokens to drop)."""
        s = s[:end] if self._include else s[:idx]
        self.stopped = True
        self.stop_reason = stop_str
        self._done = True
        base = self._tail_start
        emitted = self._emitted
        delta = s[emitted - base :]
        if delta:
            self._emitted = base + len(s)
            self._pieces.append(delta)
        self._tail = s
        return delta

    def _add_with_stops(self, token_ids: Sequence[int], n: int, finished: bool, stop_token: bool) -> str:
        ids = self.token_ids
        num_prev = len(ids)
        push = self._push
        base = self._tail_start
        s = self._tail
        prev_len = base + len(s)  # absolute length of the output text before this step
        if n:
            skip_last = stop_token and not self._include
            detok_ids = token_ids[:-1] if skip_last else token_ids
            if n == 1 and not skip_last:
                piece = push(token_ids[0])
                offsets = [0, len(piece)]
                s += piece
            else:
                # Output-text offsets (relative to prev_len) at the new token boundaries.
                offsets = [0]
                parts = []
                rel = 0
                for t in detok_ids:
                    piece = push(t)
                    parts.append(piece)
                    rel += len(piece)
                    offsets.append(rel)
                if skip_last:
                    offsets.append(rel)
                s += "".join(parts)
            ids.extend(token_ids)
            if len(ids) > self._min_tokens:
                # vLLM check_stop_strings over the text past the min_tokens boundary.
                check_from = prev_len + offsets[max(self._min_tokens - num_prev, 0)] - base
                new_chars = len(s) - check_from
                if new_chars:
                    best = None
                    best_idx = 0
                    best_end = sys.maxsize
                    for stop_str in self._stops:
                        idx = s.find(stop_str, max(check_from - len(stop_str) + 1, 0))
                        if idx != -1:
                            end = idx + len(stop_str)
                            if end < best_end:
                                best, best_idx, best_end = stop_str, idx, end
                    if best is not None:
                        # Keep tokens up to the one completing the stop string.
                        num_kept = bisect_left(offsets, best_end + base - prev_len, lo=1)
                        del ids[num_prev + num_kept :]
                        self.num_new_tokens = num_kept
                        s = s[:best_end] if self._include else s[:best_idx]
                        self.stopped = True
                        self.stop_reason = best
                        finished = True
        end = base + len(s)
        if finished:
            self._done = True
            if self._flush_partial and not self.stopped:
                extra = self._detok.flush()
                if extra:
                    s += extra
                    end += len(extra)
        else:
            end -= self._buffer_len
        emitted = self._emitted
        if end > emitted:
            delta = s[emitted - base : end - base]
            self._emitted = emitted = end
            self._pieces.append(delta)
        else:
            delta = ""
        if not finished:
            # Keep the unemitted text plus max_stop_len - 1 characters of context.
            keep_from = min(emitted, base + len(s) - self._max_stop_len + 1)
            if keep_from > base:
                s = s[keep_from - base :]
                self._tail_start = keep_from
        self._tail = s
        return delta


# --------------------------------------------------------------------------------------
# Logprobs formatting (OpenAI chat and legacy completions)
# --------------------------------------------------------------------------------------


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
