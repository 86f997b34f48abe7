"""One choice's text: detokenization + stop strings + hold-back, as vLLM's detokenizer and output processor.

:class:`TextStream` is vLLM 0.32's ``BaseIncrementalDetokenizer.update`` / ``check_stop_strings`` /
``get_next_output_text`` (``v1/engine/detokenizer.py``) and the token trimming of
``v1/engine/output_processor.py`` ``_trim_surplus_tokens``, over a :mod:`~pyfront.server.text.detokenizer`.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from pyfront.server.text.detokenizer import IncrementalDetokenizer, get_factory


class TextStream:
    """One choice's text: incremental detokenization, stop strings, hold-back (vLLM semantics).

    ``tokenizer``: a tokenizer, a :class:`DetokenizerFactory` (preferred: shared by all choices),
    or a ready :class:`IncrementalDetokenizer` (then the detokenization options are its own).
    ``prompt_tail``: the prompt's ids, or its last ones (context only, never output: the detokenizer keeps what
    it needs).

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
        for s in stops:  # loops, not generators: most requests have no stop strings
            if not s:
                raise ValueError("stop cannot contain an empty string.")
        self._stops = stops
        self._stop_items = tuple([(st, len(st) - 1) for st in stops]) if stops else ()
        self._include = include_stop_str_in_output
        self._min_tokens = min_tokens
        self._max_stop_len = max(map(len, stops)) if stops else 0
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
