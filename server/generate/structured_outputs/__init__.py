"""Structured outputs: the request's constraint checked and its grammar backend resolved, as vLLM's front end.

:func:`resolve_structured_outputs` is vLLM 0.32's ``_validate_structured_outputs`` (``v1/engine/input_processor.py``)
with the backend checks it runs in the front-end process (xgrammar's and guidance's schema, regex and grammar
checks, mirrored here so that no grammar library is imported): what vLLM refuses with 400 is refused here
with a message of the same kind (mostly the same text), and "auto" falls back from xgrammar to guidance where
vLLM's does. This module is that resolution (which backend, what each backend's validation runs) and vLLM's
two grammar helpers; the mirrors are small re-implementations, each answering "the error this library would
report", one module per kind of constraint, each importing only those listed after it (tests/test_layout.py):

* :mod:`pyfront.server.generate.structured_outputs.structural_tag`: xgrammar's structural-tag format parser,
  and vLLM's guidance path for a structural tag.
* :mod:`pyfront.server.generate.structured_outputs.ebnf`: xgrammar's EBNF parser and llguidance's
  GBNF-to-Lark reader.
* :mod:`pyfront.server.generate.structured_outputs.lark`: a Lark syntax and name check (both libraries'
  dialects).
* :mod:`pyfront.server.generate.structured_outputs.schema`: JSON schemas: the nesting limit, the features vLLM
  sends away from xgrammar or guidance, a keyword checker (llguidance's messages, xgrammar's leniencies).
* :mod:`pyfront.server.generate.structured_outputs.regex`: a regex scanner (which of the two accept a regex).
* :mod:`pyfront.server.generate.structured_outputs.grammar`: what the grammar checkers share.

tests/data/structured-outputs-vectors.json holds vLLM's verdicts on 342 cases (kept true by the real-engine
tier); pyfront agrees with every one. Each check is one pass over the constraint, so a valid request pays time
linear in its size.
"""

from __future__ import annotations

import json as _stdlib_json
import re
from typing import Any

from pyfront.engine_client.protocol import StructuredOutputsParams
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.structured_outputs.ebnf import guidance_gbnf_error, xgrammar_ebnf_error
from pyfront.server.generate.structured_outputs.lark import LLG_LARK_SYNTAX, guidance_lark_error, lark_error
from pyfront.server.generate.structured_outputs.regex import classify_regex
from pyfront.server.generate.structured_outputs.schema import (
    GUIDANCE_UNIMPLEMENTED,
    check_json_nesting,
    check_schema_shape,
    has_guidance_unsupported_json_features,
    has_xgrammar_unsupported_json_features,
    parsed_schema,
    schema_error,
    subschemas,
)
from pyfront.server.generate.structured_outputs.structural_tag import (
    structural_tag_guidance_error,
    structural_tag_xgrammar_error,
)

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
        schema = parsed_schema(so.json)
        check_schema_shape(schema)

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


def _xgrammar_validate(so: StructuredOutputsParams, schema: Any) -> None:
    """``validate_xgrammar_grammar`` without xgrammar: raise _BackendRejects where xgrammar would fail."""
    if so.regex:
        verdict, reason = classify_regex(so.regex)
        if verdict != "xgrammar":
            raise _BackendRejects(f"Failed to transform regex into a grammar: {reason}")
    if so.choice:
        so.grammar = choice_as_grammar(so.choice)
        so.choice = None
        return
    if so.json:
        if has_xgrammar_unsupported_json_features(schema):
            raise _BackendRejects("The provided JSON schema contains features not supported by xgrammar.")
        error = schema_error(schema, xgrammar=True)
        if error is not None:
            raise _BackendRejects(f"Failed to transform json schema into a grammar: {error}")
        return
    if so.grammar:
        lark = grammar_is_likely_lark(so.grammar)
        if (lark_error(so.grammar, xgrammar=True) if lark else xgrammar_ebnf_error(so.grammar)) is not None:
            raise _BackendRejects("Invalid grammar specification.")
        return
    if so.structural_tag:
        try:
            tag = _stdlib_json.loads(so.structural_tag)
        except (ValueError, RecursionError):
            raise _BackendRejects("Invalid structural tag specification.") from None
        if structural_tag_xgrammar_error(tag) is not None:
            raise _BackendRejects("Invalid structural tag specification.")


def _guidance_validate(so: StructuredOutputsParams, schema: Any) -> None:
    """``validate_guidance_grammar`` without llguidance: its refusals as the 400s vLLM turns them into."""
    param = "structured_outputs"
    error: str | None = None
    if so.json and isinstance(schema, dict):
        for node in subschemas(schema):
            unimplemented = [key for key in GUIDANCE_UNIMPLEMENTED if key in node]
            if unimplemented:
                raise RequestValidationError(
                    f"Grammar error: Unimplemented keys: {_stdlib_json.dumps(unimplemented)}", param
                )
        keyword_error = schema_error(schema, xgrammar=False)
        error = None if keyword_error is None else f"Grammar error: {keyword_error}"
    elif so.regex:
        verdict, reason = classify_regex(so.regex)
        if verdict == "error":
            error = f"Grammar error: invalid regex {so.regex!r}: {reason}"
    elif so.grammar:
        lark = grammar_is_likely_lark(so.grammar) and LLG_LARK_SYNTAX.search(so.grammar)
        error = guidance_lark_error(so.grammar) if lark else guidance_gbnf_error(so.grammar)
    elif so.structural_tag:
        try:
            tag = _stdlib_json.loads(so.structural_tag)
        except ValueError as exc:
            raise RequestValidationError(f"Invalid grammar specification: {exc}", param) from None
        error = structural_tag_guidance_error(tag)
    if error is not None:
        raise RequestValidationError(error, param)
