"""Structured outputs: the request's constraint checked and its grammar backend resolved, as vLLM's front end.

:func:`resolve_structured_outputs` is vLLM 0.32's ``_validate_structured_outputs`` (``v1/engine/input_processor.py``)
with the backend checks it runs in the front-end process (xgrammar's and guidance's schema, regex and grammar
checks, mirrored here so that no grammar library is imported): what vLLM refuses with 400 is refused here
with a message of the same kind (mostly the same text), and "auto" falls back from xgrammar to guidance where
vLLM's does. The mirrors are small re-implementations, each answering "the error this library would report":
xgrammar's EBNF parser and llguidance's GBNF-to-Lark reader, a Lark syntax and name check (both libraries'
dialects), a JSON-schema keyword checker (llguidance's messages, xgrammar's leniencies), a regex scanner and
xgrammar's structural-tag format parser. tests/data/structured-outputs-vectors.json holds vLLM's verdicts on
342 cases (kept true by the real-engine tier); pyfront agrees with every one. Each check is one pass over the
constraint, so a valid request pays time linear in its size.
"""

from __future__ import annotations

import json as _stdlib_json
import re
from collections.abc import Callable
from typing import Any, TypeGuard

from pyfront.engine_client.protocol import StructuredOutputsParams
from pyfront.server.errors import RequestValidationError

MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64


_STRUCTURAL_TAG_WRAPPER_NESTING = 16


STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
"""Values of vLLM's ``--structured-outputs-config.backend`` this module resolves."""


class _BackendRejects(Exception):
    """The (mirrored) xgrammar validation refused the request; "auto" then falls back."""


def resolve_structured_outputs(so: StructuredOutputsParams, backend: str = "auto") -> StructuredOutputsParams:
    """Validate ``so`` and set ``_backend`` / ``_backend_was_auto`` as vLLM's front end does; mutates ``so``.

    ``backend`` is the server's configured backend. "auto" picks xgrammar unless the request uses a
    feature xgrammar lacks (vLLM's ``has_xgrammar_unsupported_json_features``, the regex constructs
    xgrammar's parser refuses), then guidance, or outlines for schemas guidance cannot do
    (``patternProperties``). With xgrammar (picked or configured) a ``choice`` list is replaced by
    the equivalent EBNF ``grammar``, as a 0.32 xgrammar engine cannot compile a raw choice. Requests
    that both xgrammar and guidance reject in vLLM are refused (RequestValidationError).
    """
    if backend not in STRUCTURED_OUTPUT_BACKENDS:
        raise ValueError(f"unknown structured outputs backend {backend!r}; use one of {STRUCTURED_OUTPUT_BACKENDS}")
    param = "structured_outputs"
    if isinstance(so.choice, list) and not so.choice:
        raise RequestValidationError(f"Choice '{so.choice}' cannot be an empty list", param)
    if isinstance(so.grammar, str) and not so.grammar.strip():
        raise RequestValidationError("structured_outputs.grammar cannot be an empty string", param)
    if isinstance(so.json, str) and not so.json.strip():
        raise RequestValidationError("structured_outputs.json cannot be an empty string", param)
    check_json_nesting(so.json)
    check_json_nesting(so.structural_tag, structural_tag=True)
    if so.json_object is False:
        raise RequestValidationError(
            "structured_outputs.json_object must be True if set; omit structured_outputs to disable structured outputs",
            param,
        )
    if so.regex and "\x00" in so.regex:
        raise RequestValidationError("structured_outputs.regex must not contain a NUL character ('\\x00')", param)
    if isinstance(so.structural_tag, str) and not so.structural_tag.strip():
        raise RequestValidationError("structured_outputs.structural_tag cannot be an empty string", param)

    schema = None
    if so.json:  # vLLM's truthiness: an empty schema {} is not inspected
        schema = _parsed_schema(so.json)
        _check_schema_shape(schema)

    so.backend = backend
    so.backend_was_auto = False
    if backend == "xgrammar":
        try:
            _xgrammar_validate(so, schema)
        except _BackendRejects as exc:
            raise RequestValidationError(str(exc), param) from None
    elif backend == "guidance":
        _guidance_validate(so, schema)
    elif backend == "auto":
        try:
            _xgrammar_validate(so, schema)
            so.backend = "xgrammar"
        except _BackendRejects:
            if schema is not None and has_guidance_unsupported_json_features(schema):
                so.backend = "outlines"
            else:
                _guidance_validate(so, schema)
                so.backend = "guidance"
        so.backend_was_auto = True
    # outlines / lm-format-enforcer: vLLM validates with those libraries; pyfront passes the request on.
    return so


def _parsed_schema(spec: str | dict[str, Any]) -> Any:
    if not isinstance(spec, str):
        return spec
    try:
        return _stdlib_json.loads(spec)
    except (ValueError, RecursionError):
        raise RequestValidationError("Invalid JSON grammar specification.", "structured_outputs") from None


def _exceeds_json_nesting(spec: Any, limit: int) -> bool:
    if isinstance(spec, str):
        try:
            spec = _stdlib_json.loads(spec)
        except RecursionError:
            return True
        except ValueError:
            return False  # malformed JSON is reported by the backend validation
    level: list[Any] = [spec]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def check_json_nesting(spec: str | dict[str, Any] | None, *, structural_tag: bool = False) -> None:
    """vLLM's ``check_json_nesting``: at most 64 nested objects/arrays (structural tags: 80)."""
    limit = MAX_STRUCTURED_OUTPUT_JSON_NESTING + (_STRUCTURAL_TAG_WRAPPER_NESTING if structural_tag else 0)
    if spec and _exceeds_json_nesting(spec, limit):
        raise RequestValidationError(
            "The JSON schema is nested too deeply: objects and arrays may nest at most "
            f"{MAX_STRUCTURED_OUTPUT_JSON_NESTING} levels",
            "structured_outputs",
        )


