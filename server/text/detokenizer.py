"""Engine token ids -> text deltas that never split a UTF-8 character, one detokenizer per choice.

This is the hot streaming path (one call per engine output, usually one new token), so every per-token
step is a handful of attribute look-ups plus one call into the Rust ``DecodeStream``. Nothing here
re-decodes the whole text or primes with the whole prompt.

Modelled on vLLM 0.32 (paths relative to the ``vllm`` package): the fast path is
``v1/engine/detokenizer.py`` ``FastIncrementalDetokenizer`` (``tokenizers``' ``DecodeStream``, including
its recovery from "Invalid prefix" errors and its ``spaces_between_special_tokens=False`` handling); the
slow path is ``SlowIncrementalDetokenizer`` / ``tokenizers/detokenizer_utils.py``
``detokenize_incrementally``, for tokenizers without a ``tokenizers.Tokenizer`` backend. The right one is
chosen automatically.

Per-tokenizer data (backend handle, added-token table, per-token text caches) lives in one
:class:`DetokenizerFactory` per tokenizer (:func:`get_factory` caches them); every per-choice object
accepts either a tokenizer or a factory.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tokenizers import Tokenizer as _RustTokenizer
    from tokenizers.decoders import DecodeStream as _RustDecodeStream

_BackendTokenizer: type[_RustTokenizer] | None = None
_DecodeStream: type[_RustDecodeStream] | None = None
try:  # tokenizers >= 0.21
    from tokenizers import Tokenizer as _Tokenizer
    from tokenizers.decoders import DecodeStream as _Stream

    _BackendTokenizer, _DecodeStream = _Tokenizer, _Stream
except ImportError:  # pragma: no cover - exercised only without a recent `tokenizers`
    try:
        from tokenizers import Tokenizer as _Tokenizer

        _BackendTokenizer = _Tokenizer
    except ImportError:
        pass


log = logging.getLogger(__name__)


PROMPT_TAIL_TOKENS = 8
"""How many trailing prompt ids prime a ``DecodeStream`` when the byte-level rule of
:meth:`DetokenizerFactory.stream_prefill` does not apply. vLLM primes it with the whole prompt and its slow path
uses the last 7 (``INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 2``); only the last few matter (SentencePiece
leading spaces, a prompt ending inside a UTF-8 character)."""

MAX_PREFILL_TOKENS = 32
"""How far back :meth:`DetokenizerFactory.stream_prefill` looks for an id whose bytes start a character."""

_NO_BYTES = -1
"""``DetokenizerFactory``'s first byte of an id that decodes to no bytes (an unknown id, an empty token)."""


_INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"  # tokenizers' DecodeStream error text


_REPLACEMENT = "\ufffd"


_NO_MARKER = object()


def format_token_id(token_id: int) -> str:
    """``return_tokens_as_token_ids`` form (vLLM ``format_token_id_placeholder``)."""
    return f"token_id:{token_id}"


# --------------------------------------------------------------------------------------
# Per-tokenizer shared data


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
        self._first_bytes: dict[int, int] | None = None
        """id -> the first byte it decodes to (``_NO_BYTES``: none), filled as ids are seen; None until
        :meth:`_byte_level` has run, or when its rule does not apply."""
        self._special_ids: frozenset[int] = frozenset()
        self._byte_level_checked = False
        self.prefill_reason: str | None = None
        """Why :meth:`stream_prefill` primes with the last ``PROMPT_TAIL_TOKENS`` ids (None: the byte-level rule)."""

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

    def stream_prefill(self, prompt_ids: Sequence[int], skip_special_tokens: bool) -> list[int]:
        """The prompt ids to prime a ``DecodeStream`` with, so that it decodes what follows as vLLM's, primed with
        the whole prompt, does.

        With a byte-level decoder, ``decode(ids)`` is the UTF-8 decoding (U+FFFD for bad bytes) of the ids' bytes
        run together, a skipped special token having none: the suffix kept is the shortest one whose bytes are not
        empty and begin with a byte that continues no character (not 0x80-0xBF). Why that is exact: UTF-8
        decoding restarts at such a byte whatever came before it, so for every ``ids``,
        ``decode(prompt + ids) == decode(rest) + decode(suffix + ids)``. ``DecodeStream.step`` with either priming
        then cuts the same text after its prefix, and its tests (ends with U+FFFD, longer than the prefix, starts
        with it) come out the same; after the first text it holds only generated ids either way. One exception,
        as with any tail: a prompt whose text ends inside a character (its decode ends with U+FFFD) sets no
        prefix, and vLLM's first delta then starts with the whole prompt's text, this one with the suffix's.
        A chat prompt ends with a newline: one id, where ``PROMPT_TAIL_TOKENS`` decoded 8 (twice) on the first
        step. Without that decoder (see :attr:`prefill_reason`), or without such an id among the last
        ``MAX_PREFILL_TOKENS``, the last ``PROMPT_TAIL_TOKENS`` / ``MAX_PREFILL_TOKENS`` ids.
        """
        first_bytes = self._first_bytes if self._byte_level_checked else self._byte_level()
        if first_bytes is None:
            return [int(t) for t in prompt_ids[-PROMPT_TAIL_TOKENS:]]
        end = len(prompt_ids)
        stop = max(0, end - MAX_PREFILL_TOKENS)
        special = self._special_ids
        for i in range(end - 1, stop - 1, -1):
            token_id = int(prompt_ids[i])
            first = first_bytes.get(token_id)
            if first is None:
                first = first_bytes[token_id] = self._first_byte(token_id)
            if first == _NO_BYTES or (skip_special_tokens and token_id in special):
                continue
            if not 0x80 <= first <= 0xBF:
                return [int(t) for t in prompt_ids[i:]]
        return [int(t) for t in prompt_ids[stop:]]

    def _first_byte(self, token_id: int) -> int:
        """The first byte ``decode([token_id])`` decodes, as the ByteLevel decoder maps a token's characters to
        bytes (its own bytes when one character is outside the byte alphabet); ``_NO_BYTES`` for none."""
        token = self.backend.id_to_token(token_id) if token_id >= 0 else None
        if not token:
            return _NO_BYTES
        return _token_bytes(token)[0]

    def _byte_level(self) -> dict[int, int] | None:
        """The first-byte table when the backend decodes byte-level and a probe agrees (else None, with the reason
        logged once)."""
        reason = self._byte_level_reason()
        if reason is None:
            decoder = self.backend.get_added_tokens_decoder()
            self._special_ids = frozenset(int(i) for i, token in decoder.items() if getattr(token, "special", False))
            self._first_bytes = {}
        else:
            self.prefill_reason = reason
            log.info("detokenizer: priming with the last %d prompt ids: %s", PROMPT_TAIL_TOKENS, reason)
        self._byte_level_checked = True
        return self._first_bytes

    def _byte_level_reason(self) -> str | None:
        backend = self.backend
        if not self.fast or backend is None:
            return "the slow detokenizer keeps its own tail"
        from tokenizers import decoders, pre_tokenizers

        if type(backend.decoder) is not decoders.ByteLevel:
            return f"the decoder is {type(backend.decoder).__name__}, not ByteLevel"
        if set(_BYTE_OF_CHAR) != set(pre_tokenizers.ByteLevel.alphabet()):
            return "the ByteLevel alphabet is not the one the rule maps"
        vocab = backend.get_vocab_size(with_added_tokens=True)
        probe = [*range(min(vocab, 256)), *range(256, vocab, 997), *backend.get_added_tokens_decoder()]
        for token_id in probe:
            token = backend.id_to_token(token_id)
            if token is None:
                continue
            if backend.decode([token_id], skip_special_tokens=False) != _token_bytes(token).decode("utf-8", "replace"):
                return f"decode([{token_id}]) is not the UTF-8 decoding of the bytes the rule maps it to"
        return None

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


