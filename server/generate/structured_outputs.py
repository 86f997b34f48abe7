"""Structured outputs: the request's constraint checked and its grammar backend resolved, as vLLM's front end.

:func:`resolve_structured_outputs` is vLLM 0.32's ``_validate_structured_outputs`` (``v1/engine/input_processor.py``)
with the backend checks it runs in the front-end process (xgrammar's and guidance's schema, regex and grammar
checks, mirrored here so that no grammar library is imported): what vLLM refuses with 400 is refused here
with the same message, and "auto" falls back from xgrammar to guidance where vLLM's does.
"""

from __future__ import annotations

import json as _stdlib_json
import re
from collections.abc import Callable
from typing import Any

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
        _check_schema_sanity(schema)

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


def _check_schema_sanity(schema: Any) -> None:
    """Schema errors every backend refuses in vLLM (it answers 400 after trying xgrammar and guidance)."""
    if not isinstance(schema, dict):
        raise RequestValidationError(
            "Invalid grammar specification: Expecting object schema to apply options", "structured_outputs"
        )
    for node in _subschemas(schema):
        schema_type = node.get("type")
        names = [schema_type] if isinstance(schema_type, str) else schema_type if isinstance(schema_type, list) else []
        for name in names:
            if isinstance(name, str) and name not in _JSON_TYPES:
                raise RequestValidationError(f"Grammar error: Invalid type: {name}", "structured_outputs")
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and not _resolve_pointer(schema, ref[1:]):
            raise RequestValidationError(f"Grammar error: Pointer '{ref[1:]}' does not exist", "structured_outputs")


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
        return
    if so.grammar:
        if not grammar_is_likely_lark(so.grammar):
            ebnf = _strip_comments(so.grammar)
            if not _EBNF_ROOT.search(ebnf) or _EBNF_EMPTY_RULE.search(ebnf):
                raise _BackendRejects("Invalid grammar specification.")
        return
    if so.structural_tag:
        _check_structural_tag(so.structural_tag)


def _guidance_validate(so: StructuredOutputsParams, schema: Any) -> None:
    """The llguidance refusals vLLM turns into 400s (for what pyfront can tell without llguidance)."""
    param = "structured_outputs"
    if so.regex:
        verdict, reason = _classify_regex(so.regex)
        if verdict == "error":
            raise RequestValidationError(f"Grammar error: invalid regex {so.regex!r}: {reason}", param)
    if so.json and isinstance(schema, dict):
        for node in _subschemas(schema):
            unimplemented = [key for key in _GUIDANCE_UNIMPLEMENTED if key in node]
            if unimplemented:
                raise RequestValidationError(
                    f"Grammar error: Unimplemented keys: {_stdlib_json.dumps(unimplemented)}", param
                )
            fmt = node.get("format")
            if "string" in _schema_types(node) and isinstance(fmt, str) and fmt not in _GUIDANCE_FORMATS:
                raise RequestValidationError(f"Grammar error: Unknown format: {fmt}", param)
            pattern = node.get("pattern")
            if isinstance(pattern, str) and _classify_regex(pattern)[0] == "error":
                raise RequestValidationError(
                    f"Grammar error: invalid regex {pattern!r}: {_classify_regex(pattern)[1]}", param
                )
    if so.grammar and not grammar_is_likely_lark(so.grammar) and not _EBNF_ROOT.search(_strip_comments(so.grammar)):
        raise RequestValidationError(
            "Invalid grammar specification: Failed to convert the grammar from GBNF to Lark: No 'root' rule found",
            param,
        )
    if so.structural_tag:
        try:
            _check_structural_tag(so.structural_tag)
        except _BackendRejects as exc:
            raise RequestValidationError(str(exc), param) from None


def _check_structural_tag(payload: str) -> None:
    try:
        tag = _stdlib_json.loads(payload)
    except (ValueError, RecursionError):
        raise _BackendRejects("Invalid structural tag specification.") from None
    ok = isinstance(tag, dict) and (("structures" in tag and "triggers" in tag) or "format" in tag)
    if not ok:
        raise _BackendRejects("Invalid structural tag specification.")


_EBNF_ROOT = re.compile(r"(?m)^\s*root\s*::=")


_EBNF_EMPTY_RULE = re.compile(r"(?m)::=\s*$")


def _strip_comments(grammar: str) -> str:
    return "\n".join(re.sub(r"(#|//).*$", "", line) for line in grammar.split("\n"))


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
        if c in "*+?" or (c == "{" and _quantifier_end(rx, i) > 0):
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


def _has_reversed_range(body: str) -> bool:
    chars: list[str | None] = []
    i = 0
    while i < len(body):
        if body[i] == "\\":
            chars.append(None)  # escapes never form a checked range endpoint
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