def choice_as_grammar(choice: list[str]) -> str:
    """vLLM's ``choice_as_grammar`` (vllm/v1/structured_output/utils.py): ``root ::= "a" | "b"``."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}

    def escape(ch: str) -> str:
        if ch in escapes:
            return escapes[ch]
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return f"\\u{ord(ch):04x}"
        return ch

    return "root ::= " + " | ".join('"' + "".join(escape(ch) for ch in c) + '"' for c in choice)


def grammar_is_likely_lark(grammar_str: str) -> bool:
    """vLLM's heuristic: a grammar is Lark unless some line (comments removed) contains ``::=``."""
    if not grammar_str or not isinstance(grammar_str, str):
        return False
    for line in grammar_str.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if line and "::=" in line:
            return False
    return True


_STRING_SUPPORTED_FORMATS = frozenset(
    (
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
        "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    )
)  # fmt: skip


_GUIDANCE_FORMATS = _STRING_SUPPORTED_FORMATS | {"unknown"}


_JSON_TYPES = frozenset(("string", "number", "integer", "boolean", "object", "array", "null"))


_GUIDANCE_UNIMPLEMENTED = (
    "uniqueItems", "contains", "minContains", "maxContains", "propertyNames", "unevaluatedProperties",
)  # fmt: skip


def _schema_types(schema: dict[str, Any]) -> set[str]:
    schema_type = schema.get("type")
    if isinstance(schema_type, str):
        return {schema_type}
    if isinstance(schema_type, list):
        return {item for item in schema_type if isinstance(item, str)}
    return set()


def _has_pattern_and_length_bounds(schema: dict[str, Any]) -> bool:
    return ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema)


def _any_subobject(obj: Any, predicate: Callable[[dict[str, Any]], bool]) -> bool:
    """True if `predicate` holds for `obj` or for any dict nested in it (through dict values and lists).

    The walk vLLM's `has_*_unsupported_json_features` functions share.
    """
    if not isinstance(obj, dict):
        return False
    if predicate(obj):
        return True
    for value in obj.values():
        if isinstance(value, dict):
            if _any_subobject(value, predicate):
                return True
        elif isinstance(value, list) and any(
            isinstance(item, dict) and _any_subobject(item, predicate) for item in value
        ):
            return True
    return False


def _xgrammar_unsupported_here(obj: dict[str, Any]) -> bool:
    types = _schema_types(obj)
    if (types & {"integer", "number"}) and "multipleOf" in obj:
        return True
    if "array" in types and any(k in obj for k in ("uniqueItems", "contains", "minContains", "maxContains")):
        return True
    if "string" in types and "format" in obj and obj["format"] not in _STRING_SUPPORTED_FORMATS:
        return True
    if "string" in types and _has_pattern_and_length_bounds(obj):
        return True
    if "object" in types and "propertyNames" in obj:
        property_names = obj.get("propertyNames")
        if isinstance(property_names, dict) and _has_pattern_and_length_bounds(property_names):
            return True
        if "patternProperties" in obj or "properties" in obj:
            return True
        if obj.get("unevaluatedProperties", True) is not True:
            return True
    if (
        "object" in types
        and isinstance(obj.get("patternProperties"), dict)
        and ("properties" in obj or len(obj["patternProperties"]) > 1)
    ):
        return True
    allof = obj.get("allOf")
    return isinstance(allof, list) and len(allof) >= 2


def has_xgrammar_unsupported_json_features(schema: dict[str, Any]) -> bool:
    """Mirror of vLLM 0.32's function of that name (vllm/v1/structured_output/backend_xgrammar.py)."""
    return _any_subobject(schema, _xgrammar_unsupported_here)


def has_guidance_unsupported_json_features(schema: dict[str, Any]) -> bool:
    """Mirror of vLLM 0.32's function of that name (``patternProperties`` anywhere)."""
    return _any_subobject(schema, lambda obj: "patternProperties" in obj)


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


_SCHEMA_VALUES = (
    "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems",
)  # fmt: skip


_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def _subschemas(schema: Any) -> list[dict[str, Any]]:
    """Every schema object in a JSON schema, following the schema keywords only (not property names)."""
    out: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        out.append(node)
        for key in _SCHEMA_MAPS:
            value = node.get(key)
            if isinstance(value, dict):
                stack.extend(value.values())
        for key in _SCHEMA_VALUES:
            value = node.get(key)
            if isinstance(value, dict):
                stack.append(value)
        for key in _SCHEMA_LISTS:
            value = node.get(key)
            if isinstance(value, list):
                stack.extend(value)
    return out


def _resolve_pointer(root: Any, pointer: str) -> bool:
    node = root
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def _check_schema_shape(schema: Any) -> None:
    """A schema that is not an object is refused whatever the backend (llguidance's message, as vLLM's)."""
    if not isinstance(schema, dict):
        raise RequestValidationError(
            "Invalid grammar specification: Expecting object schema to apply options", "structured_outputs"
        )


