"""Tool-call parsing: the shapes, the base classes, and a framework for tag-delimited formats.

A :class:`ToolCallParser` turns the content part of a model's output (reasoning already
split off) into plain content and tool calls, either at once (:meth:`ToolCallParser.parse`)
or as a stream (:meth:`ToolCallParser.stream`) whose deltas are OpenAI's
``delta.tool_calls`` entries. Streaming and non-streaming agree by construction:
``parse(text)`` is the stream fed the whole text, and every stream reads its input
character by character (with fast paths that do not depend on where the text is split),
so any chunking gives the same calls, ids aside, and the same content. A call's argument
fragments concatenate to exactly its ``arguments_json``, which is valid JSON.

:class:`TaggedToolCallStream` does the work common to formats where each call sits
between a start and an end tag (Hermes ``<tool_call>...</tool_call>``, Qwen3-Coder's XML
inside the same tags): finding the tags at any split, holding back a partial tag, the
whitespace rules for the content around calls, and turning a block that is not a call
back into content. A format supplies only a :class:`CallBody`, the reader of one
block's inside; see :mod:`pyfront.server.chat.parsers.hermes`.

The rules, for every tag-delimited format:

* text outside blocks is content, except that a whitespace-only stretch is dropped when
  it sits next to a call (vLLM drops whitespace-only content before a call; text after a
  call that is more than whitespace is kept, where vLLM's Hermes parser drops all of it);
* a block becomes a call as soon as its body names the function (the name's value is
  complete and the body is well-formed so far); its header delta goes out then, its
  arguments stream after it;
* a block that breaks, or ends, before naming a function is content, tags included
  (vLLM returns the whole output as content when any block is malformed);
* a call whose body breaks after the name, or that ends early (no end tag at the end of
  generation), keeps the arguments read so far, closed into valid JSON (``{}`` if none);
* a block ends at its end tag, at the next start tag (a missing end tag), or at the end
  of generation; the end tag is found even inside a JSON string, as vLLM does.
"""

from __future__ import annotations

import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

__all__ = [
    "CallBody",
    "ParsedToolCalls",
    "TaggedToolCallParser",
    "TaggedToolCallStream",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "ToolStreamDelta",
    "make_tool_call_id",
    "partial_tag_overlap",
]

_ID_ALPHABET = string.ascii_letters + string.digits


def make_tool_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 random letters and digits.

    (vLLM 0.32's ``make_tool_call_id`` gives ``chatcmpl-tool-`` and 32 hex digits; any
    ``Callable[[], str]`` can be passed as ``id_factory`` instead.)
    """
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: ``arguments_json`` is valid JSON, ``{}`` for a call without arguments."""

    id: str
    name: str
    arguments_json: str

    def to_openai(self) -> dict[str, Any]:
        """The ``message.tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    """A whole output parsed: ``content`` is None when empty (or whitespace-only next to calls)."""

    content: str | None
    calls: list[ToolCall]

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)


@dataclass(slots=True)
class ToolCallDelta:
    """One ``delta.tool_calls`` entry.

    The first delta of a call has ``id``, ``type`` ``"function"``, ``name`` and
    ``arguments`` ``""``; later ones have only ``index`` and an ``arguments`` fragment.
    """

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
        if self.type is not None:
            out["type"] = self.type
        function: dict[str, str] = {}
        if self.name is not None:
            function["name"] = self.name
        if self.arguments is not None:
            function["arguments"] = self.arguments
        out["function"] = function
        return out


@dataclass(slots=True)
class ToolStreamDelta:
    """What one :meth:`ToolCallStream.feed` or :meth:`ToolCallStream.finish` produced."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


