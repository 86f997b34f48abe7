"""Lark grammars: llguidance's Lark lexer, and a syntax and name check for xgrammar's and llguidance's dialects.

A ``grammar`` vLLM's heuristic takes for Lark is read by xgrammar's Lark reader (``Grammar.from_lark``), or by
llguidance's Lark compiler (with guidance configured, or under "auto" when xgrammar refuses it); llguidance's
compiler also compiles what its GBNF reader converts (:mod:`.ebnf`). :func:`lark_error` answers for both: the
dialects differ in a few points (directives, regex features), so one parser with an ``xgrammar`` flag serves.
"""

from __future__ import annotations

import json as _stdlib_json
import re

from pyfront.server.generate.structured_outputs.grammar import (
    TOO_DEEP,
    GrammarSyntaxError,
    Token,
    TokenParser,
    Unmodelled,
)
from pyfront.server.generate.structured_outputs.regex import classify_regex
from pyfront.server.generate.structured_outputs.schema import schema_error

LLG_LARK_SYNTAX = re.compile(r"(?m)^\s*(%llguidance\b|start\s*:)")
"""The marks of llguidance's Lark (a ``%llguidance`` directive, a ``start:`` rule): the guidance path checks a
grammar that has them as Lark, one without as GBNF."""


_LARK_COMMON = frozenset(
    (
        "DIGIT", "HEXDIGIT", "INT", "SIGNED_INT", "DECIMAL", "_EXP", "FLOAT", "SIGNED_FLOAT", "NUMBER",
        "SIGNED_NUMBER", "ESCAPED_STRING", "LCASE_LETTER", "UCASE_LETTER", "LETTER", "WORD", "CNAME",
        "WS_INLINE", "WS", "CR", "LF", "NEWLINE", "SH_COMMENT", "CPP_COMMENT", "C_COMMENT", "SQL_COMMENT",
    )
)  # fmt: skip
"""llguidance's ``common.*`` terminals (lark/common.rs); xgrammar's ``%import common.X`` reads the same names."""


_LARK_TOKEN = re.compile(
    r"""(?P<skip>(?:\#|//)[^\n]*|[ \t]+)
    |(?P<newline>(?:\r?\n)+[ \t]*)
    |(?P<directive>%[a-z]+)
    |(?P<string>"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4}|x[a-fA-F0-9]{2})|[^"\\\x00-\x1f\x7f])*"i?)
    |(?P<regexp>/(?:\\.|[^/\\\n])+/[imslux]*)
    |(?P<rule>!?[_?]?[a-z][_a-z0-9\-]*)
    |(?P<token>_?[A-Z][_A-Z0-9\-]*)
    |(?P<number>[+-]?[0-9]+)
    |(?P<special><[^<>\s]+>|@[a-zA-Z0-9_\-]+)
    |(?P<op>\.\.|->|::|[:,.()\[\]{}~|&=_+*?])""",
    re.VERBOSE,
)
_LARK_DIRECTIVES = frozenset(
    ("%declare", "%llguidance", "%ignore", "%import", "%override", "%json", "%regex", "%lark", "%if")
)
_LARK_ATOM_START = frozenset(("(", "[", "string", "rule", "token", "regexp", "%json", "%regex", "%lark", "special"))


def _lark_tokens(text: str) -> list[Token]:
    """(kind, text, line) of llguidance's Lark lexer; %json / %llguidance take a JSON value as one token."""
    out: list[Token] = []
    i, line = 0, 1
    decoder = _stdlib_json.JSONDecoder()
    while i < len(text):
        match = _LARK_TOKEN.match(text, i)
        if match is None:
            raise GrammarSyntaxError(f"{line}: lexer error")
        kind = match.lastgroup or ""
        value = match.group()
        if kind == "directive" and value not in _LARK_DIRECTIVES:
            raise GrammarSyntaxError(f"{line}: lexer error")
        if kind in ("op", "directive"):
            kind = value
        if kind != "skip":
            out.append((kind, value, line))
        line += value.count("\n")
        i = match.end()
        if kind in ("%json", "%llguidance"):
            while i < len(text) and text[i] in " \t":
                i += 1
            try:
                parsed, end = decoder.raw_decode(text, i)
            except ValueError:
                raise GrammarSyntaxError(f"{line}: invalid JSON after {kind}") from None
            out.append(("json", _stdlib_json.dumps(parsed), line))
            line += text.count("\n", i, end)
            i = end
    out.append(("eof", "", line))
    return out


def lark_error(text: str, *, xgrammar: bool) -> str | None:
    """The first error of xgrammar's (``xgrammar=True``) or llguidance's Lark reader, or None.

    Both read rules (``name:``, ``?name:``, ``!name:``) and terminals (``NAME:``), alternatives (also on
    continuation lines starting with ``|``), groups ``( )`` and ``[ ]``, the quantifiers ``* + ?`` and
    ``~n`` / ``~n..m``, strings (JSON escapes, ``i`` flag), ranges ``"a".."z"``, regexes ``/../flags``,
    ``%import common.NAME``, ``%ignore`` and inline ``%json`` schemas; every name used must be defined
    (a terminal only from terminals), nothing defined twice, no priorities (``A.2:``), a ``start`` rule.
    xgrammar takes no other directive (llguidance's ``%llguidance {...}`` is the one modelled here) and
    no Unicode classes or inline flags in regexes; llguidance's other extensions are not modelled.
    """
    try:
        return _LarkParser(_lark_tokens(text), xgrammar).parse()
    except GrammarSyntaxError as exc:
        return str(exc)
    except Unmodelled:
        return None
    except RecursionError:
        return TOO_DEEP


