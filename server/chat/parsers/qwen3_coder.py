"""``--tool-call-parser qwen3_coder``: the XML tool calls of Qwen3.5 / Qwen3.6 / Qwen3-Coder.

The model writes each call as::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

``qwen3_xml`` is another name for it, as in vLLM 0.32, whose ``Qwen3EngineToolParser`` (grammar
``vllm/parser/qwen3.py::qwen3_config``, values by ``_qwen3_arg_converter``, types by
``ParserEngine._fix_arg_types``) is the reference. What a call's arguments are, as vLLM's
non-streaming extraction decides them:

* the function name is the text between ``<function=`` and the next ``>``, stripped; an empty one
  is no call;
* the arguments are the text from that ``>`` to the first ``</function>``; in it, each match of
  ``<\\s*parameter\\s*=\\s*([^>]*)>(.*?)(?:<\\s*/\\s*parameter\\s*>|(?=<\\s*parameter\\s*=))`` (Python
  ``regex``'s ``\\s``) is a parameter, named by the group as written (a trailing space kept), its
  value the text up to the first ``</parameter>`` (spaces allowed inside the tag) or up to the next
  ``<parameter=``, one newline trimmed from each end; text between parameters is ignored;
* each value is converted by the type the tool's JSON schema gives that parameter
  (:func:`coerce_value`, a port of vLLM's ``extract_types_from_schema`` and
  ``coerce_to_schema_type``); without a schema for the tool, or for a parameter it lacks, a value
  is a string;
* the arguments are ``json.dumps(dict, ensure_ascii=False)``, keys in order of first appearance.

Streaming. The body is read once, left to right, by a small state machine (:class:`XmlCallBody`):
the text between tags is found with ``str.find``, and only a possible tag (from a ``<`` until it
matches or cannot) is held back, with its matching state kept across feeds, so no text is read
twice. A call begins when ``<function=NAME>`` is complete. A parameter's ``"key": `` is written
when its ``<parameter=KEY>`` is complete. A value that is certainly a string (no schema, a parameter
the schema lacks, or a schema type set whose first convertible type is ``string``) streams as it
comes, JSON-escaped character by character, only a trailing newline held back (it may be the
wrapping one); any other value is converted and written whole when it ends. Nothing written is
ever taken back, so the fragments concatenate to the final arguments.

Where this differs from vLLM 0.32, on purpose (each one pinned by the differential test against
vLLM's own parser, ``tests/server/chat/test_qwen3_coder.py``):

* a parameter that the function (or the output) ends inside, without its ``</parameter>``, keeps
  the value read so far (vLLM's non-streaming result drops it; its stream has already sent part
  of it, then stops);
* a parameter written twice appears twice in the arguments text, the later value last, so any
  JSON reader that keeps the last duplicate (Python's, JavaScript's) gets vLLM's object; a stream
  cannot move a value it has sent;
* ``</tool_call>`` and ``<tool_call>`` end a block anywhere but inside a parameter value (where
  they are text, as in vLLM): vLLM reads them as argument text anywhere before ``</function>``, so
  a call missing its ``</function>`` swallows the rest of the output, later calls included;
* a block that names no function (no ``<function=NAME>`` with a non-empty name and its ``>``) is
  content, tags included (the framework's rule; vLLM drops it, or for a name cut off by the end of
  the output makes it a call);
* text after a call is content in both modes (vLLM's stream keeps it; its non-streaming result
  drops everything after the first call), and content next to calls is not stripped, only
  whitespace-only stretches dropped (vLLM's non-streaming result strips it, its stream does not);
* ``</think>`` in the content is text: dropping a stray one is the reasoning parser's job (pyfront's
  ``qwen3`` does, as vLLM's composed parser does; vLLM's tool parser also drops it unless no
  reasoning parser is configured).

As in vLLM: ``<function=`` without ``<tool_call>`` opens a call; text between ``<tool_call>`` and
``<function=`` is dropped; after ``</function>``, text up to ``</tool_call>`` is dropped, and another
``<function=`` there is another call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyfront.server.chat.parsers.tool_calls import (
    TaggedToolCallParser,
    TaggedToolCallStream,
    make_tool_call_id,
    partial_tag_overlap,
)
from pyfront.server.chat.parsers.tool_choice import normalize_tool_choice
from pyfront.server.errors import RequestValidationError

__all__ = ["Qwen3CoderToolParser", "XmlCallBody", "coerce_value", "qwen3_coder_structural_tag", "schema_types"]

TOOL_START = "<tool_call>"
TOOL_END = "</tool_call>"
FUNCTION_START = "<function="
FUNCTION_END = "</function>"
_PARAMETER = "parameter"


# -- values by schema: vLLM 0.32's vllm/tool_parsers/utils.py ---------------------------------

_TYPE_ALIASES: dict[str, str] = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}
_CONVERTED_TYPES = ("null", "integer", "number", "boolean", "object", "array")
"""The types vLLM tries before ``string``, in its order."""


def _raw_schema_types(schema: Any) -> set[str]:
    """vLLM's ``extract_types_from_schema``: ``type``, ``enum`` values, ``anyOf``/``oneOf``/``allOf``."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    type_value = schema.get("type")
    if isinstance(type_value, str):
        types.add(type_value)
    elif isinstance(type_value, list):
        types.update(t for t in type_value if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            if value is None:
                types.add("null")
            elif isinstance(value, bool):
                types.add("boolean")
            elif isinstance(value, int):
                types.add("integer")
            elif isinstance(value, float):
                types.add("number")
            elif isinstance(value, str):
                types.add("string")
            elif isinstance(value, list):
                types.add("array")
            elif isinstance(value, dict):
                types.add("object")
    for choice_field in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(choice_field)
        if isinstance(choices, list):
            for choice in choices:
                types |= _raw_schema_types(choice)  # a choice without types adds "string", as in vLLM
    return types or {"string"}


def schema_types(schema: Any) -> frozenset[str]:
    """The normalized type names a parameter's schema allows (aliases such as ``int`` resolved)."""
    return frozenset(_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in _raw_schema_types(schema))


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def coerce_value(value: str, types: frozenset[str]) -> Any:
    """A parameter's text as its schema types make it: vLLM 0.32's ``coerce_to_schema_type``.

    The types are tried in vLLM's order, null, integer, number, boolean, object, array, string, the
    first that converts winning: ``null`` (any case, unstripped), Python's ``int`` (so ``" 5 "`` and
    ``"1_000"`` are integers), ``float`` (finite only; ``5.0`` becomes ``5``), ``true``/``1`` and
    ``false``/``0`` (any case, stripped), any JSON text for object and array (not only objects and
    arrays), and ``string`` the text itself. When no listed type converts and ``string`` is not
    listed, the text is read as JSON if it is finite JSON (so an ``integer`` parameter written
    ``5.5`` is ``5.5``, one written ``"x"`` is ``x``), else it stays the text.
    """
    for candidate in (*_CONVERTED_TYPES, "string"):
        if candidate not in types:
            continue
        if candidate == "null":
            if value.lower() == "null":
                return None
        elif candidate == "string":
            return value
        elif candidate == "integer":
            try:
                return int(value)
            except ValueError:
                pass
        elif candidate == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        elif candidate == "boolean":
            lowered = value.lower().strip()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
        else:  # object, array
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _always_string(types: frozenset[str]) -> bool:
    """Whether :func:`coerce_value` returns every text unchanged for these types."""
    return "string" in types and types.isdisjoint(_CONVERTED_TYPES)


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def tool_properties(tools: Sequence[Any], name: str) -> Mapping[str, Any] | None:
    """The ``properties`` of the first function tool named ``name`` (vLLM's ``find_tool_properties``)."""
    for tool in tools:
        function = _get(tool, "function")
        if function is not None and _get(function, "name") == name:
            properties = _get(_get(function, "parameters") or {}, "properties")
            return properties if isinstance(properties, Mapping) and properties else None
    return None


# -- reading one block ----------------------------------------------------------------------


def _space(c: str) -> bool:
    """Python ``regex``'s ``\\s`` (what vLLM's patterns use): ``str.isspace`` without U+001C..U+001F."""
    return c.isspace() and not "\x1c" <= c <= "\x1f"


# A possible tag after "<": three matchers run side by side, each a state number or _DEAD.
_DEAD = -1
_MATCHED = 99
# "</function>": the number of its characters matched.
# "<\s*/\s*parameter\s*>" and "<\s*parameter\s*=": 0 after "<" (spaces allowed; for the close tag "/"
# leads to 1, spaces allowed); 2..9 while spelling "parameter" (state s expects "parameter"[s - 1]);
# 10 after it (spaces allowed, then ">" or "=").


def _step_word(state: int, c: str, final: str) -> int:
    if 2 <= state <= 9:
        return state + 1 if c == _PARAMETER[state - 1] else _DEAD
    if state == 10:
        return 10 if _space(c) else (_MATCHED if c == final else _DEAD)
    return _DEAD


def _step_close(state: int, c: str) -> int:
    if state == 0:
        return 0 if _space(c) else (1 if c == "/" else _DEAD)
    if state == 1:
        return 1 if _space(c) else (2 if c == "p" else _DEAD)
    return _step_word(state, c, ">")


def _step_open(state: int, c: str) -> int:
    if state == 0:
        return 0 if _space(c) else (2 if c == "p" else _DEAD)
    return _step_word(state, c, "=")


def _step_function_end(state: int, c: str) -> int:
    if state == _DEAD:
        return _DEAD
    if c != FUNCTION_END[state]:
        return _DEAD
    return _MATCHED if state + 1 == len(FUNCTION_END) else state + 1


# XmlCallBody states.
_PRE = 0  # before "<function="
_NAME = 1  # the function name, up to ">"
_SEEK = 2  # between parameters: looking for "<parameter="
_PNAME = 3  # a parameter name, up to ">"
_VALUE = 4  # a parameter value, up to "</parameter>" or the next "<parameter="
_DONE = 5  # after "</function>"
_FAILED = 6


class XmlCallBody:
    """Reads one block's inside, from after ``<tool_call>`` (or from a bare ``<function=``).

    :class:`~pyfront.server.chat.parsers.tool_calls.CallBody`, plus :attr:`done` (``</function>``
    was read), :attr:`in_value`, and :meth:`feed` returning how much of the text it took: it stops
    after ``</function>`` and after the ``>`` of an empty function name (where it fails), leaving the
    rest to the stream.
    ``properties`` gives the schema properties of a function by name (None: no schema).
    """

    def __init__(self, properties: Callable[[str], Mapping[str, Any] | None]) -> None:
        self.name: str | None = None
        self._properties_of = properties
        self._properties: Mapping[str, Any] | None = None
        self._state = _PRE
        self._pre_tail = ""  # a possible beginning of "<function=" at the end of the text so far
        self._text: list[str] = []  # the function or parameter name read so far
        # a possible tag: its text (from "<") and its matchers' states
        self._tag: list[str] | None = None
        self._m_end = self._m_close = self._m_open = _DEAD
        # the arguments
        self._out: list[str] = []
        self._keys = 0
        self._types: frozenset[str] | None = None  # None: the current value streams as a string
        self._value: list[str] = []  # a converted value's text
        self._value_started = False
        self._newline_held = False

    @property
    def failed(self) -> bool:
        return self._state == _FAILED

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def in_value(self) -> bool:
        """Inside a parameter value, where ``<tool_call>`` and ``</tool_call>`` are text (as in vLLM)."""
        return self._state == _VALUE

    def take_arguments(self) -> str:
        out = "".join(self._out)
        self._out = []
        return out

    def close(self) -> str:
        """The block ended: a possible tag is text after all; an open value ends; the object closes."""
        if self._tag is not None:
            tag, self._tag = "".join(self._tag), None
            self._plain(tag)
        if self._state >= _SEEK and self._state != _DONE:
            self._end_function()
        return self.take_arguments()

    def feed(self, text: str) -> int:
        i, n = 0, len(text)
        while i < n:
            state = self._state
            if state >= _DONE:
                return i
            if self._tag is not None:
                i = self._tag_step(text, i)
            elif state == _PRE:
                i = self._pre_step(text, i)
            elif state == _NAME:
                j = text.find(">", i)
                if j < 0:
                    self._text.append(text[i:])
                    return n
                self._text.append(text[i:j])
                self._end_function_name()
                i = j + 1
            else:
                j = text.find("<", i)
                if state == _PNAME:
                    k = text.find(">", i, j if j >= 0 else n)
                    if k >= 0:
                        self._text.append(text[i:k])
                        self._begin_value()
                        i = k + 1
                        continue
                end = j if j >= 0 else n
                self._plain(text[i:end])
                if j < 0:
                    return n
                self._begin_tag()
                i = j + 1
        return n

    # -- the parts -------------------------------------------------------------------

    def _pre_step(self, text: str, i: int) -> int:
        """Text before ``<function=`` is dropped (as vLLM's ``TOOL_PREAMBLE`` does)."""
        tail = self._pre_tail
        buf = tail + text[i:]
        j = buf.find(FUNCTION_START)
        if j < 0:
            keep = partial_tag_overlap(buf, FUNCTION_START)
            self._pre_tail = buf[len(buf) - keep :] if keep else ""
            return len(text)
        self._pre_tail = ""
        self._state = _NAME
        return i + j + len(FUNCTION_START) - len(tail)  # the match ends past the tail, a proper prefix

    def _end_function_name(self) -> None:
        name = "".join(self._text).strip()  # vLLM strips the name (str.strip)
        self._text = []
        if not name:
            self._state = _FAILED
            return
        self.name = name
        self._properties = self._properties_of(name)
        self._state = _SEEK

    def _plain(self, text: str) -> None:
        """Text that is no tag, in the current state."""
        if not text:
            return
        state = self._state
        if state == _VALUE:
            self._value_text(text)
        elif state == _PNAME:
            k = text.find(">")
            if k < 0:
                self._text.append(text)
            else:  # the rest of a possible tag that was not one
                self._text.append(text[:k])
                self._begin_value()
                self._plain(text[k + 1 :])
        # _SEEK: text between parameters is ignored

    def _begin_tag(self) -> None:
        self._tag = ["<"]
        state = self._state
        self._m_end = 1
        self._m_open = 0 if state in (_SEEK, _VALUE) else _DEAD
        self._m_close = 0 if state == _VALUE else _DEAD

    def _tag_step(self, text: str, i: int) -> int:
        """Read characters of a possible tag from ``text[i]``; return where reading goes on."""
        tag = self._tag
        assert tag is not None
        n = len(text)
        while i < n:
            c = text[i]
            i += 1
            m_end = self._m_end = _step_function_end(self._m_end, c)
            m_close = self._m_close = _step_close(self._m_close, c) if self._m_close != _DEAD else _DEAD
            m_open = self._m_open = _step_open(self._m_open, c) if self._m_open != _DEAD else _DEAD
            if m_end == _MATCHED:
                self._tag = None
                self._end_function()
                return i
            if m_close == _MATCHED:
                self._tag = None
                self._end_value()
                self._state = _SEEK
                return i
            if m_open == _MATCHED:
                self._tag = None
                if self._state == _VALUE:
                    self._end_value()
                self._state = _PNAME
                return i
            if m_end == m_close == m_open == _DEAD:
                # Not a tag: "<" is text, and what followed it is read again (it holds no "<"
                # except perhaps as its last character, which may begin the next possible tag).
                self._tag = None
                self._plain("<")
                rest = "".join(tag[1:]) + c
                if c == "<":
                    self._plain(rest[:-1])
                    self._begin_tag()
                else:
                    self._plain(rest)
                return i
            tag.append(c)
        return i

    # -- writing the arguments -----------------------------------------------------------

    def _begin_value(self) -> None:
        text = "".join(self._text)
        self._text = []
        start = 0
        while start < len(text) and _space(text[start]):
            start += 1
        key = text[start:]  # "\s*" after "=" is not the name; trailing spaces are
        self._out.append(("{" if self._keys == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        self._keys += 1
        self._types = None
        properties = self._properties
        if properties is not None:
            prop = properties.get(key)
            if isinstance(prop, dict):
                types = schema_types(prop)
                if not _always_string(types):
                    self._types = types
        if self._types is None:
            self._out.append('"')
        self._value = []
        self._value_started = False
        self._newline_held = False
        self._state = _VALUE

    def _value_text(self, text: str) -> None:
        if not self._value_started:
            self._value_started = True
            if text[0] == "\n":  # the wrapping newline after <parameter=...>
                text = text[1:]
        if self._newline_held:
            text = "\n" + text
            self._newline_held = False
        if text.endswith("\n"):  # maybe the wrapping newline before </parameter>
            text = text[:-1]
            self._newline_held = True
        if not text:
            return
        if self._types is None:
            self._out.append(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._value.append(text)

    def _end_value(self) -> None:
        if self._types is None:
            self._out.append('"')
        else:
            value = coerce_value("".join(self._value), self._types)
            self._out.append(json.dumps(value, ensure_ascii=False))
            self._value = []

    def _end_function(self) -> None:
        if self._state == _VALUE:
            self._end_value()
        self._out.append("}" if self._keys else "{}")
        self._state = _DONE


# -- the stream ----------------------------------------------------------------------------

# Qwen3CoderStream states (the framework's three, and one more).
_OUTSIDE = 0
_IN_BLOCK = 1
_IN_BROKEN_BLOCK = 2
_AFTER_FUNCTION = 3  # after </function>, inside the block: text is dropped until </tool_call>


class Qwen3CoderStream(TaggedToolCallStream):
    """:class:`TaggedToolCallStream` with vLLM's two extra ways into a call.

    A bare ``<function=`` outside a block opens one (as if ``<tool_call>`` had come first; a bare
    block that fails is content and reading goes on outside). After a block's ``</function>``,
    text is dropped up to ``</tool_call>``, and a ``<function=`` there opens the next call.
    """

    def __init__(self, body_factory: Callable[[], XmlCallBody], id_factory: Callable[[], str]) -> None:
        super().__init__(TOOL_START, TOOL_END, body_factory, id_factory)
        self._xml: XmlCallBody | None = None
        self._bare = False

    def _open(self, bare: bool) -> None:
        self._open_block()
        assert isinstance(self._body, XmlCallBody)
        self._xml = self._body
        self._bare = bare
        if bare:
            self._raw = []

    def _feed_body(self, text: str) -> int:
        """Give the block's text to its body; return how much it took."""
        body = self._xml
        assert body is not None
        taken = body.feed(text)
        if self._index < 0:
            self._raw.append(text[:taken])
        self._after_body_step()
        if self._state == _IN_BROKEN_BLOCK and self._bare:
            self._end_block()  # a bare block that failed: its text was content, go on outside
        elif body.done:
            self._state = _AFTER_FUNCTION
        return taken

    def _read(self, text: str) -> None:
        buf = self._held + text
        self._held = ""
        pos, n = 0, len(buf)
        while pos < n:
            state = self._state
            if state == _OUTSIDE:
                j_tool = buf.find(TOOL_START, pos)
                j_bare = buf.find(FUNCTION_START, pos, j_tool if j_tool >= 0 else n)
                if j_tool < 0 and j_bare < 0:
                    tail = buf[pos:]
                    keep = n - max(partial_tag_overlap(tail, TOOL_START), partial_tag_overlap(tail, FUNCTION_START))
                    self._outside_text(buf[pos:keep])
                    self._held = buf[keep:]
                    return
                if j_bare >= 0:
                    self._outside_text(buf[pos:j_bare])
                    self._open(bare=True)
                    pos = j_bare  # the body reads "<function=" itself
                else:
                    self._outside_text(buf[pos:j_tool])
                    self._open(bare=False)
                    pos = j_tool + len(TOOL_START)
                continue
            j_end = buf.find(TOOL_END, pos)
            j_start = buf.find(TOOL_START, pos, j_end if j_end >= 0 else n)
            j_bare = -1
            if state == _AFTER_FUNCTION:
                stop = j_start if j_start >= 0 else (j_end if j_end >= 0 else n)
                j_bare = buf.find(FUNCTION_START, pos, stop)
            if j_end < 0 and j_start < 0 and j_bare < 0:
                tail = buf[pos:]
                tags = (TOOL_END, TOOL_START, FUNCTION_START) if state == _AFTER_FUNCTION else (TOOL_END, TOOL_START)
                keep = n - max(partial_tag_overlap(tail, tag) for tag in tags)
                if state == _IN_BLOCK:
                    pos += self._feed_body(buf[pos:keep])
                    if self._state == _IN_BLOCK:
                        self._held = buf[keep:]
                        return
                    continue  # the body stopped early: read the rest in the new state
                if state == _IN_BROKEN_BLOCK:
                    self._content(buf[pos:keep])
                self._held = buf[keep:]
                return
            stop = min(j for j in (j_end, j_start, j_bare) if j >= 0)
            if state == _IN_BLOCK:
                pos += self._feed_body(buf[pos:stop])
                if self._state != _IN_BLOCK:
                    continue
                body = self._xml
                assert body is not None
                if body.in_value:  # the tag is part of the value
                    tag = TOOL_END if stop == j_end else TOOL_START
                    pos += self._feed_body(tag)
                    continue
            elif state == _IN_BROKEN_BLOCK:
                self._content(buf[pos:stop])
            if stop == j_end:
                self._end_inside(TOOL_END)
                pos = j_end + len(TOOL_END)
            else:  # a new call without this block's end tag
                self._end_inside("")
                self._open(bare=stop == j_bare)
                pos = stop if stop == j_bare else stop + len(TOOL_START)

    def _end_inside(self, end_tag: str) -> None:
        if self._state == _AFTER_FUNCTION:
            self._close_block(end_tag)
        else:
            super()._end_inside(end_tag)

    def _end(self) -> None:
        held, self._held = self._held, ""
        if self._state == _OUTSIDE:
            self._outside_text(held)
        else:
            if self._state == _IN_BLOCK:
                held = held[self._feed_body(held) :]
            if self._state == _OUTSIDE:  # a bare block failed on the last characters
                self._outside_text(held)
            elif self._state == _IN_BROKEN_BLOCK:
                self._content(held)
            if self._state != _OUTSIDE:
                self._end_inside("")
        if self._pending_ws and not self._calls:
            self._content(self._pending_ws)
        self._pending_ws = ""


# -- the constraint ----------------------------------------------------------------------------

_STRICT_LEVELS = {"auto": 0, "function": 1, "parameter": 2}
_BEGIN = "<tool_call>\n<function="
_END = "\n</function>\n</tool_call>"


def qwen3_coder_structural_tag(
    tools: Sequence[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None = None,
    strict_level: str = "auto",
) -> dict[str, Any] | None:
    """The structural tag vLLM 0.32 sends for ``qwen3_coder``, as the dict ``json.dumps`` makes it.

    vLLM's path: ``_apply_structural_tag`` → ``get_model_structural_tag("qwen_3_coder",
    reasoning=False)`` → xgrammar's ``get_qwen_3_5_structural_tag``, then
    ``limit_to_single_tool_call`` for ``parallel_tool_calls`` false. When it applies and how strict
    each tool is follow the same rules as Hermes
    (:func:`~pyfront.server.chat.parsers.tool_choice.hermes_structural_tag`):
    none for ``none``, nor for ``auto`` unless a tool is ``strict``, the level is raised, or
    ``parallel_tool_calls`` is false (which raises it to ``function``); a tool's parameters are its
    schema when it is strict or the level is ``parameter``, else ``true``. Each call is one tag
    ``<tool_call>\\n<function=NAME>\\n`` ... ``\\n</function>\\n</tool_call>`` with ``qwen_xml``
    arguments; ``auto`` and ``required`` trigger them on ``<tool_call>\\n<function=`` with
    ``<think>`` / ``</think>`` excluded from the text, ``required`` needing one; a named function
    is its tag alone.
    """
    kind, name = normalize_tool_choice(tool_choice)
    if not tools or kind == "none":
        return None
    level = _STRICT_LEVELS[strict_level.strip().lower()]
    if parallel_tool_calls is False:
        level = max(level, _STRICT_LEVELS["function"])
    functions: list[tuple[str, Any, Any]] = []
    for tool in tools:
        function = _get(tool, "function")
        if function is None:
            raise RequestValidationError("only function tools are supported")
        functions.append((_get(function, "name"), _get(function, "parameters"), _get(function, "strict")))
    if kind == "auto" and level == 0 and not any(strict is True for _n, _p, strict in functions):
        return None
    if kind == "named":
        functions = [f for f in functions if f[0] == name][:1]
        if not functions:
            raise RequestValidationError(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
    tags: list[dict[str, Any]] = []
    for fn_name, params, strict in functions:
        strict_now = level >= _STRICT_LEVELS["parameter"] or strict is True
        tags.append(
            {
                "type": "tag",
                "begin": f"{_BEGIN}{fn_name}>\n",
                "content": {
                    "type": "json_schema",
                    "json_schema": params if strict_now and params is not None else True,
                    "style": "qwen_xml",
                    "any_order": False,
                    "max_whitespace_cnt": None,
                    "excludes": [],
                },
                "end": _END,
            }
        )
    if kind == "named":
        return {"type": "structural_tag", "format": tags[0]}
    fmt = {
        "type": "triggered_tags",
        "triggers": [_BEGIN],
        "tags": tags,
        "at_least_one": kind == "required",
        "stop_after_first": parallel_tool_calls is False,
        "excludes": ["<think>", "</think>"],
    }
    return {"type": "structural_tag", "format": fmt}


class Qwen3CoderToolParser(TaggedToolCallParser):
    name = "qwen3_coder"
    aliases = ("qwen3_xml",)
    structural_tag_model = "qwen_3_coder"
    start_tag = TOOL_START
    end_tag = TOOL_END

    def __init__(
        self, *, tools: Sequence[Any] | None = None, id_factory: Callable[[], str] = make_tool_call_id
    ) -> None:
        super().__init__(tools=tools, id_factory=id_factory)
        self._properties_cache: dict[str, Mapping[str, Any] | None] = {}

    @classmethod
    def structural_tag(
        cls,
        tools: Sequence[Any] | None,
        tool_choice: Any,
        parallel_tool_calls: bool | None = None,
        strict_level: str = "auto",
    ) -> dict[str, Any] | None:
        return qwen3_coder_structural_tag(tools, tool_choice, parallel_tool_calls, strict_level)

    @classmethod
    def matches_template(cls, template: str) -> bool:
        """A template that writes ``<function=`` and ``<parameter=`` tags (Qwen3.5 / Qwen3.6 / Qwen3-Coder).

        Checked before Hermes in the registry: these templates also write ``<tool_call>`` and,
        Qwen3-Coder's, a ``"name"`` text.
        """
        return "<function=" in template and "<parameter=" in template

    def _properties(self, name: str) -> Mapping[str, Any] | None:
        if name not in self._properties_cache:
            self._properties_cache[name] = tool_properties(self.tools, name)
        return self._properties_cache[name]

    def new_body(self) -> XmlCallBody:
        return XmlCallBody(self._properties)

    def stream(self) -> Qwen3CoderStream:
        return Qwen3CoderStream(self.new_body, self.id_factory)