class ToolCallStream(ABC):
    """The streaming state of one output. Feed the content text as it comes, then finish once.

    Subclasses read the text and call :meth:`_content`, :meth:`_begin_call`,
    :meth:`_arguments` and :meth:`_end_call`; this class assembles the deltas and the calls.
    """

    def __init__(self, id_factory: Callable[[], str] = make_tool_call_id) -> None:
        self._id_factory = id_factory
        self._calls: list[tuple[str, str, list[str]]] = []  # id, name, argument fragments
        self._delta_content: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        self._content_parts: list[str] = []
        self._finished = False

    # -- for users -----------------------------------------------------------------

    def feed(self, text: str) -> ToolStreamDelta:
        """Read the next piece of text; return the content and tool-call deltas it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if text:
            self._read(text)
        return self._take()

    def finish(self) -> ToolStreamDelta:
        """The output has ended: flush what was held back and close an unfinished call."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        self._end()
        return self._take()

    @property
    def calls(self) -> list[ToolCall]:
        """The calls begun so far (their arguments complete once finished)."""
        return [ToolCall(id_, name, "".join(parts)) for id_, name, parts in self._calls]

    @property
    def tools_called(self) -> bool:
        return bool(self._calls)

    @property
    def content(self) -> str:
        """All content produced so far."""
        return "".join(self._content_parts)

    def result(self) -> ParsedToolCalls:
        """The whole parse, after :meth:`finish`."""
        return ParsedToolCalls(content=self.content or None, calls=self.calls)

    # -- for subclasses ------------------------------------------------------------

    @abstractmethod
    def _read(self, text: str) -> None: ...

    @abstractmethod
    def _end(self) -> None: ...

    def _content(self, text: str) -> None:
        if text:
            self._delta_content.append(text)
            self._content_parts.append(text)

    def _begin_call(self, name: str) -> int:
        index = len(self._calls)
        call_id = self._id_factory()
        self._calls.append((call_id, name, []))
        self._deltas.append(ToolCallDelta(index=index, id=call_id, type="function", name=name, arguments=""))
        return index

    def _arguments(self, index: int, text: str) -> None:
        if not text:
            return
        self._calls[index][2].append(text)
        deltas = self._deltas
        if deltas and deltas[-1].index == index and deltas[-1].id is None:
            deltas[-1].arguments = (deltas[-1].arguments or "") + text
        else:
            deltas.append(ToolCallDelta(index=index, arguments=text))

    def _take(self) -> ToolStreamDelta:
        delta = ToolStreamDelta("".join(self._delta_content), self._deltas)
        self._delta_content = []
        self._deltas = []
        return delta


