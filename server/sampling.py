"""OpenAI request -> engine ``SamplingParams``, exactly as vLLM 0.32's OpenAI server builds them.

:func:`build_sampling_params` folds together what vLLM spreads over ``get_max_tokens`` (max_tokens),
``ChatCompletionRequest``/``CompletionRequest.to_sampling_params`` (defaults, mapping),
``SamplingParams.__post_init__``/``_verify_args``/``verify`` (normalization and validation),
``InputProcessor.process_inputs`` (watermarking, ``update_from_generation_config`` for EOS,
``update_from_tokenizer`` for bad words) and ``_validate_structured_outputs`` (grammar backend
resolution, ``choice`` -> EBNF). The result is what vLLM would put on the wire, key for key: the
same fields are set, with the same values, and floats vLLM creates at run time (``presence_penalty:
0.0`` ...) are fresh objects here too, so msgspec's identity-based ``omit_defaults`` writes the same
keys. ``n`` is always 1: the server fans ``request.n`` out with :func:`child_params`, like vLLM's
``ParentRequest``.

Anything the engine would refuse while decoding (engine-protocol.md 2.9) raises
:class:`~pyfront.server.openai_types.RequestValidationError` here, and the result always passes
:func:`pyfront.engine_client.validation.validate_sampling_params`.
"""

from __future__ import annotations

import json as _stdlib_json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from pyfront.engine_client.protocol import RequestOutputKind, SamplingParams, StructuredOutputsParams
from pyfront.engine_client.validation import validate_sampling_params
from pyfront.server.openai_types import (
    INT64_MAX,
    MAX_LOGPROBS,
    ChatCompletionRequest,
    CompletionRequest,
    RequestValidationError,
    merged_structured_outputs,
    parse_logit_bias,
)

__all__ = [
    "GENERATION_CONFIG_KEYS",
    "MAX_BAD_WORDS",
    "MAX_LOGPROB_TOKEN_IDS",
    "MAX_STRUCTURED_OUTPUT_JSON_NESTING",
    "STRUCTURED_OUTPUT_BACKENDS",
    "build_sampling_params",
    "check_json_nesting",
    "child_params",
    "choice_as_grammar",
    "generation_defaults_from_config",
    "grammar_is_likely_lark",
    "has_guidance_unsupported_json_features",
    "has_xgrammar_unsupported_json_features",
    "resolve_structured_outputs",
]

_SAMPLING_EPS = 1e-5
_MIN_TEMPERATURE = 1e-2
MAX_LOGPROB_TOKEN_IDS = 128
"""vLLM's ``MAX_LOGPROB_TOKEN_IDS``."""
MAX_BAD_WORDS = 128
"""vLLM's ``VLLM_MAX_NUM_BAD_WORDS`` default (token sequences after tokenization)."""
MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64
_STRUCTURAL_TAG_WRAPPER_NESTING = 16
STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
"""Values of vLLM's ``--structured-outputs-config.backend`` this module resolves."""

GENERATION_CONFIG_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)
"""The ``generation_config.json`` keys vLLM takes request defaults from (``get_diff_sampling_param``)."""

# vLLM's _DEFAULT_SAMPLING_PARAMS (same for chat and completions), in its order.
_OPENAI_DEFAULTS: tuple[tuple[str, float | int], ...] = (
    ("repetition_penalty", 1.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("temperature", 1.0),
    ("top_p", 1.0),
    ("top_k", 0),
    ("min_p", 0.0),
)
_PROTOCOL_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(SamplingParams)}


def _fresh(value: Any, name: str) -> Any:
    """``value``, but never the very object that is ``SamplingParams``' default for ``name``.

    vLLM's server always writes e.g. ``presence_penalty: 0.0`` because its value is a different
    float object than the class default; msgspec's ``omit_defaults`` compares by identity.
    """
    if type(value) is float and value is _PROTOCOL_DEFAULTS.get(name):
        return float(repr(value))
    return value