def _xgrammar_validate(so: StructuredOutputsParams, schema: Any) -> None:
    """``validate_xgrammar_grammar`` without xgrammar: raise _BackendRejects where xgrammar would fail."""
    if so.regex:
        verdict, reason = _classify_regex(so.regex)
        if verdict != "xgrammar":
            raise _BackendRejects(f"Failed to transform regex into a grammar: {reason}")
    if so.choice:
        so.grammar = choice_as_grammar(so.choice)
        so.choice = None
        return
    if so.json:
        if has_xgrammar_unsupported_json_features(schema):
            raise _BackendRejects("The provided JSON schema contains features not supported by xgrammar.")
        error = _schema_error(schema, xgrammar=True)
        if error is not None:
            raise _BackendRejects(f"Failed to transform json schema into a grammar: {error}")
        return
    if so.grammar:
        lark = grammar_is_likely_lark(so.grammar)
        if (_lark_error(so.grammar, xgrammar=True) if lark else _xgrammar_ebnf_error(so.grammar)) is not None:
            raise _BackendRejects("Invalid grammar specification.")
        return
    if so.structural_tag:
        try:
            tag = _stdlib_json.loads(so.structural_tag)
        except (ValueError, RecursionError):
            raise _BackendRejects("Invalid structural tag specification.") from None
        if _structural_tag_xgrammar_error(tag) is not None:
            raise _BackendRejects("Invalid structural tag specification.")


def _guidance_validate(so: StructuredOutputsParams, schema: Any) -> None:
    """``validate_guidance_grammar`` without llguidance: its refusals as the 400s vLLM turns them into."""
    param = "structured_outputs"
    error: str | None = None
    if so.json and isinstance(schema, dict):
        for node in _subschemas(schema):
            unimplemented = [key for key in _GUIDANCE_UNIMPLEMENTED if key in node]
            if unimplemented:
                raise RequestValidationError(
                    f"Grammar error: Unimplemented keys: {_stdlib_json.dumps(unimplemented)}", param
                )
        keyword_error = _schema_error(schema, xgrammar=False)
        error = None if keyword_error is None else f"Grammar error: {keyword_error}"
    elif so.regex:
        verdict, reason = _classify_regex(so.regex)
        if verdict == "error":
            error = f"Grammar error: invalid regex {so.regex!r}: {reason}"
    elif so.grammar:
        lark = grammar_is_likely_lark(so.grammar) and _LLG_LARK_SYNTAX.search(so.grammar)
        error = _guidance_lark_error(so.grammar) if lark else _guidance_gbnf_error(so.grammar)
    elif so.structural_tag:
        try:
            tag = _stdlib_json.loads(so.structural_tag)
        except ValueError as exc:
            raise RequestValidationError(f"Invalid grammar specification: {exc}", param) from None
        error = _structural_tag_guidance_error(tag)
    if error is not None:
        raise RequestValidationError(error, param)


def _classify_regex(rx: str) -> tuple[str, str]:
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
            if width and len(digits) == width and all(d in _HEX for d in digits):
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


# ----------------------------------------------------------------------------------------- grammars
#
# vLLM parses a grammar with xgrammar (``Grammar.from_ebnf`` / ``from_lark``) and, when that fails under
# "auto", hands it to llguidance: an EBNF grammar goes through llguidance's GBNF-to-Lark converter
# (gbnf_to_lark.py; its errors read "Failed to convert the grammar from GBNF to Lark: ..."), then
# llguidance's Lark compiler ("Grammar error: ..."). The checkers below are re-implementations of those
# parsers' syntax and name rules, each answering "the error it would report, or None". A construct they do
# not model (xgrammar's macros and rule attributes, llguidance's special tokens and grammar references) is
# accepted, as before: the engine then decides.


_TOO_DEEP = "the grammar nests groups too deeply to be checked"
"""Refused past Python's recursion limit (some 250 nested groups; xgrammar takes 1,000, llguidance's Python
GBNF reader fails as here, and vLLM then answers 500)."""


class _Unmodelled(Exception):
    """The grammar uses a feature these checkers do not model; nothing is refused for it."""


