"""Regex classification: which of xgrammar and llguidance accept a regex, or why neither does.

vLLM hands a ``regex`` constraint to the backend's regex parser, and the grammar and schema checkers meet
regexes too (a schema's ``pattern``, a Lark ``/regex/``, a GBNF character class, a structural tag's regex
format). xgrammar refuses constructs llguidance takes, which is where "auto" falls back to guidance;
:func:`classify_regex` scans for the constructs that decide the outcome, so every checker asks it.
"""

from __future__ import annotations

import re

HEX = frozenset("0123456789abcdefABCDEF")
"""Hex digits, for the ``\\x`` / ``\\u`` escapes this scanner and the grammar readers decode."""


def classify_regex(rx: str) -> tuple[str, str]:
    """("xgrammar" | "guidance" | "error", reason): which of xgrammar / llguidance accept ``rx``.

    A scanner for the constructs that decide vLLM's outcome (checked against xgrammar 0.2.8 and
    llguidance 1.7.6 through vLLM 0.32's own validation): look-around, backreferences, word
    boundaries, comment groups and syntax errors fail in both (400); inline flags, ``(?P<``, ``\\p{..}``,
    possessive quantifiers and a trailing backslash fail only in xgrammar (guidance); the rest is xgrammar's.
    """
    verdict = "xgrammar"
    reason = ""
    n = len(rx)
    i = 0
    depth = 0
    can_repeat = False
    while i < n:
        c = rx[i]
        if c == "\\":
            if i + 1 >= n:
                verdict, reason = "guidance", "trailing backslash"
                break
            d = rx[i + 1]
            if d in "bB":
                return "error", "word boundaries are not supported"
            if d in "123456789" or d == "k":
                return "error", "backreferences are not supported"
            if d in "pP":
                verdict, reason = "guidance", "Unicode character classes are not supported by xgrammar"
                if rx.startswith("{", i + 2):  # \p{Name}
                    close = rx.find("}", i + 2)
                    if close < 0:
                        return "error", "unclosed Unicode class name"
                    i = close - 1
            i += 2
            can_repeat = True
            continue
        if c == "[":
            end = _class_end(rx, i)
            if end < 0:
                return "error", "unclosed character class"
            if _has_reversed_range(rx[i + 1 : end]):
                return "error", "invalid character class range"
            i = end + 1
            can_repeat = True
            continue
        if c == "(":
            if rx.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                return "error", "look-around, including look-ahead and look-behind, is not supported"
            if rx.startswith("(?#", i):
                return "error", "comment groups are not supported"
            can_repeat = False
            if not rx.startswith("(?", i):
                depth += 1
                i += 1
                continue
            if rx.startswith("(?:", i):
                depth += 1
                i += 3
                continue
            if rx.startswith(("(?<", "(?P<"), i):
                close = rx.find(">", i)
                if close < 0:
                    return "error", "invalid capture group name"
                if rx[i + 2] == "P":
                    verdict, reason = "guidance", "group modifiers are not supported by xgrammar"
                depth += 1
                i = close + 1
                continue
            # inline flags: (?i) or (?i:...)
            verdict, reason = "guidance", "group modifiers are not supported by xgrammar"
            j = i + 2
            while j < n and rx[j] not in ":)":
                if not (rx[j].isalpha() or rx[j] == "-"):
                    return "error", "unrecognized flag"
                j += 1
            if j >= n:
                return "error", "unclosed group"
            if rx[j] == ":":
                depth += 1
            i = j + 1
            continue
        if c == ")":
            depth -= 1
            if depth < 0:
                return "error", "unopened group"
            can_repeat = True
            i += 1
            continue
        if c == "{" and _quantifier_end(rx, i) < 0:
            return "error", "unclosed counted repetition"  # both want a literal "{" escaped
        if c in "*+?" or c == "{":
            if not can_repeat:
                return "error", "repetition operator missing expression"
            if c == "{":
                end = _quantifier_end(rx, i)
                low, _, high = rx[i + 1 : end].partition(",")
                if not low:
                    return "error", "repetition quantifier expects a valid decimal"
                if high and int(high) < int(low):
                    return "error", "invalid repetition count range"
                i = end + 1
            else:
                i += 1
            if i < n and rx[i] == "+":
                verdict, reason = "guidance", "possessive quantifiers are not supported by xgrammar"
                i += 1
            elif i < n and rx[i] == "?":
                i += 1
            can_repeat = False
            continue
        can_repeat = c != "|"
        i += 1
    if depth > 0:
        return "error", "unclosed group"
    return verdict, reason


def _class_end(rx: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1."""
    i = start + 1
    if i < len(rx) and rx[i] == "^":
        i += 1
    if i < len(rx) and rx[i] == "]":
        i += 1
    while i < len(rx):
        if rx[i] == "\\":
            i += 2
            continue
        if rx.startswith("[:", i):
            close = rx.find(":]", i + 2)
            if close > 0:
                i = close + 2
                continue
        if rx[i] == "]":
            return i
        i += 1
    return -1


_CLASS_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


def _has_reversed_range(body: str) -> bool:
    """Whether a class body has a range ``a-b`` with a > b; ``\\xHH``, ``\\uHHHH`` and ``\\n``-style ends count."""
    chars: list[str | None] = []
    i = 0
    while i < len(body):
        if body[i] == "\\":
            nxt = body[i + 1 : i + 2]
            width = {"x": 2, "u": 4}.get(nxt, 0)
            digits = body[i + 2 : i + 2 + width]
            if width and len(digits) == width and all(d in HEX for d in digits):
                chars.append(chr(int(digits, 16)))
                i += 2 + width
                continue
            # a class shorthand (\d, \w, \p{..}) is no range end; any other escape is its character
            chars.append(None if nxt.isalnum() and nxt not in _CLASS_ESCAPES else _CLASS_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        chars.append(body[i])
        i += 1
    return any(
        chars[k + 1] == "-" and (low := chars[k]) is not None and (high := chars[k + 2]) is not None and low > high
        for k in range(len(chars) - 2)
    )


_QUANTIFIER = re.compile(r"\{(\d*)(,(\d*))?\}")


def _quantifier_end(rx: str, start: int) -> int:
    """End index (the ``}``) of a ``{m}``/``{m,}``/``{m,n}``/``{,n}`` quantifier at ``start``, else -1."""
    match = _QUANTIFIER.match(rx, start)
    if match is None or (not match.group(1) and not match.group(3)):
        return -1
    return match.end() - 1