def _byte_of_char() -> dict[str, int]:
    """The ByteLevel alphabet: GPT-2's ``bytes_to_unicode``, character -> byte (printable Latin-1 bytes are their
    own character, the other 68 are shifted to U+0100 on)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(0x100 + i): b for i, b in enumerate(shifted)})
    return table


_BYTE_OF_CHAR = _byte_of_char()


def _token_bytes(token: str) -> bytes:
    """A token's bytes as tokenizers' ByteLevel decoder takes them: each character's byte, or, when one character is
    outside the alphabet (an added token's own text), the token's UTF-8 bytes."""
    table = _BYTE_OF_CHAR
    try:
        return bytes([table[c] for c in token])
    except KeyError:
        return token.encode("utf-8")


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


class IncrementalDetokenizer:
    """Token ids -> text deltas for one choice.

    ``IncrementalDetokenizer(tokenizer_or_factory, ...)`` returns a
    :class:`FastIncrementalDetokenizer` (``DecodeStream``) or a :class:`SlowIncrementalDetokenizer`
    as appropriate. ``push(id)`` returns the newly completed text (often ``""``), never a split
    UTF-8 character; ``flush()`` (once, at the very end) returns the still-pending text, with
    U+FFFD for bytes that never completed, as ``tokenizer.decode`` would show them.

    ``prompt_tail``: the prompt's ids, or its last ones, decoded only as context, never output; each
    detokenizer keeps the few it needs (:meth:`DetokenizerFactory.stream_prefill`, the slow path's last 7).
    """

    __slots__ = ()

    def __new__(cls, tokenizer: Any = None, **kwargs: Any) -> IncrementalDetokenizer:
        if cls is IncrementalDetokenizer:
            cls = FastIncrementalDetokenizer if get_factory(tokenizer).fast else SlowIncrementalDetokenizer
        return object.__new__(cls)

    def push(self, token_id: int) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

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
        tail = factory.stream_prefill(prompt_tail, skip_special_tokens)
        # vLLM primes the stream with the whole prompt (native prefill); this part decodes the same.
        self._stream = _DecodeStream(ids=tail, skip_special_tokens=skip_special_tokens)
        self._step = self._stream.step
        self._pending: list[int] = []  # ids since the last step that produced text (for flush)
        self._last: int | None = tail[-1] if tail else None  # last id that produced text (flush context)
        self._flushed = False
        self._last_special = False
        self._added: dict[int, str] = {}  # the added tokens, when they need the no-spaces handling
        # vLLM: spaces_between_special_tokens = skip_special_tokens or spaces_between_special_tokens
        if not (skip_special_tokens or spaces_between_special_tokens):
            self._added = factory.added_token_ids
        if self._added:
            # The specialised hot path is the class's `push` (no per-call branching). Not an instance attribute
            # holding a bound method of the instance: that made every detokenizer a reference cycle, freed only
            # by the garbage collector.
            self.__class__ = _SpacelessSpecialsDetokenizer

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

    push = _push_plain

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
        assert _DecodeStream is not None, "__init__ checked"
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


class _SpacelessSpecialsDetokenizer(FastIncrementalDetokenizer):
    """A FastIncrementalDetokenizer whose ``push`` emits an added token that follows another as its raw content
    (``spaces_between_special_tokens=False`` with special tokens kept); chosen by its ``__init__``."""

    __slots__ = ()

    push = FastIncrementalDetokenizer._push_no_special_spaces


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
        tail = [int(t) for t in prompt_tail[-self._OFFSET - 2 :]]
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