_XG_NAME_FIRST = frozenset("_-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_XG_NAME = _XG_NAME_FIRST | frozenset("0123456789")
_XG_ESCAPES = frozenset("'\"?\\/abfnrtv0e")
_XG_CLASS_ESCAPES = frozenset("^$\\.*+?()[]{}|/-")
_XG_MACROS = frozenset(("TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch", "Regex", "Substring"))
_HEX = frozenset("0123456789abcdefABCDEF")
_XG_RULE_ATTRIBUTES = re.compile(r"(?m)^[ \t]*[A-Za-z_.-][\w.-]*[ \t]*\[[^\]\n]*\][ \t]*::=")


def _xg_escape(text: str, i: int, extra: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(code point, length) of the escape at ``text[i]`` (a backslash) as xgrammar reads it; length 0: invalid."""
    c = text[i + 1] if i + 1 < len(text) else ""
    if c and (c in extra or c in _XG_ESCAPES):
        return ord(c), 2
    if c == "x":
        j = i + 2
        while j < len(text) and text[j] in _HEX:
            j += 1
        return (int(text[i + 2 : j], 16), j - i) if j > i + 2 else (0, 0)
    if c in ("u", "U"):
        width = 4 if c == "u" else 8
        digits = text[i + 2 : i + 2 + width]
        if len(digits) == width and all(d in _HEX for d in digits):
            return int(digits, 16), width + 2
    return 0, 0


def _xgrammar_ebnf_error(text: str) -> str | None:
    """xgrammar's EBNF lexer and parser (grammar_parser.cc): the first error, or None if it parses.

    Tokens: rule names and references (ASCII letters, digits, ``_ - .``), ``::=``, strings with C, ``\\x``,
    ``\\u`` and ``\\U`` escapes (no raw newline), character classes (ranges low <= high, ``^`` negation,
    no ``\\d``-style escapes, no raw newline), ``( ) | * + ? {m} {m,} {m,n}``, the look-ahead ``(= ...)``
    and ``#`` comments. A rule name must start its line, every rule is defined once, references are to
    defined rules, ``root`` exists, and every alternative has at least one element.
    """
    if _XG_RULE_ATTRIBUTES.search(text):
        return None  # rule attributes (name[max_tokens=..] ::=): not modelled
    tokens: list[tuple[str, str, int]] = []  # (kind, value, line)
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
    except _GrammarSyntaxError as exc:
        return str(exc)
    except _Unmodelled:
        return None
    except RecursionError:
        return _TOO_DEEP
    return None


class _GrammarSyntaxError(Exception):
    """A grammar checker's error message."""


class _XgEbnfParser:
    """xgrammar's recursive-descent EBNF parser over the tokens of :func:`_xgrammar_ebnf_error`."""

    _SEQUENCE_END = frozenset(("|", ")", "(=", "rule", "eof"))

    def __init__(self, tokens: list[tuple[str, str, int]], names: set[str]) -> None:
        self.tokens = tokens
        self.names = names
        self.pos = 0

    def peek(self, delta: int = 0) -> tuple[str, str, int]:
        return self.tokens[min(self.pos + delta, len(self.tokens) - 1)]

    def expect(self, kind: str, message: str) -> None:
        if self.peek()[0] != kind:
            raise _GrammarSyntaxError(message)
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
                raise _GrammarSyntaxError(f"Expect integer, but got {self.peek()[1]}")
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
                    raise _GrammarSyntaxError(f"Expect integer, but got {self.peek()[1]}")
                high = int(self.peek()[1])
                self.pos += 1
                if high < low:
                    raise _GrammarSyntaxError(f"Lower bound is larger than upper bound: {low} > {high}")
                self.expect("}", "Expect }")
            elif self.peek()[0] == "}":
                self.pos += 1
            else:
                raise _GrammarSyntaxError("Expect ',' or '}' in repetition range")

    def element(self, depth: int) -> None:
        kind, value, _ = self.peek()
        if kind == "(":
            if depth >= 1000:
                raise _GrammarSyntaxError("Nest layer exceeded the maximum limit")
            self.pos += 1
            if self.peek()[0] == ")":
                self.pos += 1
                return
            self.choices(depth + 1)
            self.expect(")", "Expect )")
        elif kind in ("class", "str"):
            self.pos += 1
        elif kind == "ident" and value in _XG_MACROS:
            raise _Unmodelled
        elif kind == "ident":
            if value not in self.names:
                raise _GrammarSyntaxError(f'Rule "{value}" is not defined')
            self.pos += 1
        else:
            raise _GrammarSyntaxError(f"Expect element, but got {value}")


_LLG_LARK_SYNTAX = re.compile(r"(?m)^\s*(%llguidance\b|start\s*:)")


class _GbnfError(Exception):
    """An error of llguidance's GBNF-to-Lark converter, positioned as it prints them."""

    def __init__(self, text: str, pos: int, message: str) -> None:
        line = text.count("\n", 0, pos) + 1
        super().__init__(f"{message} at line {line}, {text[max(0, pos - 20) : pos]!r} ^ {text[pos : pos + 20]!r}")


_GBNF_FAILED = "Invalid grammar specification: Failed to convert the grammar from GBNF to Lark"


def _guidance_gbnf_error(text: str) -> str | None:
    """What vLLM reports when llguidance refuses an EBNF grammar (after xgrammar did), or None.

    llguidance reads GBNF (llama.cpp's grammar format) more loosely than xgrammar: an alternative may be
    empty (``"a" |``), a rule may be defined twice (the last one wins), a character class may hold a raw
    newline, names may contain any letter or digit. The converted grammar then goes through its Lark
    compiler, which refuses what the conversion passes through: a string with a raw newline, a character
    class that is not a valid regex (``[z-a]``), a repetition ``{m,n}`` with n < m.
    """
    if _LLG_LARK_SYNTAX.search(text):
        return _guidance_lark_error(text)
    try:
        rules = _GbnfParser(text).parse()
    except _GbnfError as exc:
        return f"{_GBNF_FAILED}: {exc}"
    except RecursionError:
        return f"{_GBNF_FAILED}: {_TOO_DEEP}"
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
            if len(digits) != width or not all(d in _HEX for d in digits):
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
                regex_error = _classify_regex(body + "]")
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


def _lark_tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) of llguidance's Lark lexer; %json / %llguidance take a JSON value as one token."""
    out: list[tuple[str, str, int]] = []
    i, line = 0, 1
    decoder = _stdlib_json.JSONDecoder()
    while i < len(text):
        match = _LARK_TOKEN.match(text, i)
        if match is None:
            raise _GrammarSyntaxError(f"{line}: lexer error")
        kind = match.lastgroup or ""
        value = match.group()
        if kind == "directive" and value not in _LARK_DIRECTIVES:
            raise _GrammarSyntaxError(f"{line}: lexer error")
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
                raise _GrammarSyntaxError(f"{line}: invalid JSON after {kind}") from None
            out.append(("json", _stdlib_json.dumps(parsed), line))
            line += text.count("\n", i, end)
            i = end
    out.append(("eof", "", line))
    return out


def _lark_error(text: str, *, xgrammar: bool) -> str | None:
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
    except _GrammarSyntaxError as exc:
        return str(exc)
    except _Unmodelled:
        return None
    except RecursionError:
        return _TOO_DEEP


def _guidance_lark_error(text: str) -> str | None:
    error = _lark_error(text, xgrammar=False)
    return None if error is None else f"Grammar error: {error}"


class _LarkParser:
    """The item, expansion and atom structure of a Lark grammar, and its name rules."""

    def __init__(self, tokens: list[tuple[str, str, int]], xgrammar: bool) -> None:
        self.tokens = tokens
        self.xgrammar = xgrammar
        self.pos = 0
        self.defined: dict[str, bool] = {}  # name -> is a terminal
        self.uses: list[tuple[str, str | None, int]] = []  # (name, terminal being defined or None, line)
        self.defining_terminal: str | None = None

    def peek(self, delta: int = 0) -> tuple[str, str, int]:
        return self.tokens[min(self.pos + delta, len(self.tokens) - 1)]

    def take(self) -> tuple[str, str, int]:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, kind: str) -> tuple[str, str, int]:
        if self.peek()[0] != kind:
            found = self.peek()
            raise _GrammarSyntaxError(f"{found[2]}: Expected token '{kind}', found {found[1]!r}")
        return self.take()

    def define(self, name: str, terminal: bool, line: int) -> None:
        if name in self.defined:
            raise _GrammarSyntaxError(f"at {line}: duplicate rule: {name!r}")
        self.defined[name] = terminal

    def parse(self) -> str | None:
        while True:
            while self.peek()[0] == "newline":
                self.pos += 1
            if self.peek()[0] == "eof":
                break
            self.item()
            if self.peek()[0] not in ("newline", "eof"):
                raise _GrammarSyntaxError(
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
                raise _GrammarSyntaxError(f"at {line}: priority not supported yet")
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
                raise _GrammarSyntaxError(f"at {line}: directive {value} is not supported")
            raise _Unmodelled
        else:
            raise _GrammarSyntaxError(f"{line}: expecting rule, token or statement (at {value!r})")

    def import_(self, line: int) -> None:
        parts = [self.take()]
        if parts[0][0] not in ("rule", "token"):
            raise _Unmodelled  # %import path (names) and relative imports
        while self.peek()[0] == "." and self.peek(1)[0] in ("rule", "token"):
            self.pos += 1
            parts.append(self.take())
        path = ".".join(part[1] for part in parts)
        if len(parts) != 2 or parts[0][1] != "common" or parts[1][1] not in _LARK_COMMON:
            raise _GrammarSyntaxError(f"at {line}: Unknown common regex: {path}")
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
                raise _GrammarSyntaxError(f"{self.peek()[2]}: Expected value")
            low = int(self.take()[1])
            if self.peek()[0] == "..":
                self.pos += 1
                high = int(self.expect("number")[1])
                if high < low:
                    raise _GrammarSyntaxError(f"range end must be >= start, got ({low}, {high})")

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
            verdict, reason = _classify_regex(body)
            if verdict == "error" or (self.xgrammar and verdict != "xgrammar"):
                raise _GrammarSyntaxError(f"at {line}: invalid regex {body!r}: {reason}")
        elif kind == "%json":
            schema = _stdlib_json.loads(self.expect("json")[1])
            error = _schema_error(schema, xgrammar=self.xgrammar) if isinstance(schema, dict) else None
            if error is not None:
                raise _GrammarSyntaxError(f"at {line}: failed to compile JSON schema: {error}")
        else:  # %regex, %lark, <special tokens>, @grammar references
            raise _Unmodelled


# ------------------------------------------------------------------------------------------ schemas


def _json_text(value: Any) -> str:
    """A JSON value as llguidance (serde_json) prints it in messages: compact."""
    return _stdlib_json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _number_text(value: float) -> str:
    """A bound as Rust prints an f64: 5.0 -> "5", 2.5 -> "2.5"."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SCHEMA_CHILD = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
_SCHEMA_CHILD_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_DEFINITIONS = frozenset(("$defs", "definitions"))
_SCHEMA_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_BOUND_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"))
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_XGRAMMAR_SIGNED_COUNTS = frozenset(("minLength", "maxLength", "minItems"))
"""The counts xgrammar takes negative (as no bound); llguidance wants every count non-negative."""
_FALSE_SCHEMA_ALLOWED = frozenset(("items", "additionalProperties"))
"""Where xgrammar takes the schema ``false``; anywhere else it refuses it ("cannot accept any value")."""
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _schema_error(schema: dict[str, Any], *, xgrammar: bool) -> str | None:
    """The first keyword error of xgrammar's (``xgrammar=True``) or llguidance's JSON-schema compiler, or None.

    Messages are llguidance's (vLLM's 400 for a schema both backends refuse is llguidance's), checked
    against vLLM 0.32 with xgrammar 0.2.8 and llguidance 1.7.6 (tests/data/structured-outputs-vectors.json).
    The two differ where xgrammar is more lenient, which decides the backend "auto" picks: it takes a
    negative ``minLength``, an empty ``anyOf``, ``type: []`` and a ``pattern`` with look-ahead (which it
    ignores), and it is stricter on one point: with ``additionalProperties`` unset or false (its strict
    mode), ``minProperties`` may not exceed the declared properties.
    """
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        keyword, node = stack.pop()
        if node is False and xgrammar and keyword not in _FALSE_SCHEMA_ALLOWED:
            return "Schema 'false' cannot accept any value"
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return "schema must be an object or boolean"
        error = _schema_node_error(node, schema, xgrammar=xgrammar)
        if error is not None:
            return error
        for key in _SCHEMA_CHILD:
            if key in node and not (xgrammar and key == "not"):  # xgrammar ignores "not" altogether
                stack.append((key, node[key]))
        for key in _SCHEMA_CHILD_MAPS:
            children = node.get(key)
            if isinstance(children, dict):
                stack.extend((key, child) for child in children.values())
        for key in _SCHEMA_CHILD_LISTS:
            stack.extend((key, child) for child in node.get(key, ()))
    return None


def _schema_node_error(node: dict[str, Any], root: dict[str, Any], *, xgrammar: bool) -> str | None:
    """The keyword checks of one schema object (its subschemas are walked by :func:`_schema_error`)."""
    schema_type = node.get("type")
    if schema_type is not None:
        names = schema_type if isinstance(schema_type, list) else [schema_type]
        if not isinstance(schema_type, str | list):
            return "type must be a string or array of strings"
        for name in names:
            if not isinstance(name, str):
                return "type must be a string"
            if name not in _JSON_TYPES:
                return f"Invalid type: {name}"
    for key in _SCHEMA_CHILD_MAPS:
        if key in node and key not in _SCHEMA_DEFINITIONS and not isinstance(node[key], dict):
            return f"{key} must be an object"  # definitions that are not an object are ignored, as both do
    for key in _SCHEMA_CHILD_LISTS:
        if key in node and not isinstance(node[key], list):
            return f"{key} must be an array"
    if "enum" in node:
        if not isinstance(node["enum"], list):
            return "enum must be an array"
        if not node["enum"]:
            return "Unsatisfiable schema: anyOf is empty"
    required = node.get("required")
    if required is not None:
        if not isinstance(required, list):
            return f"Expected array for 'required', got {_json_text(required)}"
        for item in required:
            if not isinstance(item, str):
                return f"Expected string for 'required' item, got {_json_text(item)}"
    for key in _COUNTS:
        value = node.get(key)
        if value is not None and not (_is_int(value) and (value >= 0 or (xgrammar and key in _XGRAMMAR_SIGNED_COUNTS))):
            return f"Expected positive integer for '{key}', got {_json_text(value)}"
    for low_key, high_key in _BOUND_PAIRS:
        low, high = node.get(low_key), node.get(high_key)
        if low is not None and high is not None and low > high:
            return f"Unsatisfiable schema: {low_key} ({low}) is greater than {high_key} ({high})"
    low, high = node.get("minProperties"), node.get("maxProperties")
    if low is not None and high is not None and low > high:
        return "Unsatisfiable schema: minProperties > maxProperties"
    if xgrammar and low is not None and node.get("additionalProperties", False) is False:
        declared = node.get("properties", {})
        if "patternProperties" not in node and low > len(declared):
            return "minProperties is greater than the number of properties, but additional properties aren't allowed"
    for key in _NUMBER_BOUNDS:
        if key in node and not _is_number(node[key]):
            return f"Expected f64 for '{key}', got {_json_text(node[key])}"
    error = _number_range_error(node)
    if error is not None:
        return error
    if "multipleOf" in node and not (_is_number(node["multipleOf"]) and node["multipleOf"] > 0):
        return "invalid multiple of"
    pattern = node.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            return f"Expected string for 'pattern', got {_json_text(pattern)}"
        verdict, reason = _classify_regex(pattern)
        ignored = xgrammar and pattern.startswith(("(?=", "(?!"))  # xgrammar drops a leading look-ahead
        if verdict == "error" and not ignored:
            return f"regex parse error: {reason}"
    fmt = node.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            return f"Expected string for 'format', got {_json_text(fmt)}"
        if fmt not in _GUIDANCE_FORMATS and "string" in _schema_types(node):
            return f"Unknown format: {fmt}"
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str):
            return f"$ref must be a string, got {_json_text(ref)}"
        if ref.startswith("#") and not _resolve_pointer(root, ref[1:]):
            return f"Pointer '{ref[1:]}' does not exist"
    allof = node.get("allOf")
    if isinstance(allof, list) and len(allof) >= 2:
        common: set[str] | None = None
        for sub in allof:
            if isinstance(sub, dict) and isinstance(sub.get("type"), str):
                types = {sub["type"], "integer"} if sub["type"] == "number" else {sub["type"]}
                common = types if common is None else common & types
        if common is not None and not common:
            return "Unsatisfiable schema: incompatible types"
    return None


def _number_range_error(node: dict[str, Any]) -> str | None:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None and low > high:
        return f"Unsatisfiable schema: minimum ({_number_text(low)}) is greater than maximum ({_number_text(high)})"
    xlow, xhigh = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if _is_number(xlow) and _is_number(xhigh) and xlow >= xhigh:
        relation = "equal to" if xlow == xhigh else "greater than"
        return (
            f"Unsatisfiable schema: exclusiveMinimum ({_number_text(xlow)}) is {relation} "
            f"exclusiveMaximum ({_number_text(xhigh)})"
        )
    return None


# ---------------------------------------------------------------------------------- structural tags


_JSON_SCHEMA_STYLES = frozenset(
    ("json", "qwen_xml", "minimax_xml", "minimax_m3_xml", "deepseek_xml", "glm_xml", "cohere_xml", "kimi_k3_xml",
     "deepseek_v4_1_xml")
)  # fmt: skip
_TOKEN_FORMATS = frozenset(("token", "exclude_token", "any_tokens", "token_triggered_tags", "token_dispatch"))
_UNTYPED_FORMAT_ORDER = (
    "tag", "const_string", "json_schema", "any_text", "sequence", "or", "triggered_tags", "tags_with_separator",
    "optional", "plus", "star", "repeat", "dispatch",
)  # fmt: skip
"""xgrammar's order of tries for a format without a ``type``: the first that parses is taken."""


def _structural_tag_xgrammar_error(tag: Any) -> str | None:
    """xgrammar 0.2.8's structural-tag parser and analyzer (structural_tag.cc), or the legacy form's checks.

    ``{"type": "structural_tag", "format": F}`` (``type`` optional): F is parsed recursively over the
    format types const_string, json_schema, qwen_xml_parameter, any_text, grammar, regex, sequence, or,
    tag, triggered_tags, tags_with_separator, optional, plus, star, repeat and dispatch, with their
    required fields; json_schema contents, grammars and regexes are compiled (here: checked), each
    triggered tag's begin must start with exactly one trigger, and a tag whose content is unbounded text
    needs a non-empty end. The token-based formats (token, any_tokens, token_dispatch, ...) need the
    tokenizer and are not modelled. The legacy ``{"structures": [...], "triggers": [...]}`` is one
    triggered_tags format with JSON-schema contents.
    """
    if not isinstance(tag, dict):
        return "Structural tag must be an object"
    if "structures" in tag:
        structures, triggers = tag["structures"], tag.get("triggers")
        if not isinstance(structures, list) or not all(
            isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys() for s in structures
        ):
            return "a structure lacks begin, schema or end"
        legacy = {
            "type": "triggered_tags",
            "triggers": triggers,
            "tags": [
                {"begin": s["begin"], "content": {"type": "json_schema", "json_schema": s["schema"]}, "end": s["end"]}
                for s in structures
            ],
        }
        return _format_error(legacy)
    if "type" in tag and tag["type"] != "structural_tag":
        return 'Structural tag\'s type must be a string "structural_tag"'
    if "format" not in tag:
        return "Structural tag must have a format field"
    return _format_error(tag["format"])


def _format_error(fmt: Any) -> str | None:
    if not isinstance(fmt, dict):
        return "Format must be an object"
    if "type" not in fmt:
        for kind in _UNTYPED_FORMAT_ORDER:
            if _typed_format_error(kind, fmt, untyped=True) is None:
                return None
        return f"Invalid format: {_json_text(fmt)}"
    kind = fmt["type"]
    if not isinstance(kind, str):
        return "Format's type must be a string"
    return _typed_format_error(kind, fmt, untyped=False)


def _unbounded(fmt: dict[str, Any]) -> bool:
    """Whether a format can match text of any length with nothing to stop it (xgrammar's IsUnlimited)."""
    kind = fmt.get("type")
    if kind == "any_text":
        return not fmt.get("excludes")
    if kind in ("sequence", "or"):
        return any(isinstance(e, dict) and _unbounded(e) for e in fmt.get("elements", ()))
    return kind == "triggered_tags"


def _typed_format_error(kind: str, fmt: dict[str, Any], *, untyped: bool) -> str | None:
    """The error of ``fmt`` read as a format of type ``kind``, or None."""
    if kind == "const_string":
        return None if isinstance(fmt.get("value"), str) else "ConstString format must have a value field"
    if kind in ("json_schema", "qwen_xml_parameter"):
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict | bool):
            return "JSON schema format must have a json_schema field with a object or boolean value"
        style = fmt.get("style", "json")
        if kind == "json_schema" and isinstance(style, str) and style not in _JSON_SCHEMA_STYLES:
            return "style is not one of xgrammar's JSON-schema styles"
        if "any_order" in fmt and not isinstance(fmt["any_order"], bool):
            return "any_order must be a boolean"
        return None if isinstance(schema, bool) else _schema_error(schema, xgrammar=True)
    if kind == "any_text":
        for budget in ("max_tokens", "max_chars"):
            value = fmt.get(budget)
            if value is not None and not (_is_number(value) and 0 <= value <= 2**31 - 1 and value == int(value)):
                return f"{budget} in any_text must be a non-negative 32-bit integer or null"
        if "excludes" not in fmt:
            return "Any text format should not have any fields other than type" if untyped else None
        excludes = fmt["excludes"]
        if not isinstance(excludes, list) or not all(isinstance(e, str) for e in excludes):
            return "AnyText format's excluded_strs field must be an array of strings"
        return None
    if kind == "grammar":
        grammar = fmt.get("grammar")
        if not isinstance(grammar, str) or not grammar:
            return "Grammar format must have a grammar field with a non-empty string"
        return _xgrammar_ebnf_error(grammar)
    if kind == "regex":
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            return "Regex format must have a pattern field with a non-empty string"
        verdict, reason = _classify_regex(pattern)
        return None if verdict == "xgrammar" else reason
    if kind in ("sequence", "or"):
        elements = fmt.get("elements")
        if not isinstance(elements, list):
            return f"{kind} format must have an elements field with an array"
        if not elements:
            return f"{kind} format must have at least one element"
        return next((e for e in map(_format_error, elements) if e is not None), None)
    if kind == "tag":
        return _tag_error(fmt, untyped=untyped)
    if kind in ("triggered_tags", "tags_with_separator"):
        return _tags_error(kind, fmt)
    if kind in ("optional", "plus", "star"):
        return _format_error(fmt["content"]) if "content" in fmt else f"{kind} format must have a content field"
    if kind == "repeat":
        low, high = fmt.get("min"), fmt.get("max")
        if not _is_number(low) or not _is_number(high):
            return "Repeat format must have min and max fields (numbers)"
        if high >= 0 and low > high:
            return "Repeat min must be <= max"
        if low < 0 or high < -1:
            return "Repeat min must be >= 0 and max -1 (unbounded) or >= 0"
        return _format_error(fmt["content"]) if "content" in fmt else "Repeat format must have a content field"
    if kind == "dispatch":
        rules = fmt.get("rules")
        if not isinstance(rules, list) or not rules:
            return "TagDispatch format must have a non-empty rules field"
        for rule in rules:
            if not (isinstance(rule, list) and len(rule) == 2 and isinstance(rule[0], str)):
                return "TagDispatch pair must be a 2-element array starting with a string"
            error = _format_error(rule[1])
            if error is not None:
                return error
        return None
    if kind in _TOKEN_FORMATS:
        return _token_format_error(fmt)
    return f"Format type not recognized: {kind}"