def generation_defaults_from_config(generation_config: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``ModelConfig.get_diff_sampling_param`` for ``--generation-config auto``.

    The non-null sampling keys of the model's ``generation_config.json`` (plus overrides the caller
    merged in), with ``max_new_tokens`` renamed to ``max_tokens``: the one list of those keys (the
    server's :class:`~pyfront.server.tokenizer.Tokenizer` builds its defaults with it). Pass the result as
    :func:`build_sampling_params`' ``generation_defaults``.
    """
    out = {key: generation_config[key] for key in GENERATION_CONFIG_KEYS if generation_config.get(key) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


def _fail(message: str, param: str | None = None) -> RequestValidationError:
    return RequestValidationError(message, param)


def build_sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_len: int,
    max_model_len: int,
    eos_token_id: int | None,
    extra_eos_token_ids: Sequence[int],
    vocab_size: int,
    generation_defaults: Mapping[str, Any],
    streaming: bool,
    tokenize: Callable[[str], list[int]] | None,
    structured_outputs_backend: str = "auto",
) -> SamplingParams:
    """The engine ``SamplingParams`` vLLM 0.32's OpenAI server sends for ``request`` (with ``n`` = 1).

    ``request`` must come from :func:`~pyfront.server.openai_types.decode_chat_request` /
    :func:`~pyfront.server.openai_types.decode_completion_request`. ``prompt_len``: tokens in the rendered
    (and truncated) prompt. ``eos_token_id``: the tokenizer's EOS id (vLLM's ``renderer.get_eos_token_id()``).
    ``extra_eos_token_ids``: ``generation_config.json``'s ``eos_token_id`` (int list; may repeat the primary
    id). ``vocab_size``: the model's vocabulary size (logits width). ``generation_defaults``: see
    :func:`generation_defaults_from_config`. ``streaming`` selects DELTA vs FINAL_ONLY. ``tokenize`` encodes
    a string *without* special tokens (needed only for ``bad_words``). ``structured_outputs_backend``: the
    server's ``--structured-outputs-config`` backend ("auto" by default).

    Raises RequestValidationError with vLLM's message for every request vLLM answers with 400.
    """
    is_chat = isinstance(request, ChatCompletionRequest)

    # --- max_tokens: TokenizeParams.__post_init__ and get_max_tokens --------------------------------
    if is_chat:
        if request.max_completion_tokens is not None:
            requested, max_param = request.max_completion_tokens, "max_completion_tokens"
        else:
            requested, max_param = request.max_tokens, "max_tokens"
    else:
        requested, max_param = request.max_tokens, "max_tokens"
    if (requested or 0) > max_model_len:
        raise _fail(
            f"{max_param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            max_param,
        )
    truncate = request.truncate_prompt_tokens
    input_len = prompt_len
    if truncate is not None:
        if truncate > max_model_len:
            raise _fail(
                f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len = {max_model_len}. "
                "Please request a smaller truncation size.",
                "truncate_prompt_tokens",
            )
        input_len = min(input_len, max_model_len if truncate == -1 else truncate)
    if max_model_len < input_len:
        raise _fail(
            f"Input length ({input_len}) exceeds model's maximum context length ({max_model_len}).",
            "messages" if is_chat else "prompt",
        )
    fallback = requested if requested is not None else generation_defaults.get("max_tokens")
    max_tokens = max_model_len - input_len if fallback is None else min(max_model_len - input_len, fallback)
    if not is_chat and request.echo and request.max_tokens == 0:
        max_tokens = 1  # echo without generation: vLLM asks the engine for one token and drops it
    if max_tokens < 1:
        raise _fail(f"max_tokens must be at least 1, got {max_tokens}.", max_param)
    min_tokens = request.min_tokens
    if min_tokens > max_tokens:
        raise _fail(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.", "min_tokens"
        )

    # --- user -> server default (generation config) -> OpenAI default -------------------------------
    values: dict[str, Any] = {}
    for name, default in _OPENAI_DEFAULTS:
        value = getattr(request, name)
        if value is None:
            value = generation_defaults.get(name)
            if value is None:
                value = default
        values[name] = value
    temperature = values["temperature"]
    if not (isinstance(temperature, int | float) and math.isfinite(temperature)):
        raise _fail(f"temperature must be a finite number, got {temperature}.", "temperature")
    if 0 < temperature < _MIN_TEMPERATURE:
        temperature = _MIN_TEMPERATURE
    n = request.n or 1
    top_p, top_k, min_p = values["top_p"], values["top_k"], values["min_p"]
    greedy = temperature < _SAMPLING_EPS
    if greedy:
        if n > 1:
            raise _fail(f"n must be 1 when using greedy sampling, got {n}.", "n")
        # __post_init__'s constants are the class defaults' objects (one module): vLLM omits these keys.
        top_p, top_k, min_p = _PROTOCOL_DEFAULTS["top_p"], 0, _PROTOCOL_DEFAULTS["min_p"]

    seed = request.seed
    if seed == -1:
        seed = None
    if seed is not None and n > 1 and seed + n - 1 > INT64_MAX:
        raise _fail(f"seed + n - 1 must fit in a 64-bit integer, got seed={seed} and n={n}.", "seed")

    # --- stop strings and stop tokens ----------------------------------------------------------------
    stop = request.stop
    stop_list: list[str] = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    output_text_buffer_length = 0
    if stop_list and not request.include_stop_str_in_output:
        output_text_buffer_length = max(len(s) for s in stop_list) - 1

    stop_token_ids = list(request.stop_token_ids) if request.stop_token_ids is not None else []
    default_stop_ids = generation_defaults.get("stop_token_ids")
    if default_stop_ids:
        stop_token_ids = [*stop_token_ids, *default_stop_ids] if stop_token_ids else list(default_stop_ids)
    stop_token_ids = list(dict.fromkeys(stop_token_ids))
    all_stop_token_ids: set[int] = set()  # built in vLLM's order: same set iteration order on the wire
    all_stop_token_ids.update(stop_token_ids)

    # --- logprobs ----------------------------------------------------------------------------------
    logprob_token_ids = request.logprob_token_ids or None
    if is_chat:
        logprobs = request.top_logprobs if request.logprobs and not logprob_token_ids else None
    else:
        logprobs = None if logprob_token_ids else request.logprobs
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is None and request.echo:
        prompt_logprobs = request.top_logprobs if is_chat else request.logprobs
    if logprobs:
        _check_logprobs_limit(logprobs, "sample", "top_logprobs" if is_chat else "logprobs", vocab_size)
    if logprob_token_ids is not None:
        if len(logprob_token_ids) > MAX_LOGPROB_TOKEN_IDS:
            raise _fail(
                f"Requested logprob_token_ids of length {len(logprob_token_ids)}, which is greater than "
                f"max allowed: {MAX_LOGPROB_TOKEN_IDS}",
                "logprob_token_ids",
            )
        _check_vocab(logprob_token_ids, "logprob_token_ids", vocab_size)
    if prompt_logprobs:
        _check_logprobs_limit(prompt_logprobs, "prompt", "prompt_logprobs", vocab_size)

    # --- token-id validation (SamplingParams.verify) ----------------------------------------------------
    logit_bias = parse_logit_bias(request.logit_bias) if request.logit_bias is not None else None
    if logit_bias:
        _check_vocab(list(logit_bias), "logit_bias", vocab_size)
    _check_vocab(stop_token_ids, "stop_token_ids", vocab_size)
    allowed = request.allowed_token_ids
    if allowed is not None:
        if not allowed:
            raise _fail("allowed_token_ids is not None and empty!", "allowed_token_ids")
        if any(t < 0 or t >= vocab_size for t in allowed):
            raise _fail("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids")
        allowed = list(allowed)

    # --- structured outputs --------------------------------------------------------------------------
    structured = merged_structured_outputs(request)
    structured_outputs = None
    if structured is not None:
        structured_outputs = resolve_structured_outputs(
            StructuredOutputsParams(
                json=structured.json,
                regex=structured.regex,
                choice=list(structured.choice) if structured.choice is not None else None,
                grammar=structured.grammar,
                json_object=structured.json_object,
                disable_any_whitespace=structured.disable_any_whitespace,
                disable_additional_properties=structured.disable_additional_properties,
                whitespace_pattern=structured.whitespace_pattern,
                structural_tag=structured.structural_tag,
            ),
            structured_outputs_backend,
        )

    # --- InputProcessor: feature gates ----------------------------------------------------------------
    thinking_token_budget = request.thinking_token_budget
    if thinking_token_budget == -1:
        thinking_token_budget = None
    if thinking_token_budget is not None:
        raise _fail(
            "thinking_token_budget is set but reasoning_config is not configured. Please set "
            "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.",
            "thinking_token_budget",
        )
    if not 0 <= request.routed_experts_prompt_start <= prompt_len:
        raise _fail(
            f"routed_experts_prompt_start must be between 0 and the prompt length ({prompt_len}), inclusive.",
            "routed_experts_prompt_start",
        )

    # --- update_from_generation_config: EOS ------------------------------------------------------------
    ignore_eos = request.ignore_eos
    if eos_token_id is not None:
        all_stop_token_ids.add(eos_token_id)
    if extra_eos_token_ids:
        eos_ids = {extra_eos_token_ids} if isinstance(extra_eos_token_ids, int) else set(extra_eos_token_ids)
        if eos_token_id is not None:
            eos_ids.discard(eos_token_id)
        if eos_ids:
            all_stop_token_ids.update(eos_ids)
            if not ignore_eos:
                eos_ids.update(stop_token_ids)
                stop_token_ids = list(eos_ids)
    if any(t < 0 or t >= vocab_size for t in all_stop_token_ids):
        raise _fail(f"EOS / stop token ids {sorted(all_stop_token_ids)} must be below the vocabulary size {vocab_size}")

    # --- update_from_tokenizer: bad words ---------------------------------------------------------------
    bad_words = list(dict.fromkeys(request.bad_words)) if request.bad_words else []
    bad_words_token_ids = _bad_words_token_ids(bad_words, tokenize, vocab_size) if bad_words else None

    extra_args = dict(request.vllm_xargs) if request.vllm_xargs else None
    rd = request.repetition_detection
    repetition_detection = (
        {"max_pattern_size": rd.max_pattern_size, "min_pattern_size": rd.min_pattern_size, "min_count": rd.min_count}
        if rd is not None
        else None
    )

    params = SamplingParams(
        n=1,
        presence_penalty=_fresh(values["presence_penalty"], "presence_penalty"),
        frequency_penalty=_fresh(values["frequency_penalty"], "frequency_penalty"),
        repetition_penalty=_fresh(values["repetition_penalty"], "repetition_penalty"),
        temperature=_fresh(temperature, "temperature"),
        watermarking=False,
        top_p=top_p if greedy else _fresh(top_p, "top_p"),
        top_k=top_k,
        min_p=min_p if greedy else _fresh(min_p, "min_p"),
        seed=seed,
        stop=stop_list,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=list(logprob_token_ids) if logprob_token_ids is not None else None,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY,
        stream_interval=request.stream_interval,
        skip_clone=True,
        output_text_buffer_length=output_text_buffer_length,
        eos_token_id=None if ignore_eos else eos_token_id,
        all_stop_token_ids=list(all_stop_token_ids),
        structured_outputs=structured_outputs,
        logit_bias=logit_bias,
        allowed_token_ids=allowed,
        extra_args=extra_args,
        bad_words=bad_words,
        bad_words_token_ids=bad_words_token_ids,
        skip_reading_prefix_cache=prompt_logprobs is not None,
        thinking_token_budget=None,
        repetition_detection=repetition_detection,
        routed_experts_prompt_start=request.routed_experts_prompt_start,
    )
    try:
        validate_sampling_params(params)
    except ValueError as exc:  # only reachable with an invalid server configuration (generation defaults)
        raise _fail(f"Invalid sampling parameters: {exc}") from None
    return params


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sampling params of child ``index`` of an ``n > 1`` request (vLLM's ``ParentRequest``).

    ``n`` = 1 and, when the parent is seeded, ``seed + index``; an unseeded parent's params are
    returned as they are (vLLM shares one child params object then). Children go to the engine as
    ``f"{index}_{request_id}"``.
    """
    if params.seed is None:
        return params if params.n == 1 else msgspec.structs.replace(params, n=1)
    return msgspec.structs.replace(params, n=1, seed=params.seed + index)


