"""Structural tags: xgrammar's structural-tag format parser, and vLLM's guidance path for the legacy form.

xgrammar parses a ``structural_tag`` constraint (structural_tag.cc) and compiles its contents: JSON schemas
(:mod:`.schema`), EBNF grammars (:mod:`.ebnf`), regexes (:mod:`.regex`). When it refuses, vLLM's guidance path
reads the legacy ``{"structures": [...], "triggers": [...]}`` form only. How deeply a tag may nest is
:func:`.schema.check_json_nesting`'s.
"""

from __future__ import annotations

from typing import Any

from pyfront.server.generate.structured_outputs.ebnf import xgrammar_ebnf_error
from pyfront.server.generate.structured_outputs.regex import classify_regex
from pyfront.server.generate.structured_outputs.schema import is_number, json_text, schema_error

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


def structural_tag_xgrammar_error(tag: Any) -> str | None:
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
        return f"Invalid format: {json_text(fmt)}"
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
        return None if isinstance(schema, bool) else schema_error(schema, xgrammar=True)
    if kind == "any_text":
        for budget in ("max_tokens", "max_chars"):
            value = fmt.get(budget)
            if value is not None and not (is_number(value) and 0 <= value <= 2**31 - 1 and value == int(value)):
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
        return xgrammar_ebnf_error(grammar)
    if kind == "regex":
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            return "Regex format must have a pattern field with a non-empty string"
        verdict, reason = classify_regex(pattern)
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
        if not is_number(low) or not is_number(high):
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


def structural_tag_guidance_error(tag: Any) -> str | None:
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
