"""Incremental JSON reading that writes the value back out as it goes.

Tool-call parsers must stream a call's arguments as OpenAI argument fragments whose
concatenation is the final ``arguments`` string, valid JSON, whatever the chunking of
the model's text. :class:`JsonValueReader` reads one JSON value one piece at a time and
writes it in the form ``json.dumps(value, ensure_ascii=False)`` gives (``", "`` and
``": "`` separators, re-escaped strings, re-printed numbers): the form vLLM's
non-streaming parsers return. What it has written is at every moment a prefix of that
form which :meth:`JsonValueReader.closing` can close into valid JSON: an object key and
the ``, `` before an element are held back until their value starts, numbers and
literals until they are complete, string escapes until they are whole.

It works character by character (with a fast path for plain string runs), so where the
text is split never changes what it writes, only when.

Differences from ``json.dumps(json.loads(text), ensure_ascii=False)``, all on input
that is rare or invalid: control characters inside strings are accepted (``strict=False``)
and written escaped; ``NaN`` / ``Infinity`` are rejected; a number too large for a float
is written as it was read instead of ``Infinity``; a repeated key is written each time
(``json.loads`` keeps the last value); an unpaired surrogate escape stays an escape.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring

__all__ = ["ArgumentsReader", "CallObjectReader", "JsonValueReader", "canonical_json"]

_WS = " \t\n\r"
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_START = frozenset("-0123456789")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")

# Container frames on the reader's stack: [kind, state].
_OBJ = 0
_ARR = 1
# Object states.
_O_FIRST = 0  # after "{": a key or "}"
_O_KEY = 1  # after ",": a key
_O_COLON = 2  # after a key: ":"
_O_VALUE = 3  # after ":": a value
_O_AFTER = 4  # after a value: "," or "}"
# Array states.
_A_FIRST = 0  # after "[": a value or "]"
_A_VALUE = 1  # after ",": a value
_A_AFTER = 2  # after a value: "," or "]"

# What is being read when not between tokens.
_NONE = 0
_STRING = 1
_KEY = 2
_NUMBER_TOKEN = 3
_LITERAL = 4


def canonical_json(value: object) -> str:
    """``json.dumps(value, ensure_ascii=False)``: the form :class:`JsonValueReader` writes."""
    return json.dumps(value, ensure_ascii=False)


def _encode(text: str) -> str:
    """A decoded string piece written as JSON string content (without the quotes)."""
    return encode_basestring(text)[1:-1]


def _canonical_number(token: str) -> str:
    if not any(c in token for c in ".eE"):
        return str(int(token))
    value = float(token)
    if value in (float("inf"), float("-inf")):
        return token
    return repr(value)


class JsonValueReader:
    """Reads one JSON value from text given piece by piece, writing it in canonical form.

    :meth:`feed` consumes characters until the value is complete (``done``), an error is
    found (``error``) or the text runs out. A number or literal at the top level is only
    known to be complete when the character after it arrives (which is not consumed), or at
    :meth:`finish`. :meth:`take` returns what was written since the last call;
    :meth:`closing` what must be appended to that output to make it valid JSON.
    """

    __slots__ = (
        "_escape",
        "_high",
        "_key",
        "_out",
        "_prefix",
        "_reading",
        "_stack",
        "_token",
        "done",
        "emit",
        "error",
        "first_char",
    )

    def __init__(self, *, emit: bool = True) -> None:
        self.emit = emit
        self.done = False
        self.error = False
        self.first_char = ""
        self._out: list[str] = []
        self._stack: list[list[int]] = []
        self._prefix = ""  # written before the next value: ", " and/or a held-back key
        self._reading = _NONE
        self._token = ""  # number or literal characters so far
        self._escape = ""  # a string escape so far, from its backslash
        self._high = ""  # a high surrogate escape waiting for its pair
        self._key: list[str] = []

    @property
    def started(self) -> bool:
        return bool(self.first_char)

    def take(self) -> str:
        out = "".join(self._out)
        self._out.clear()
        return out

    # -- writing ---------------------------------------------------------------

    def _write(self, text: str) -> None:
        if self.emit:
            if self._prefix:
                self._out.append(self._prefix)
                self._prefix = ""
            self._out.append(text)
        else:
            self._prefix = ""

    def _value_done(self) -> None:
        if not self._stack:
            self.done = True
            return
        frame = self._stack[-1]
        frame[1] = _O_AFTER if frame[0] == _OBJ else _A_AFTER

    # -- reading ---------------------------------------------------------------

    def feed(self, text: str, pos: int = 0) -> int:
        """Consume ``text`` from ``pos``; return where it stopped."""
        n = len(text)
        while pos < n and not self.done and not self.error:
            reading = self._reading
            if reading in (_STRING, _KEY):
                pos = self._feed_string(text, pos)
                continue
            c = text[pos]
            if reading == _NUMBER_TOKEN:
                if c in _NUMBER_CHARS:
                    self._token += c
                    pos += 1
                    continue
                if not self._end_number():
                    return pos
                continue  # c is handled as a structural character
            if reading == _LITERAL:
                if c.isalpha():
                    token = self._token + c
                    if not any(lit.startswith(token) for lit in _LITERALS):
                        self.error = True
                        return pos
                    self._token = token
                    pos += 1
                    continue
                if not self._end_literal():
                    return pos
                continue
            if c in _WS:
                pos += 1
                continue
            if not self._structural(c):
                return pos
            pos += 1
        return pos

    def _structural(self, c: str) -> bool:
        """Handle a character between tokens; False (and ``error``) if it is not allowed."""
        if not self.first_char:
            self.first_char = c
        stack = self._stack
        if stack:
            kind, state = stack[-1]
            if kind == _OBJ:
                if state in (_O_FIRST, _O_KEY):
                    if c == '"':
                        self._reading = _KEY
                        self._key = []
                        return True
                    if c == "}" and state == _O_FIRST:
                        return self._close("}")
                    self.error = True
                    return False
                if state == _O_COLON:
                    if c == ":":
                        stack[-1][1] = _O_VALUE
                        return True
                    self.error = True
                    return False
                if state == _O_AFTER:
                    if c == ",":
                        stack[-1][1] = _O_KEY
                        self._prefix = ", "
                        return True
                    if c == "}":
                        return self._close("}")
                    self.error = True
                    return False
                # _O_VALUE: a value starts.
            else:
                if state == _A_AFTER:
                    if c == ",":
                        stack[-1][1] = _A_VALUE
                        self._prefix = ", "
                        return True
                    if c == "]":
                        return self._close("]")
                    self.error = True
                    return False
                if c == "]" and state == _A_FIRST:
                    return self._close("]")
                # _A_FIRST / _A_VALUE: a value starts.
        return self._start_value(c)

    def _start_value(self, c: str) -> bool:
        if c == "{":
            self._write("{")
            self._stack.append([_OBJ, _O_FIRST])
        elif c == "[":
            self._write("[")
            self._stack.append([_ARR, _A_FIRST])
        elif c == '"':
            self._write('"')
            self._reading = _STRING
        elif c in _NUMBER_START:
            self._reading = _NUMBER_TOKEN
            self._token = c
        elif c in "tfn":
            self._reading = _LITERAL
            self._token = c
        else:
            self.error = True
            return False
        return True

    def _close(self, bracket: str) -> bool:
        self._stack.pop()
        self._prefix = ""
        self._write(bracket)
        self._value_done()
        return True

    def _end_number(self) -> bool:
        token = self._token
        if _NUMBER.fullmatch(token) is None:
            self.error = True
            return False
        self._reading = _NONE
        self._token = ""
        self._write(_canonical_number(token))
        self._value_done()
        return True

    def _end_literal(self) -> bool:
        token = self._token
        if token not in _LITERALS:
            self.error = True
            return False
        self._reading = _NONE
        self._token = ""
        self._write(token)
        self._value_done()
        return True

    def _string_text(self, encoded: str) -> None:
        """Write encoded string content to the current key or string value."""
        if self._reading == _KEY:
            self._key.append(encoded)
        elif self.emit:
            self._out.append(encoded)

    def _flush_high(self) -> None:
        """A high surrogate escape turned out unpaired: it stays an escape."""
        if self._high:
            high, self._high = self._high, ""
            self._string_text(high)

    def _feed_string(self, text: str, pos: int) -> int:
        n = len(text)
        while pos < n:
            if self._escape:
                pos = self._feed_escape(text, pos)
                if self.error:
                    return pos
                continue
            c = text[pos]
            if c == '"':
                self._flush_high()
                pos += 1
                if self._reading == _KEY:
                    self._prefix += '"' + "".join(self._key) + '": '
                    self._key = []
                    self._reading = _NONE
                    self._stack[-1][1] = _O_COLON
                else:
                    self._reading = _NONE
                    if self.emit:
                        self._out.append('"')
                    self._value_done()
                return pos
            if c == "\\":
                self._escape = "\\"
                pos += 1
                continue
            self._flush_high()
            m = _STRING_RUN.match(text, pos)
            if m is not None:
                self._string_text(_encode(m.group()))
                pos = m.end()
            else:  # a raw control character: accepted, written escaped
                self._string_text(_encode(c))
                pos += 1
        return pos

    def _feed_escape(self, text: str, pos: int) -> int:
        esc = self._escape + text[pos]
        pos += 1
        if len(esc) == 2:
            c = esc[1]
            if c == "u":
                self._escape = esc
                return pos
            self._escape = ""
            if c not in _SIMPLE_ESCAPES:
                self.error = True
                return pos - 1
            self._flush_high()
            self._string_text(_encode(_SIMPLE_ESCAPES[c]))
            return pos
        if esc[-1] not in _HEX:
            self.error = True
            self._escape = ""
            return pos - 1
        if len(esc) < 6:
            self._escape = esc
            return pos
        self._escape = ""
        code = int(esc[2:], 16)
        if 0xD800 <= code <= 0xDBFF:
            self._flush_high()
            self._high = esc.lower()
        elif 0xDC00 <= code <= 0xDFFF:
            if self._high:
                high = int(self._high[2:], 16)
                self._high = ""
                self._string_text(_encode(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))))
            else:
                self._flush_high()
                self._string_text(esc.lower())
        else:
            self._flush_high()
            self._string_text(_encode(chr(code)))
        return pos

    # -- the end ------------------------------------------------------------------

    def finish(self) -> None:
        """The input has ended: a top-level number or literal in progress is complete."""
        if self.done or self.error or self._stack:
            return
        if self._reading == _NUMBER_TOKEN:
            self._end_number()
        elif self._reading == _LITERAL:
            self._end_literal()

    def closing(self) -> str:
        """What makes the output so far valid JSON (empty once the value is complete)."""
        if self.done or not self.emit:
            return ""
        parts: list[str] = []
        if self._reading == _STRING:
            if self._high:
                parts.append(self._high)
            parts.append('"')
        for kind, _state in reversed(self._stack):
            parts.append("}" if kind == _OBJ else "]")
        return "".join(parts)


# Call-object states.
_C_START = 0  # before "{"
_C_FIRST = 1  # after "{": a key or "}"
_C_KEY = 2  # after ",": a key
_C_IN_KEY = 3
_C_COLON = 4
_C_VALUE = 5  # after ":": a value
_C_IN_VALUE = 6
_C_AFTER = 7  # after a value: "," or "}"
_C_DONE = 8
_C_ERROR = 9

_STREAMED_ARGUMENT_STARTS = frozenset("{[")
_ARGUMENT_STARTS = frozenset('{["-0123456789tfn')


class ArgumentsReader:
    """Reads a call's arguments value and writes it as the call's ``arguments`` string.

    An object or array streams (:meth:`take`). Any other value is held until
    :meth:`close` and then written: ``null`` as ``{}``, a string holding a JSON object or
    array as that JSON (some models quote the arguments), any other string or scalar as
    itself (as vLLM does). :meth:`close` returns the rest of the text, closed into valid
    JSON if the value broke or was cut off; ``{}`` if nothing was written.
    """

    __slots__ = ("_reader", "_streamed", "closed")

    def __init__(self) -> None:
        self._reader = JsonValueReader()
        self._streamed: bool | None = None  # decided by the first character
        self.closed = False

    @property
    def done(self) -> bool:
        return self._reader.done

    @property
    def error(self) -> bool:
        return self._reader.error

    @property
    def started(self) -> bool:
        """Whether a valid first character has been read."""
        return self._reader.first_char in _ARGUMENT_STARTS if self._reader.first_char else False

    def feed(self, text: str, pos: int = 0) -> int:
        pos = self._reader.feed(text, pos)
        if self._streamed is None and self._reader.first_char:
            self._streamed = self._reader.first_char in _STREAMED_ARGUMENT_STARTS
        return pos

    def take(self) -> str:
        """Text written since the last call (streamed values only)."""
        return self._reader.take() if self._streamed else ""

    def close(self) -> str:
        if self.closed:
            return ""
        self.closed = True
        reader = self._reader
        if not self.started:
            return "{}"
        reader.finish()
        text = reader.take() + reader.closing()
        if self._streamed:
            return text
        if not text:
            return "{}"
        try:
            value = json.loads(text)
        except ValueError:
            return "{}"
        if value is None:
            return "{}"
        if isinstance(value, str):
            try:
                inner = json.loads(value)
            except ValueError:
                return text
            if isinstance(inner, (dict, list)):
                return canonical_json(inner)
        return text


class CallObjectReader:
    """Reads a ``{"name": ..., "arguments": ...}`` object, streaming the arguments.

    ``name`` is set once the name's string value is complete. The arguments are the first
    ``arguments`` member, or ``parameters`` (vLLM's required-tool-choice output; some models
    write it), read by an :class:`ArgumentsReader`; other members are read and dropped;
    text after the closing brace is ignored. ``failed``: the object broke (or the text
    ended) before its name was known, so it can never be a call. A break after the name
    only ends the reading: :meth:`close` closes the arguments written so far into valid
    JSON (``{}`` when they had not started).
    """

    ARGUMENT_KEYS = ("arguments", "parameters")

    __slots__ = ("_args", "_key", "_name_seen", "_reader", "_state", "closed", "name")

    def __init__(self) -> None:
        self.name: str | None = None
        self.closed = False
        self._state = _C_START
        self._reader: JsonValueReader | ArgumentsReader | None = None
        self._key = ""
        self._name_seen = False
        self._args: ArgumentsReader | None = None

    @property
    def done(self) -> bool:
        """The object's closing brace has been read."""
        return self._state == _C_DONE

    @property
    def broken(self) -> bool:
        return self._state == _C_ERROR

    @property
    def failed(self) -> bool:
        return self.name is None and (self._state == _C_ERROR or self.closed)

    def feed(self, text: str, pos: int = 0) -> int:
        """Consume ``text`` from ``pos``; return where reading stopped (after the closing brace)."""
        n = len(text)
        while pos < n:
            state = self._state
            if state >= _C_DONE:
                return pos
            if state in (_C_IN_KEY, _C_IN_VALUE):
                reader = self._reader
                assert reader is not None
                pos = reader.feed(text, pos)
                if reader.error:
                    self._state = _C_ERROR
                    return pos
                if reader.done:
                    if state == _C_IN_KEY:
                        assert isinstance(reader, JsonValueReader)
                        self._key = json.loads(reader.take())
                        self._state = _C_COLON
                    else:
                        self._value_read(reader)
                continue
            c = text[pos]
            if c in _WS:
                pos += 1
                continue
            if state == _C_START:
                self._expect(c == "{", _C_FIRST)
            elif state in (_C_FIRST, _C_KEY):
                if c == '"':
                    self._reader = JsonValueReader()
                    self._state = _C_IN_KEY
                    continue  # the reader reads the quote
                self._expect(c == "}" and state == _C_FIRST, _C_DONE)
            elif state == _C_COLON:
                self._expect(c == ":", _C_VALUE)
            elif state == _C_VALUE:
                self._start_value(c)
                continue  # the value's reader reads c
            else:  # _C_AFTER
                if c == ",":
                    self._state = _C_KEY
                else:
                    self._expect(c == "}", _C_DONE)
            if self._state == _C_ERROR:
                return pos
            pos += 1
        return pos

    def _expect(self, ok: bool, next_state: int) -> None:
        self._state = next_state if ok else _C_ERROR

    def _start_value(self, c: str) -> None:
        key = self._key
        if key == "name" and not self._name_seen:
            self._name_seen = True
            self._reader = JsonValueReader()
        elif key in self.ARGUMENT_KEYS and self._args is None:
            self._args = self._reader = ArgumentsReader()
        else:
            self._reader = JsonValueReader(emit=False)
        self._state = _C_IN_VALUE

    def _value_read(self, reader: JsonValueReader | ArgumentsReader) -> None:
        self._state = _C_AFTER
        if not isinstance(reader, JsonValueReader) or not reader.emit:
            return
        # The name's value.
        value = json.loads(reader.take())
        if isinstance(value, str) and value:
            self.name = value
        else:
            self._state = _C_ERROR

    def take_arguments(self) -> str:
        """Argument text written since the last call (streamed arguments only)."""
        return self._args.take() if self._args is not None else ""

    def close(self) -> str:
        """The text has ended: return the rest of the arguments (all of them, if they were held)."""
        if self.closed:
            return ""
        self.closed = True
        return self._args.close() if self._args is not None else "{}"