def _check_vocab(ids: Sequence[int], name: str, vocab_size: int) -> None:
    invalid = [t for t in ids if t < 0 or t >= vocab_size]
    if invalid:
        raise _fail(
            f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: {vocab_size}", name
        )


def _check_logprobs_limit(value: int, kind: str, param: str, vocab_size: int) -> None:
    requested = vocab_size if value == -1 else value
    if requested > MAX_LOGPROBS:
        raise _fail(
            f"Requested {kind} logprobs of {requested}, which is greater than max allowed: {MAX_LOGPROBS}", param
        )


def _bad_words_token_ids(
    bad_words: list[str], tokenize: Callable[[str], list[int]] | None, vocab_size: int
) -> list[list[int]]:
    """``SamplingParams.update_from_tokenizer``: each word without and (if it makes a new word) with a space."""
    if tokenize is None:
        raise _fail("bad_words needs the server's tokenizer, which is not available.", "bad_words")
    out: list[list[int]] = []
    for bad_word in bad_words:
        for add_prefix_space in (False, True):
            prompt = (" " if add_prefix_space else "") + bad_word.lstrip()
            ids = list(tokenize(prompt))
            if not ids:
                if not add_prefix_space:
                    raise _fail("bad_words entries must tokenize to at least one token.", "bad_words")
                continue
            if not add_prefix_space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
                if len(out) > MAX_BAD_WORDS:
                    raise _fail(
                        f"Too many bad words after tokenization: {len(out)}. The max number is {MAX_BAD_WORDS}.",
                        "bad_words",
                    )
    invalid = [t for ids in out for t in ids if t < 0 or t >= vocab_size]
    if invalid:
        raise _fail(
            f"The model vocabulary size is {vocab_size}, but the following tokens were specified as bad: "
            f"{invalid}. All token id values should be integers satisfying: 0 <= token_id <= {vocab_size - 1}.",
            "bad_words",
        )
    return out