def guidance_lark_error(text: str) -> str | None:
    error = lark_error(text, xgrammar=False)
    return None if error is None else f"Grammar error: {error}"


class _LarkParser(TokenParser):
    """The item, expansion and atom structure of a Lark grammar, and its name rules."""

    def __init__(self, tokens: list[Token], xgrammar: bool) -> None:
        super().__init__(tokens)
        self.xgrammar = xgrammar
        self.defined: dict[str, bool] = {}  # name -> is a terminal
        self.uses: list[tuple[str, str | None, int]] = []  # (name, terminal being defined or None, line)
        self.defining_terminal: str | None = None

    def take(self) -> Token:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, kind: str) -> Token:
        if self.peek()[0] != kind:
            found = self.peek()
            raise GrammarSyntaxError(f"{found[2]}: Expected token '{kind}', found {found[1]!r}")
        return self.take()

    def define(self, name: str, terminal: bool, line: int) -> None:
        if name in self.defined:
            raise GrammarSyntaxError(f"at {line}: duplicate rule: {name!r}")
        self.defined[name] = terminal

    def parse(self) -> str | None:
        while True:
            while self.peek()[0] == "newline":
                self.pos += 1
            if self.peek()[0] == "eof":
                break
            self.item()
            if self.peek()[0] not in ("newline", "eof"):
                raise GrammarSyntaxError(
                    f"{self.peek()[2]}: expecting rule, token or statement (at {self.peek()[1]!r})"
                )
        for name, terminal, line in self.uses:
            kind = self.defined.get(name)
            if kind is None or (terminal is not None and not kind):
                return f"at {line}: unknown name: {name!r}"
        if "start" not in self.defined:
            return "no start rule found"
        return None

    def item(self) -> None:
        kind, value, line = self.take()
        if kind in ("rule", "token"):
            name = value.lstrip("!?") if kind == "rule" else value
            if self.peek()[0] == ".":
                raise GrammarSyntaxError(f"at {line}: priority not supported yet")
            self.expect(":")
            self.define(name, kind == "token", line)
            self.defining_terminal = name if kind == "token" else None
            self.expansions()
            self.defining_terminal = None
        elif kind == "%ignore":
            self.expansions()
        elif kind == "%import":
            self.import_(line)
        elif kind == "%llguidance" and not self.xgrammar:
            self.expect("json")
        elif kind in _LARK_DIRECTIVES:
            if self.xgrammar:
                raise GrammarSyntaxError(f"at {line}: directive {value} is not supported")
            raise Unmodelled
        else:
            raise GrammarSyntaxError(f"{line}: expecting rule, token or statement (at {value!r})")

    def import_(self, line: int) -> None:
        parts = [self.take()]
        if parts[0][0] not in ("rule", "token"):
            raise Unmodelled  # %import path (names) and relative imports
        while self.peek()[0] == "." and self.peek(1)[0] in ("rule", "token"):
            self.pos += 1
            parts.append(self.take())
        path = ".".join(part[1] for part in parts)
        if len(parts) != 2 or parts[0][1] != "common" or parts[1][1] not in _LARK_COMMON:
            raise GrammarSyntaxError(f"at {line}: Unknown common regex: {path}")
        name = parts[1][1]
        if self.peek()[0] == "->":
            self.pos += 1
            name = self.take()[1]
        self.define(name, True, line)

    def expansions(self) -> None:
        self.alias()
        while True:
            if self.peek()[0] == "|":
                self.pos += 1
            elif self.peek()[0] == "newline" and self.peek(1)[0] == "|":
                self.pos += 2
            else:
                return
            self.alias()

    def alias(self) -> None:
        while self.peek()[0] in _LARK_ATOM_START:
            self.expr()
        if self.peek()[0] == "->":
            self.pos += 1
            self.expect("rule")

    def expr(self) -> None:
        self.atom()
        if self.peek()[0] in ("+", "*", "?"):
            self.pos += 1
        elif self.peek()[0] == "~":
            self.pos += 1
            if self.peek()[0] != "number":
                raise GrammarSyntaxError(f"{self.peek()[2]}: Expected value")
            low = int(self.take()[1])
            if self.peek()[0] == "..":
                self.pos += 1
                high = int(self.expect("number")[1])
                if high < low:
                    raise GrammarSyntaxError(f"range end must be >= start, got ({low}, {high})")

    def atom(self) -> None:
        kind, value, line = self.take()
        if kind in ("(", "["):
            self.expansions()
            self.expect(")" if kind == "(" else "]")
        elif kind == "string":
            if self.peek()[0] == "..":
                self.pos += 1
                self.expect("string")
        elif kind in ("rule", "token"):
            self.uses.append((value, self.defining_terminal, line))
        elif kind == "regexp":
            body = value[1 : value.rindex("/")].replace("\\/", "/")
            verdict, reason = classify_regex(body)
            if verdict == "error" or (self.xgrammar and verdict != "xgrammar"):
                raise GrammarSyntaxError(f"at {line}: invalid regex {body!r}: {reason}")
        elif kind == "%json":
            schema = _stdlib_json.loads(self.expect("json")[1])
            error = schema_error(schema, xgrammar=self.xgrammar) if isinstance(schema, dict) else None
            if error is not None:
                raise GrammarSyntaxError(f"at {line}: failed to compile JSON schema: {error}")
        else:  # %regex, %lark, <special tokens>, @grammar references
            raise Unmodelled