def _token_format_error(fmt: dict[str, Any]) -> str | None:
    """A token given by its string needs the tokenizer, which vLLM's validation does not give xgrammar.

    Token formats are otherwise not modelled (ids are taken as they are).
    """
    tokens = [fmt.get("token")]
    for key in ("exclude_tokens", "trigger_tokens"):
        value = fmt.get(key)
        tokens.extend(value if isinstance(value, list) else ())
    rules = fmt.get("rules")
    if isinstance(rules, list):
        tokens.extend(rule[0] for rule in rules if isinstance(rule, list) and rule)
    if any(isinstance(token, str) for token in tokens):
        return "Token string resolution requires tokenizer_info"
    return None


def _tag_error(fmt: Any, *, untyped: bool = False) -> str | None:
    if not isinstance(fmt, dict):
        return "Tag format must be an object"
    if not untyped and fmt.get("type", "tag") != "tag":
        return 'Tag format\'s type must be a string "tag"'
    begin = fmt.get("begin")
    if not isinstance(begin, str | dict):
        return "Tag format's begin field must be a string"
    if isinstance(begin, dict) and (error := _token_format_error(begin)) is not None:
        return error
    if "content" not in fmt:
        return "Tag format must have a content field"
    error = _format_error(fmt["content"])
    if error is not None:
        return error
    if "end" not in fmt:
        return "Tag format must have an end field"
    end = fmt["end"]
    ends = [end] if isinstance(end, str) else end if isinstance(end, list) else None
    if isinstance(end, dict):
        return _token_format_error(end)
    if ends is None or not ends or not all(isinstance(e, str) for e in ends):
        return "Tag format's end field must be a string or a non-empty array of strings"
    if isinstance(fmt["content"], dict) and _unbounded(fmt["content"]) and not any(ends):
        return "When the content is unlimited, at least one end string must be non-empty"
    return None