class ToolCallParser(ABC):
    """A tool-call format. ``name`` is what ``--tool-call-parser`` calls it, ``aliases`` its other names.

    One instance per request: ``tools`` are the request's tools (their JSON, as dicts), for formats
    whose parsing depends on the schemas (Qwen3-Coder's XML values are typed by them). The two
    class methods are what the rest of the server asks of a format: the constraint that forces its
    calls (:meth:`structural_tag`) and whether a chat template writes calls in it
    (:meth:`matches_template`, for ``--tool-call-parser auto``).
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    structural_tag_model: ClassVar[str | None] = None
    """vLLM's name for the format's structural tag; None: forced tool choices are constrained by JSON schema."""

    def __init__(
        self, *, tools: Sequence[Any] | None = None, id_factory: Callable[[], str] = make_tool_call_id
    ) -> None:
        self.tools: list[Any] = list(tools) if tools else []
        self.id_factory = id_factory

    @classmethod
    def structural_tag(
        cls,
        tools: Sequence[Any] | None,
        tool_choice: Any,
        parallel_tool_calls: bool | None = None,
        strict_level: str = "auto",
    ) -> dict[str, Any] | None:
        """The xgrammar structural tag vLLM 0.32 sends for this format, or None for no constraint.

        Only asked when ``structural_tag_model`` is set; a format without one has forced tool
        choices constrained by JSON schema instead, as vLLM does.
        """
        return None

    @classmethod
    def matches_template(cls, template: str) -> bool:
        """Whether ``template`` (a chat template's source) renders tool calls in this format."""
        return False

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A new streaming state for one output."""

    def parse(self, text: str) -> ParsedToolCalls:
        """Parse a whole output: the same as streaming it in one piece."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.result()


class CallBody(Protocol):
    """The reader of one tagged block's inside, for :class:`TaggedToolCallStream`.

    ``name`` is set once the block has named its function; ``failed`` once it can no longer
    do so. :meth:`take_arguments` returns argument text written since the last call (it is
    only asked once ``name`` is set); :meth:`close` is called once, when the block ends, and
    returns the rest of the arguments, which must then be valid JSON with all taken before.
    """

    name: str | None

    @property
    def failed(self) -> bool: ...

    def feed(self, text: str) -> object: ...

    def take_arguments(self) -> str: ...

    def close(self) -> str: ...


# Where a TaggedToolCallStream is.
_OUTSIDE = 0
_IN_BLOCK = 1
_IN_BROKEN_BLOCK = 2


class TaggedToolCallStream(ToolCallStream):
    """Calls between ``start_tag`` and ``end_tag``; the inside read by ``body_factory()``."""

    def __init__(
        self,
        start_tag: str,
        end_tag: str,
        body_factory: Callable[[], CallBody],
        id_factory: Callable[[], str] = make_tool_call_id,
    ) -> None:
        super().__init__(id_factory)
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._body_factory = body_factory
        self._state = _OUTSIDE
        self._held = ""  # a possible partial tag at the end of the text so far
        self._body: CallBody | None = None
        self._index = -1  # the current block's call, once it has one
        self._raw: list[str] = []  # the current block's text while it might still be content
        self._pending_ws = ""  # whitespace-only content that a following call would drop
        self._segment_has_text = False

    # -- content between blocks ----------------------------------------------------

    def _outside_text(self, text: str) -> None:
        if not text:
            return
        if self._segment_has_text:
            self._content(text)
        elif text.isspace():
            self._pending_ws += text
        else:
            self._content(self._pending_ws + text)
            self._pending_ws = ""
            self._segment_has_text = True

    def _flush_as_content(self, text: str) -> None:
        """Text that is content whatever follows (a block that is not a call)."""
        self._content(self._pending_ws + text)
        self._pending_ws = ""

    # -- blocks --------------------------------------------------------------------

    def _open_block(self) -> None:
        self._state = _IN_BLOCK
        self._body = self._body_factory()
        self._index = -1
        self._raw = [self._start_tag]

    def _body_text(self, text: str) -> None:
        if not text:
            return
        body = self._body
        assert body is not None
        if self._index < 0:
            self._raw.append(text)
        body.feed(text)
        self._after_body_step()

    def _after_body_step(self) -> None:
        body = self._body
        assert body is not None
        if self._index < 0:
            if body.name is not None:
                self._pending_ws = ""  # whitespace before a call is dropped
                self._index = self._begin_call(body.name)
                self._raw = []
            elif body.failed:
                self._state = _IN_BROKEN_BLOCK
                self._flush_as_content("".join(self._raw))
                self._raw = []
                return
            else:
                return
        self._arguments(self._index, body.take_arguments())

    def _close_block(self, end_tag: str) -> None:
        """The block ended, with ``end_tag`` (or ``""`` at the end of generation / a new start tag)."""
        body = self._body
        assert body is not None
        rest = body.close()
        if self._index < 0 and body.name is not None:  # named only by closing
            self._after_body_step()
        if self._index >= 0:
            self._arguments(self._index, rest)
        else:
            self._flush_as_content("".join(self._raw) + end_tag)
        self._end_block()

    def _end_block(self) -> None:
        self._state = _OUTSIDE
        self._body = None
        self._raw = []
        self._segment_has_text = False

    # -- reading -------------------------------------------------------------------

    def _read(self, text: str) -> None:
        buf = self._held + text
        self._held = ""
        start_tag, end_tag = self._start_tag, self._end_tag
        pos, n = 0, len(buf)
        while pos < n:
            if self._state == _OUTSIDE:
                j = buf.find(start_tag, pos)
                if j < 0:
                    keep = n - partial_tag_overlap(buf[pos:], start_tag)
                    self._outside_text(buf[pos:keep])
                    self._held = buf[keep:]
                    return
                self._outside_text(buf[pos:j])
                self._open_block()
                pos = j + len(start_tag)
                continue
            j_end = buf.find(end_tag, pos)
            j_start = buf.find(start_tag, pos)
            if j_end < 0 and j_start < 0:
                tail = buf[pos:]
                keep = n - max(partial_tag_overlap(tail, end_tag), partial_tag_overlap(tail, start_tag))
                self._inside_text(buf[pos:keep])
                self._held = buf[keep:]
                return
            if j_end >= 0 and (j_start < 0 or j_end < j_start):
                self._inside_text(buf[pos:j_end])
                self._end_inside(end_tag)
                pos = j_end + len(end_tag)
            else:  # a new start tag before any end tag: the block ended without one
                self._inside_text(buf[pos:j_start])
                self._end_inside("")
                self._open_block()
                pos = j_start + len(start_tag)

    def _inside_text(self, text: str) -> None:
        if self._state == _IN_BLOCK:
            self._body_text(text)
        else:
            self._content(text)

    def _end_inside(self, end_tag: str) -> None:
        if self._state == _IN_BLOCK:
            self._close_block(end_tag)
        else:
            self._content(end_tag)
            self._end_block()

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._state == _OUTSIDE:
            self._outside_text(held)
        else:
            self._inside_text(held)
            self._end_inside("")
        if self._pending_ws and not self._calls:
            self._content(self._pending_ws)
        self._pending_ws = ""


class TaggedToolCallParser(ToolCallParser):
    """A tag-delimited format: subclasses set the tags and :meth:`new_body`."""

    start_tag: ClassVar[str]
    end_tag: ClassVar[str]

    @abstractmethod
    def new_body(self) -> CallBody:
        """A reader for one block's inside."""

    def stream(self) -> TaggedToolCallStream:
        return TaggedToolCallStream(self.start_tag, self.end_tag, self.new_body, self.id_factory)
