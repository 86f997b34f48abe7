"""EBNF grammars: xgrammar's EBNF parser, and llguidance's GBNF-to-Lark reader that "auto" falls back to.

A ``grammar`` with a ``::=`` line is EBNF (vLLM's heuristic): xgrammar parses it (grammar_parser.cc,
:func:`xgrammar_ebnf_error`), and when xgrammar refuses it (or with guidance configured), llguidance
converts it from GBNF to Lark (gbnf_to_lark.py) and compiles the result (:func:`guidance_gbnf_error`; the
Lark side is :mod:`.lark`). Two readers because the dialects differ: llguidance's is the looser, so an
EBNF grammar xgrammar refuses may still pass under guidance. Structural tags' ``grammar`` formats are
xgrammar's EBNF too.
"""

from __future__ import annotations

import re

from pyfront.server.generate.structured_outputs.grammar import (
    TOO_DEEP,
    GrammarSyntaxError,
    Token,
    TokenParser,
    Unmodelled,
)
from pyfront.server.generate.structured_outputs.lark import LLG_LARK_SYNTAX, guidance_lark_error
from pyfront.server.generate.structured_outputs.regex import HEX, classify_regex

_XG_NAME_FIRST = frozenset("_-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_XG_NAME = _XG_NAME_FIRST | frozenset("0123456789")
_XG_ESCAPES = frozenset("'\"?\\/abfnrtv0e")
_XG_CLASS_ESCAPES = frozenset("^$\\.*+?()[]{}|/-")
_XG_MACROS = frozenset(("TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch", "Regex", "Substring"))


_XG_RULE_ATTRIBUTES = re.compile(r"(?m)^[ \t]*[A-Za-z_.-][\w.-]*[ \t]*\[[^\]\n]*\][ \t]*::=")


def _xg_escape(text: str, i: int, extra: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(code point, length) of the escape at ``text[i]`` (a backslash) as xgrammar reads it; length 0: invalid."""
    c = text[i + 1] if i + 1 < len(text) else ""
    if c and (c in extra or c in _XG_ESCAPES):
        return ord(c), 2
    if c == "x":
        j = i + 2
        while j < len(text) and text[j] in HEX:
            j += 1
        return (int(text[i + 2 : j], 16), j - i) if j > i + 2 else (0, 0)
    if c in ("u", "U"):
        width = 4 if c == "u" else 8
        digits = text[i + 2 : i + 2 + width]
        if len(digits) == width and all(d in HEX for d in digits):
            return int(digits, 16), width + 2
    return 0, 0


def xgrammar_ebnf_error(text: str) -> str | None:
    """xgrammar's EBNF lexer and parser (grammar_parser.cc): the first error, or None if it parses.

    Tokens: rule names and references (ASCII letters, digits, ``_ - .``), ``::=``, strings with C, ``\\x``,
    ``\\u`` and ``\\U`` escapes (no raw newline), character classes (ranges low <= high, ``^`` negation,
    no ``\\d``-style escapes, no raw newline), ``( ) | * + ? {m} {m,} {m,n}``, the look-ahead ``(= ...)``
    and ``#`` comments. A rule name must start its line, every rule is defined once, references are to
    defined rules, ``root`` exists, and every alternative has at least one element.
    """
    if _XG_RULE_ATTRIBUTES.search(text):
        return None  # rule attributes (name[max_tokens=..] ::=): not modelled
    tokens: list[Token] = []  # (kind, value, line)
    i, n, line = 0, len(text), 1
    while True:
        while i < n and text[i] in " \t\r\n#":
            if text[i] == "#":
                while i < n and text[i] not in "\r\n":
                    i += 1
                continue
            if text[i] == "\n" or (text[i] == "\r" and text[i + 1 : i + 2] != "\n"):
                line += 1
            i += 1
        if i >= n:
            tokens.append(("eof", "", line))
            break
        c = text[i]
        if c == "(" and text[i + 1 : i + 2] == "=":
            tokens.append(("(=", c, line))
            i += 2
        elif c in "(){}|,*+?=":
            tokens.append((c, c, line))
            i += 1
        elif c == ":":
            if not text.startswith("::=", i):
                return "Unexpected character: ':'"
            tokens.append(("::=", "::=", line))
            i += 3
        elif c == '"':
            i += 1
            while i < n and text[i] not in '"\r\n':
                if text[i] == "\\":
                    _, length = _xg_escape(text, i)
                    if not length:
                        return "Invalid escape sequence"
                    i += length
                else:
                    i += 1
            if i >= n or text[i] != '"':
                return 'Expect " in string literal'
            tokens.append(("str", "", line))
            i += 1
        elif c == "[":
            i += 1
            if i < n and text[i] == "^":
                i += 1
            items: list[int | None] = []  # code points; None for a dash
            while i < n and text[i] != "]":
                if text[i] in "\r\n":
                    return "Character class should not contain newline"
                if text[i] == "-":
                    items.append(None)
                    i += 1
                elif text[i] == "\\" and text[i + 1 : i + 2] in ("d", "D", "s", "S", "w", "W"):
                    return "Character class escape is not supported yet in EBNF"
                elif text[i] == "\\":
                    codepoint, length = _xg_escape(text, i, _XG_CLASS_ESCAPES)
                    if not length:
                        return "Invalid escape sequence"
                    items.append(codepoint)
                    i += length
                else:
                    items.append(ord(text[i]))
                    i += 1
            if i >= n:
                return "Unterminated character class"
            i += 1
            k = 0
            while k < len(items):
                low = ord("-") if items[k] is None else items[k]
                if k + 2 < len(items) and items[k + 1] is None:
                    high = ord("-") if items[k + 2] is None else items[k + 2]
                    if low is not None and high is not None and low > high:
                        return "Invalid character class: lower bound is larger than upper bound"
                    k += 3
                else:
                    k += 1
            tokens.append(("class", "", line))
        elif c in _XG_NAME_FIRST:
            j = i + 1
            while j < n and text[j] in _XG_NAME:
                j += 1
            name = text[i:j]
            tokens.append(("bool" if name in ("true", "false") else "ident", name, line))
            i = j
        elif c.isdigit():
            j = i
            while j < n and text[j].isdigit():
                j += 1
            tokens.append(("int", text[i:j], line))
            i = j
        else:
            return f"Unexpected character: {c}"
    for k, (kind, _, _) in enumerate(tokens):
        if kind == "::=":
            if k == 0:
                return "Assign should not be the first token"
            if tokens[k - 1][0] != "ident":
                return "Assign should be preceded by an identifier"
            if k >= 2 and tokens[k - 2][2] == tokens[k - 1][2]:
                return "The rule name should be at the beginning of the line"
            tokens[k - 1] = ("rule", tokens[k - 1][1], tokens[k - 1][2])
    names: set[str] = set()
    for kind, value, _ in tokens:
        if kind == "rule":
            if value in names:
                return f'Rule "{value}" is defined multiple times'
            names.add(value)
    if "root" not in names:
        return 'The root rule with name "root" is not found'
    try:
        _XgEbnfParser(tokens, names).parse()
    except GrammarSyntaxError as exc:
        return str(exc)
    except Unmodelled:
        return None
    except RecursionError:
        return TOO_DEEP
    return None


class _XgEbnfParser(TokenParser):
    """xgrammar's recursive-descent EBNF parser over the tokens of :func:`xgrammar_ebnf_error`."""

    _SEQUENCE_END = frozenset(("|", ")", "(=", "rule", "eof"))

    def __init__(self, tokens: list[Token], names: set[str]) -> None:
        super().__init__(tokens)
        self.names = names

    def expect(self, kind: str, message: str) -> None:
        if self.peek()[0] != kind:
            raise GrammarSyntaxError(message)
        self.pos += 1

    def parse(self) -> None:
        while self.peek()[0] != "eof":
            self.expect("rule", "Expect rule name")
            self.expect("::=", "Expect ::=")
            self.choices(0)
            if self.peek()[0] == "(=":
                self.pos += 1
                self.choices(0)
                self.expect(")", "Expect )")

    def choices(self, depth: int) -> None:
        self.sequence(depth)
        while self.peek()[0] == "|":
            self.pos += 1
            self.sequence(depth)

    def sequence(self, depth: int) -> None:
        self.element_with_quantifier(depth)
        while self.peek()[0] not in self._SEQUENCE_END:
            self.element_with_quantifier(depth)

    def element_with_quantifier(self, depth: int) -> None:
        self.element(depth)
        kind = self.peek()[0]
        if kind in ("*", "+", "?"):
            self.pos += 1
        elif kind == "{":
            self.pos += 1
            if self.peek()[0] != "int":
                raise GrammarSyntaxError(f"Expect integer, but got {self.peek()[1]}")
            low = int(self.peek()[1])
            self.pos += 1
            if self.peek()[0] == ",":
                self.pos += 1
                if self.peek()[0] == "}":
                    self.pos += 1
                    return
                if self.peek()[:2] == ("ident", "-1"):
                    self.pos += 1
                    self.expect("}", "Expect }")
                    return
                if self.peek()[0] != "int":
                    raise GrammarSyntaxError(f"Expect integer, but got {self.peek()[1]}")
                high = int(self.peek()[1])
                self.pos += 1
                if high < low:
                    raise GrammarSyntaxError(f"Lower bound is larger than upper bound: {low} > {high}")
                self.expect("}", "Expect }")
            elif self.peek()[0] == "}":
                self.pos += 1
            else:
                raise GrammarSyntaxError("Expect ',' or '}' in repetition range")

    def element(self, depth: int) -> None:
        kind, value, _ = self.peek()
        if kind == "(":
            if depth >= 1000:
                raise GrammarSyntaxError("Nest layer exceeded the maximum limit")
            self.pos += 1
            if self.peek()[0] == ")":
                self.pos += 1
                return
            self.choices(depth + 1)
            self.expect(")", "Expect )")
        elif kind in ("class", "str"):
            self.pos += 1
        elif kind == "ident" and value in _XG_MACROS:
            raise Unmodelled
        elif kind == "ident":
            if value not in self.names:
                raise GrammarSyntaxError(f'Rule "{value}" is not defined')
            self.pos += 1
        else:
            raise GrammarSyntaxError(f"Expect element, but got {value}")


class _GbnfError(Exception):
    """An error of llguidance's GBNF-to-Lark converter, positioned as it prints them."""

    def __init__(self, text: str, pos: int, message: str) -> None:
        line = text.count("\n", 0, pos) + 1
        super().__init__(f"{message} at line {line}, {text[max(0, pos - 20) : pos]!r} ^ {text[pos : pos + 20]!r}")


_GBNF_FAILED = "Invalid grammar specification: Failed to convert the grammar from GBNF to Lark"


def guidance_gbnf_error(text: str) -> str | None:
    """What vLLM reports when llguidance refuses an EBNF grammar (after xgrammar did), or None.

    llguidance reads GBNF (llama.cpp's grammar format) more loosely than xgrammar: an alternative may be
    empty (``"a" |``), a rule may be defined twice (the last one wins), a character class may hold a raw
    newline, names may contain any letter or digit. The converted grammar then goes through its Lark
    compiler, which refuses what the conversion passes through: a string with a raw newline, a character
    class that is not a valid regex (``[z-a]``), a repetition ``{m,n}`` with n < m.
    """
    if LLG_LARK_SYNTAX.search(text):
        return guidance_lark_error(text)
    try:
        rules = _GbnfParser(text).parse()
    except _GbnfError as exc:
        return f"{_GBNF_FAILED}: {exc}"
    except RecursionError:
        return f"{_GBNF_FAILED}: {TOO_DEEP}"
    for body in rules.values():
        for name in body.refs:
            if name not in rules:
                return f"{_GBNF_FAILED}: Rule '{name}' not found"
    if "root" not in rules:
        return f"{_GBNF_FAILED}: No 'root' rule found"
    for name in rules:
        if not _LARK_NAME.fullmatch(name):
            return f"Grammar error: lexer error: {name!r} is not a Lark name"
    for body in rules.values():
        if body.lark_error:
            return f"Grammar error: {body.lark_error}"
    return None


_LARK_NAME = re.compile(r"_?[A-Za-z][A-Za-z0-9_-]*")
"""A GBNF rule name that survives as a Lark name (llguidance renames case and dashes, not other letters)."""


class _GbnfRule:
    """What the checks need of a converted rule: its references in order, and the first Lark-level problem."""

    def __init__(self) -> None:
        self.refs: list[str] = []
        self.lark_error = ""


class _GbnfParser:
    """llguidance's GBNF reader (gbnf_to_lark.py ``GrammarParser``): positions and messages as it reports them."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rule = _GbnfRule()

    def cur(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def fail(self, message: str) -> _GbnfError:
        return _GbnfError(self.text, self.pos, message)

    def parse(self) -> dict[str, _GbnfRule]:
        rules: dict[str, _GbnfRule] = {}
        self.skip_space(True)
        while self.cur():
            name = self.name()
            self.skip_space(False)
            if not self.text.startswith("::=", self.pos):
                raise self.fail("Expected ::=")
            self.pos += 3
            self.skip_space(True)
            self.rule = _GbnfRule()
            self.alternatives(nested=False)
            rules[name] = self.rule
            self.skip_newline()
            self.skip_space(True)
        return rules

    def skip_space(self, newlines: bool) -> None:
        while self.cur():
            c = self.cur()
            if c in " \t":
                self.pos += 1
            elif newlines and c in "\r\n":
                self.skip_newline()
            elif c == "#":
                while self.cur() and self.cur() not in "\r\n":
                    self.pos += 1
            else:
                break

    def skip_newline(self) -> None:
        if self.cur() == "\r":
            self.pos += 1
            if self.cur() == "\n":
                self.pos += 1
        elif self.cur() == "\n":
            self.pos += 1

    @staticmethod
    def word_char(c: str) -> bool:
        return c.isalnum() or c in "-_"

    def name(self) -> str:
        start = self.pos
        while self.cur() and self.word_char(self.cur()):
            self.pos += 1
        if self.pos == start:
            raise self.fail("Expected name")
        return self.text[start : self.pos]

    def char(self) -> str:
        """One (possibly escaped) character; raises at the end of input or on an escape it does not know."""
        c = self.cur()
        if c == "\\":
            nxt = self.text[self.pos + 1 : self.pos + 2]
            if not nxt:
                raise self.fail("Incomplete escape sequence")
            self.pos += 1
            if nxt in '"\\[]nrt':
                self.pos += 1
                return "\\" + nxt
            width = {"x": 2, "u": 4, "U": 8}.get(nxt)
            if width is None:
                raise self.fail(f"Invalid escape sequence \\{nxt}")
            digits = self.text[self.pos + 1 : self.pos + 1 + width]
            if len(digits) != width or not all(d in HEX for d in digits):
                raise self.fail(f"Invalid \\{nxt} escape sequence: \\{nxt}{digits}")
            self.pos += 1 + width
            return "\\" + nxt + digits
        if not c:
            raise self.fail("Unexpected end of input")
        self.pos += 1
        return c

    def alternatives(self, nested: bool) -> None:
        while True:
            self.sequence(nested)
            self.skip_space(nested)
            if self.cur() != "|":
                return
            self.pos += 1
            self.skip_space(True)

    def sequence(self, nested: bool) -> None:
        while self.cur() and self.cur() not in "|)" and (nested or self.cur() not in "\r\n"):
            c = self.cur()
            if c == '"':
                self.pos += 1
                literal = ""
                while (ch := self.char()) != '"':
                    literal += ch
                if ("\n" in literal or "\r" in literal) and not self.rule.lark_error:
                    self.rule.lark_error = "lexer error: a string literal holds a raw newline"
            elif c == "[":
                self.pos += 1
                body = "["
                while (ch := self.char()) != "]":
                    body += ch
                regex_error = classify_regex(body + "]")
                if regex_error[0] == "error" and not self.rule.lark_error:
                    self.rule.lark_error = f"invalid regex {body + ']'!r}: {regex_error[1]}"
            elif c == "(":
                self.pos += 1
                self.skip_space(True)
                self.alternatives(nested=True)
                if self.cur() != ")":
                    raise self.fail("Expected ')'")
                self.pos += 1
                self.skip_space(nested)
            elif c == ".":
                self.pos += 1
            elif self.word_char(c):
                self.rule.refs.append(self.name())
            else:
                return
            self.skip_space(nested)
            self.repetition()
            self.skip_space(nested)

    def integer(self) -> int:
        start = self.pos
        while self.cur().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self.fail("Expected integer")
        return int(self.text[start : self.pos])

    def repetition(self) -> None:
        c = self.cur()
        if c in ("*", "+", "?"):
            self.pos += 1
        elif c == "{":
            self.pos += 1
            self.skip_space(True)
            low = self.integer()
            self.skip_space(True)
            if self.cur() == "}":
                self.pos += 1
            elif self.cur() == ",":
                self.pos += 1
                self.skip_space(True)
                high = self.integer() if self.cur().isdigit() else None
                self.skip_space(True)
                if self.cur() != "}":
                    raise self.fail("Expected '}'")
                self.pos += 1
                if high is not None and high < low and not self.rule.lark_error:
                    self.rule.lark_error = f"range end must be >= start, got ({low}, {high})"
            else:
                raise self.fail("Expected ',' or '}'")