def _tags_error(kind: str, fmt: dict[str, Any]) -> str | None:
    triggers: list[str] = []
    if kind == "triggered_tags":
        raw = fmt.get("triggers")
        if not isinstance(raw, list):
            return "Triggered tags format must have a triggers field with an array"
        if not raw or not all(isinstance(t, str) and t for t in raw):
            return "Triggered tags format's triggers must be non-empty strings"
        triggers = raw
    tags = fmt.get("tags")
    if not isinstance(tags, list):
        return f"{kind} format must have a tags field with an array"
    for tag in tags:
        error = _tag_error(tag)
        if error is not None:
            return error
    if not tags:
        return f"{kind} format's tags must be non-empty"
    if kind == "tags_with_separator" and not isinstance(fmt.get("separator"), str):
        return "Tags with separator format's separator field must be a string"
    for flag in ("at_least_one", "stop_after_first"):
        if flag in fmt and not isinstance(fmt[flag], bool):
            return f"{flag} must be a boolean"
    if kind == "triggered_tags":
        for tag in tags:
            if not isinstance(tag["begin"], str):
                return "Tags in triggered_tags must have a string begin, not a token format"
            matched = sum(tag["begin"].startswith(t) for t in triggers)
            if matched != 1:
                return f"One tag {'matches multiple triggers' if matched else 'does not match any trigger'}"
    return None


