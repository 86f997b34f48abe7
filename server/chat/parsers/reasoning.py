"""Reasoning parsing: splitting a model's thinking from its answer.

A :class:`ReasoningParser` splits an output into ``reasoning`` and ``content``, at once
(:meth:`ReasoningParser.parse`) or as a stream (:meth:`ReasoningParser.stream`). As with
tool calls, ``parse(text)`` is the stream fed the whole text, and the stream holds back
only what might be the start of a tag (``"</thi"``), so every chunking of the text gives
the same reasoning and content.

:class:`ThinkTagReasoningParser` is the common ``<think>...</think>`` scheme; a model
family with other tags or rules is a subclass in its own small file (see
:mod:`pyfront.server.chat.parsers.qwen3_reasoning`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

from pyfront.server.chat.parsers.tool_calls import partial_tag_overlap

__all__ = ["ReasoningDelta", "ReasoningParser", "ReasoningStream", "ThinkTagReasoningParser", "ThinkTagReasoningStream"]


class ReasoningDelta(NamedTuple):
    """Reasoning and content text produced by one step (``""`` for none)."""

    reasoning: str = ""
    content: str = ""


class ReasoningStream(ABC):
    """The streaming state of one output. Feed text as it comes, then finish once."""

    def __init__(self) -> None:
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._finished = False

    def feed(self, text: str) -> ReasoningDelta:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        delta = self._read(text) if text else ReasoningDelta()
        return self._record(delta)

    def finish(self) -> ReasoningDelta:
        """The output has ended: flush held-back text (a partial tag) where it stands."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._record(self._end())

    def _record(self, delta: ReasoningDelta) -> ReasoningDelta:
        if delta.reasoning:
            self._reasoning.append(delta.reasoning)
        if delta.content:
            self._content.append(delta.content)
        return delta

    def result(self) -> tuple[str | None, str | None]:
        """(reasoning, content) so far, None for empty."""
        return "".join(self._reasoning) or None, "".join(self._content) or None

    @property
    @abstractmethod
    def in_reasoning(self) -> bool:
        """Whether text fed now is still reasoning."""

    @abstractmethod
    def _read(self, text: str) -> ReasoningDelta: ...

    @abstractmethod
    def _end(self) -> ReasoningDelta: ...


class ReasoningParser(ABC):
    """A reasoning format. ``name`` is what ``--reasoning-parser`` calls it.

    ``starts_in_reasoning`` says whether the output begins inside the reasoning; the caller
    decides it from the request and the rendered prompt (see
    :meth:`starts_in_reasoning_for_prompt`). When False the output is all content.
    """

    name: ClassVar[str]

    def __init__(self, *, starts_in_reasoning: bool = True) -> None:
        self.starts_in_reasoning = starts_in_reasoning

    @abstractmethod
    def stream(self) -> ReasoningStream:
        """A new streaming state for one output."""

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output, None for empty: the same as streaming it."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.result()

    @classmethod
    def starts_in_reasoning_for_prompt(cls, prompt: str, *, enable_thinking: bool = True) -> bool:
        """Whether output generated after ``prompt`` starts inside the reasoning."""
        return enable_thinking

    def count_reasoning_tokens(self, token_ids: Sequence[int], token_id: Callable[[str], int | None]) -> int:
        """``usage.completion_tokens_details.reasoning_tokens``: 0 unless a format counts them (as vLLM's base)."""
        return 0


class ThinkTagReasoningStream(ReasoningStream):
    """Reasoning until ``end_tag``; ``start_tag`` dropped in reasoning, ``end_tag`` in content.

    An ``implicit_end`` tag met while reasoning also ends it, and is itself the first content
    (Qwen3.5's ``<tool_call>`` written before any ``</think>``: the call is then parsed, not lost).
    """

    def __init__(
        self, start_tag: str, end_tag: str, starts_in_reasoning: bool, implicit_end: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._implicit_end = implicit_end
        self._passthrough = not starts_in_reasoning
        self._reasoning_now = starts_in_reasoning
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning_now

    def _read(self, text: str) -> ReasoningDelta:
        if self._passthrough:
            return ReasoningDelta("", text)
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        content: list[str] = []
        start_tag, end_tag = self._start_tag, self._end_tag
        pos, n = 0, len(buf)
        while pos < n:
            if self._reasoning_now:
                # The first tag from here: (position, kind) with kind 0 end, 1 start, 2 implicit end.
                first, kind, tag_len = n, -1, 0
                for k, tag in enumerate((end_tag, start_tag, *self._implicit_end)):
                    j = buf.find(tag, pos, first + len(tag))
                    if 0 <= j < first:
                        first, kind, tag_len = j, min(k, 2), len(tag)
                if kind < 0:
                    tail = buf[pos:]
                    tags = (end_tag, start_tag, *self._implicit_end)
                    keep = n - max(partial_tag_overlap(tail, tag) for tag in tags)
                    reasoning.append(buf[pos:keep])
                    self._held = buf[keep:]
                    break
                reasoning.append(buf[pos:first])
                if kind == 1:
                    pos = first + tag_len
                else:
                    pos = first + tag_len if kind == 0 else first  # an implicit end tag stays, as content
                    self._reasoning_now = False
            else:
                j_end = buf.find(end_tag, pos)
                if j_end < 0:
                    keep = n - partial_tag_overlap(buf[pos:], end_tag)
                    content.append(buf[pos:keep])
                    self._held = buf[keep:]
                    break
                content.append(buf[pos:j_end])
                pos = j_end + len(end_tag)
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _end(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        return ReasoningDelta(held, "") if self._reasoning_now else ReasoningDelta("", held)


class ThinkTagReasoningParser(ReasoningParser):
    """``<think>``-style tags; subclasses set ``start_tag`` / ``end_tag`` and the prompt rule."""

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    implicit_end_tags: ClassVar[tuple[str, ...]] = ()
    """Tags that end the reasoning when met inside it and begin the content (kept, unlike ``end_tag``)."""

    def stream(self) -> ThinkTagReasoningStream:
        return ThinkTagReasoningStream(self.start_tag, self.end_tag, self.starts_in_reasoning, self.implicit_end_tags)

    def count_reasoning_tokens(self, token_ids: Sequence[int], token_id: Callable[[str], int | None]) -> int:
        """Generated tokens written while reasoning, the tag tokens themselves not counted.

        The same walk as :meth:`stream` over token ids (the tags are single special tokens in the
        families this serves): from ``starts_in_reasoning``, a start tag is skipped, the first end tag
        (or implicit end tag) leaves the reasoning for good. Checked against vLLM 0.32's ``qwen3`` parser
        (``count_reasoning_tokens``) on outputs with and without tags, unfinished reasoning, nested and
        repeated tags, and thinking off (0); pinned in tests/server/chat/test_parsers.py.
        """
        if not self.starts_in_reasoning:
            return 0
        start = token_id(self.start_tag)
        ends = {token_id(tag) for tag in (self.end_tag, *self.implicit_end_tags)} - {None}
        count = 0
        for tid in token_ids:
            if tid in ends:
                return count
            if tid != start:
                count += 1
        return count