# --------------------------------------------------------------------------------------
# Structured outputs: SamplingParams._validate_structured_outputs without xgrammar/llguidance
# --------------------------------------------------------------------------------------


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
        raise _fail(f"Choice '{so.choice}' cannot be an empty list", param)
    if isinstance(so.grammar, str) and not so.grammar.strip():
        raise _fail("structured_outputs.grammar cannot be an empty string", param)
    if isinstance(so.json, str) and not so.json.strip():
        raise _fail("structured_outputs.json cannot be an empty string", param)
    check_json_nesting(so.json)
    check_json_nesting(so.structural_tag, structural_tag=True)
    if so.json_object is False:
        raise _fail(
            "structured_outputs.json_object must be True if set; omit structured_outputs to disable structured outputs",
            param,
        )
    if so.regex and "\x00" in so.regex:
        raise _fail("structured_outputs.regex must not contain a NUL character ('\\x00')", param)
    if isinstance(so.structural_tag, str) and not so.structural_tag.strip():
        raise _fail("structured_outputs.structural_tag cannot be an empty string", param)

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
            raise _fail(str(exc), param) from None
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
        raise _fail("Invalid JSON grammar specification.", "structured_outputs") from None


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
        raise _fail(
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
        raise _fail("Invalid grammar specification: Expecting object schema to apply options", "structured_outputs")
    for node in _subschemas(schema):
        schema_type = node.get("type")
        names = [schema_type] if isinstance(schema_type, str) else schema_type if isinstance(schema_type, list) else []
        for name in names:
            if isinstance(name, str) and name not in _JSON_TYPES:
                raise _fail(f"Grammar error: Invalid type: {name}", "structured_outputs")
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and not _resolve_pointer(schema, ref[1:]):
            raise _fail(f"Grammar error: Pointer '{ref[1:]}' does not exist", "structured_outputs")


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
            raise _fail(f"Grammar error: invalid regex {so.regex!r}: {reason}", param)
    if so.json and isinstance(schema, dict):
        for node in _subschemas(schema):
            unimplemented = [key for key in _GUIDANCE_UNIMPLEMENTED if key in node]
            if unimplemented:
                raise _fail(f"Grammar error: Unimplemented keys: {_stdlib_json.dumps(unimplemented)}", param)
            fmt = node.get("format")
            if "string" in _schema_types(node) and isinstance(fmt, str) and fmt not in _GUIDANCE_FORMATS:
                raise _fail(f"Grammar error: Unknown format: {fmt}", param)
            pattern = node.get("pattern")
            if isinstance(pattern, str) and _classify_regex(pattern)[0] == "error":
                raise _fail(f"Grammar error: invalid regex {pattern!r}: {_classify_regex(pattern)[1]}", param)
    if so.grammar and not grammar_is_likely_lark(so.grammar) and not _EBNF_ROOT.search(_strip_comments(so.grammar)):
        raise _fail(
            "Invalid grammar specification: Failed to convert the grammar from GBNF to Lark: No 'root' rule found",
            param,
        )
    if so.structural_tag:
        try:
            _check_structural_tag(so.structural_tag)
        except _BackendRejects as exc:
            raise _fail(str(exc), param) from None


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
        chars[k + 1] == "-" and chars[k] is not None and chars[k + 2] is not None and chars[k] > chars[k + 2]  # type: ignore[operator]
        for k in range(len(chars) - 2)
    )


_QUANTIFIER = re.compile(r"\{(\d*)(,(\d*))?\}")


def _quantifier_end(rx: str, start: int) -> int:
    """End index (the ``}``) of a ``{m}``/``{m,}``/``{m,n}``/``{,n}`` quantifier at ``start``, else -1."""
    match = _QUANTIFIER.match(rx, start)
    if match is None or (not match.group(1) and not match.group(3)):
        return -1
    return match.end() - 1
