"""What the grammar checkers (:mod:`.ebnf`, :mod:`.lark`) share: the exceptions they stop with, the too-deep message.

vLLM parses a grammar with xgrammar (``Grammar.from_ebnf`` / ``from_lark``) and, when that fails under
"auto", hands it to llguidance: an EBNF grammar goes through llguidance's GBNF-to-Lark converter
(gbnf_to_lark.py; its errors read "Failed to convert the grammar from GBNF to Lark: ..."), then
llguidance's Lark compiler ("Grammar error: ..."). The checkers are re-implementations of those
parsers' syntax and name rules, each answering "the error it would report, or None". A construct they do
not model (xgrammar's macros and rule attributes, llguidance's special tokens and grammar references) is
accepted, as before: the engine then decides.
"""

from __future__ import annotations

TOO_DEEP = "the grammar nests groups too deeply to be checked"
"""Refused past Python's recursion limit (some 250 nested groups; xgrammar takes 1,000, llguidance's Python
GBNF reader fails as here, and vLLM then answers 500)."""


class Unmodelled(Exception):
    """The grammar uses a feature these checkers do not model; nothing is refused for it."""


class GrammarSyntaxError(Exception):
    """A grammar checker's error message."""
