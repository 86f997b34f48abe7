"""JSON schemas: the nesting limit, the features that send a schema away from xgrammar or guidance, the keyword checks.

vLLM refuses a constraint nested too deeply before any backend sees it (:func:`check_json_nesting`, structural
tags included). "auto" then passes over xgrammar for the schema features vLLM's
``has_xgrammar_unsupported_json_features`` names, and over guidance (to outlines) for ``patternProperties``;
the backend picked compiles the schema, and :func:`schema_error` is the first error its compiler would report. The
grammar and structural-tag checkers compile inline schemas (``%json``, ``json_schema`` formats) with it, and
use the helpers that print JSON values and numbers as llguidance's messages do.
"""

from __future__ import annotations

import json as _stdlib_json
from collections.abc import Callable
from typing import Any, TypeGuard

from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.structured_outputs.regex import classify_regex

MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64


_STRUCTURAL_TAG_WRAPPER_NESTING = 16


def parsed_schema(spec: str | dict[str, Any]) -> Any:
    """The ``json`` constraint as a schema (a string is parsed), or vLLM's 400 for JSON that does not parse."""
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


def check_schema_shape(schema: Any) -> None:
    """A schema that is not an object is refused whatever the backend (llguidance's message, as vLLM's)."""
    if not isinstance(schema, dict):
        raise RequestValidationError(
            "Invalid grammar specification: Expecting object schema to apply options", "structured_outputs"
        )


_STRING_SUPPORTED_FORMATS = frozenset(
    (
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
        "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    )
)  # fmt: skip


_GUIDANCE_FORMATS = _STRING_SUPPORTED_FORMATS | {"unknown"}


_JSON_TYPES = frozenset(("string", "number", "integer", "boolean", "object", "array", "null"))


GUIDANCE_UNIMPLEMENTED = (
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


def subschemas(schema: Any) -> list[dict[str, Any]]:
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


def json_text(value: Any) -> str:
    """A JSON value as llguidance (serde_json) prints it in messages: compact."""
    return _stdlib_json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _number_text(value: float) -> str:
    """A bound as Rust prints an f64: 5.0 -> "5", 2.5 -> "2.5"."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def is_number(value: Any) -> TypeGuard[float]:
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


def schema_error(schema: dict[str, Any], *, xgrammar: bool) -> str | None:
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
    """The keyword checks of one schema object (its subschemas are walked by :func:`schema_error`)."""
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
            return f"Expected array for 'required', got {json_text(required)}"
        for item in required:
            if not isinstance(item, str):
                return f"Expected string for 'required' item, got {json_text(item)}"
    for key in _COUNTS:
        value = node.get(key)
        if value is not None and not (_is_int(value) and (value >= 0 or (xgrammar and key in _XGRAMMAR_SIGNED_COUNTS))):
            return f"Expected positive integer for '{key}', got {json_text(value)}"
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
        if key in node and not is_number(node[key]):
            return f"Expected f64 for '{key}', got {json_text(node[key])}"
    error = _number_range_error(node)
    if error is not None:
        return error
    if "multipleOf" in node and not (is_number(node["multipleOf"]) and node["multipleOf"] > 0):
        return "invalid multiple of"
    pattern = node.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            return f"Expected string for 'pattern', got {json_text(pattern)}"
        verdict, reason = classify_regex(pattern)
        ignored = xgrammar and pattern.startswith(("(?=", "(?!"))  # xgrammar drops a leading look-ahead
        if verdict == "error" and not ignored:
            return f"regex parse error: {reason}"
    fmt = node.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            return f"Expected string for 'format', got {json_text(fmt)}"
        if fmt not in _GUIDANCE_FORMATS and "string" in _schema_types(node):
            return f"Unknown format: {fmt}"
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str):
            return f"$ref must be a string, got {json_text(ref)}"
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
    if is_number(xlow) and is_number(xhigh) and xlow >= xhigh:
        relation = "equal to" if xlow == xhigh else "greater than"
        return (
            f"Unsatisfiable schema: exclusiveMinimum ({_number_text(xlow)}) is {relation} "
            f"exclusiveMaximum ({_number_text(xhigh)})"
        )
    return None
