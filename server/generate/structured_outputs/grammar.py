"""What the grammar checkers (:mod:`.ebnf`, :mod:`.lark`) share: a token parser, their exceptions, the too-deep message.

vLLM parses a grammar with xgrammar (``Grammar.from_ebnf`` / ``from_lark``) and, when that fails under
"auto", hands it to llguidance: an EBNF grammar goes through llguidance's GBNF-to-Lark converter
(gbnf_to_lark.py; its errors read "Failed to convert the grammar from GBNF to Lark: ..."), then
llguidance's Lark compiler ("Grammar error: ..."). The checkers are re-implementations of those
parsers' syntax and name rules, each answering "the error it would report, or None". A construct they do
not model (xgrammar's macros and rule attributes, llguidance's special tokens and grammar references) is
accepted, as before: the engine then decides.
"""

from __future__ import annotations

from typing import TypeAlias

TOO_DEEP = "the grammar nests groups too deeply to be checked"
"""Refused past Python's recursion limit (some 250 nested groups; xgrammar takes 1,000, llguidance's Python
GBNF reader fails as here, and vLLM then answers 500)."""


class Unmodelled(Exception):
    """The grammar uses a feature these checkers do not model; nothing is refused for it."""


class GrammarSyntaxError(Exception):
    """A grammar checker's error message."""


Token: TypeAlias = tuple[str, str, int]
"""(kind, text, line): a token of xgrammar's EBNF lexer or of llguidance's Lark lexer."""


class TokenParser:
    """A recursive-descent parser's place in a token list that ends with an ``eof`` token."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, delta: int = 0) -> Token:
        return self.tokens[min(self.pos + delta, len(self.tokens) - 1)]