def _structural_tag_guidance_error(tag: Any) -> str | None:
    """vLLM's guidance path for a structural tag (``serialize_guidance_grammar``): the legacy form only.

    It reads ``tag["triggers"]`` and ``tag["structures"]`` whatever the form, so a ``{"format": ...}`` tag
    that xgrammar refused ends as the KeyError ``'triggers'`` (vLLM's 400 reads "Invalid grammar
    specification: 'triggers'"). A legacy structure's schema is compiled lazily by llguidance, so an invalid
    schema there is accepted (xgrammar refused it; the engine's guidance backend then fails on it).
    """
    if not isinstance(tag, dict):
        kind = type(tag).__name__
        subscript = {
            "list": "list indices must be integers or slices, not str",
            "str": "string indices must be integers, not 'str'",
        }
        return f"Invalid grammar specification: {subscript.get(kind, f'{kind!r} object is not subscriptable')}"
    for key in ("triggers", "structures"):
        if key not in tag:
            return f"Invalid grammar specification: {key!r}"
    triggers, structures = tag["triggers"], tag["structures"]
    if not (
        isinstance(triggers, list)
        and all(isinstance(t, str) for t in triggers)
        and isinstance(structures, list)
        and all(isinstance(s, dict) and isinstance(s.get("begin", ""), str) for s in structures)
    ):
        # vLLM fails on these with a TypeError (a 400) or an AttributeError (a 500); a 400 here
        return "Invalid grammar specification: structures must be objects with a string begin, triggers strings"
    for structure in structures:
        if "begin" not in structure:
            return "Invalid grammar specification: 'begin'"
        begin = structure["begin"]
        if not any(begin.startswith(t) for t in triggers):
            return f"Trigger {begin} not found in triggers {triggers}"
        for key in ("schema", "end"):
            if key not in structure:
                return f"Invalid grammar specification: {key!r}"
    if not structures:
        return "No structural tags found in the grammar spec."
    return None
