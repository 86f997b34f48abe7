"""The request-level checks vLLM 0.32's OpenAI server makes in its pydantic validators, after decoding.

``vllm/entrypoints/openai/chat_completion/protocol.py``, ``.../completion/protocol.py``,
``vllm/entrypoints/generate/base/protocol.py``, plus the range checks of ``SamplingParams._verify_args`` that
do not depend on the model. Everything that needs the prompt length, the vocabulary or the generation config
is checked in :mod:`pyfront.server.generate.sampling`. Every failure raises
:class:`~pyfront.server.errors.RequestValidationError` (an HTTP 400) with ``param`` naming the field.
"""

from __future__ import annotations

import json as _stdlib_json
import math
import re
from typing import Any

import msgspec
from msgspec import UNSET

from pyfront.server.errors import RequestValidationError
from pyfront.server.openai.responses_types import InputItem, NamedResponsesToolChoice, ResponsesRequest
from pyfront.server.openai.types import (
    _CACHE_SALT_FORBIDDEN,
    _MAX_CACHE_SALT_LENGTH,
    _TEXT_PART_TYPES,
    INT64_MAX,
    INT64_MIN,
    MAX_COMPLETION_PROMPTS,
    MAX_LOGPROBS,
    MAX_N_SEQUENCES,
    MAX_STOP_STRINGS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    NamedToolChoice,
    RepetitionDetection,
    ResponseFormat,
    StructuredOutputsRequest,
    XArgValue,
)


def _check_int64(value: int | None, name: str) -> None:
    if value is not None and not INT64_MIN <= value <= INT64_MAX:
        raise RequestValidationError(f"{name} must be a 64-bit signed integer, got {value}.", name)


def _check_finite_range(value: float | None, name: str, low: float, high: float) -> None:
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise RequestValidationError(f"{name} must be in [{low:g}, {high:g}], got {value}.", name)


def _check_sampling_ranges(r: ChatCompletionRequest | CompletionRequest) -> None:
    """The checks of ``SamplingParams._verify_args`` on values the request sets explicitly."""
    _check_finite_range(r.presence_penalty, "presence_penalty", -2.0, 2.0)
    _check_finite_range(r.frequency_penalty, "frequency_penalty", -2.0, 2.0)
    rp = r.repetition_penalty
    if rp is not None:
        if not math.isfinite(rp):
            raise RequestValidationError(f"repetition_penalty must be a finite number, got {rp}.", "repetition_penalty")
        if rp <= 0.0:
            raise RequestValidationError(
                f"repetition_penalty must be greater than zero, got {rp}.", "repetition_penalty"
            )
    t = r.temperature
    if t is not None:
        if not math.isfinite(t):
            raise RequestValidationError(f"temperature must be a finite number, got {t}.", "temperature")
        if t < 0.0:
            raise RequestValidationError(f"temperature must be non-negative, got {t}.", "temperature")
        if t > 2.0:
            raise RequestValidationError(f"temperature must be in [0, 2], got {t}.", "temperature")
    if r.top_p is not None and not (math.isfinite(r.top_p) and 0.0 < r.top_p <= 1.0):
        raise RequestValidationError(f"top_p must be in (0, 1], got {r.top_p}.", "top_p")
    if r.top_k is not None and r.top_k < -1:
        raise RequestValidationError(f"top_k must be 0 (disable), or at least 1, got {r.top_k}.", "top_k")
    if r.top_k is not None and r.top_k > INT64_MAX:
        raise RequestValidationError(f"top_k must be a 64-bit integer, got {r.top_k}.", "top_k")
    if r.min_p is not None and not (math.isfinite(r.min_p) and 0.0 <= r.min_p <= 1.0):
        raise RequestValidationError(f"min_p must be in [0, 1], got {r.min_p}.", "min_p")
    if r.min_tokens < 0:
        raise RequestValidationError(
            f"min_tokens must be greater than or equal to 0, got {r.min_tokens}.", "min_tokens"
        )
    _check_int64(r.min_tokens, "min_tokens")
    _check_int64(r.seed, "seed")
    _check_int64(r.priority, "priority")
    stop = r.stop
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_STRINGS:
            raise RequestValidationError(
                f"stop may contain at most {MAX_STOP_STRINGS} strings, got {len(stop)}.", "stop"
            )
        if not all(stop):
            raise RequestValidationError("stop cannot contain an empty string.", "stop")
    elif stop == "":
        raise RequestValidationError("stop cannot contain an empty string.", "stop")
    if r.bad_words is not None and not all(r.bad_words):
        raise RequestValidationError(
            f"bad_words cannot contain an empty string. Got bad_words={r.bad_words}", "bad_words"
        )
    if r.truncate_prompt_tokens is not None and not -1 <= r.truncate_prompt_tokens <= INT64_MAX:
        raise RequestValidationError(
            "truncate_prompt_tokens must be -1 or a non-negative integer.", "truncate_prompt_tokens"
        )
    if r.stream_interval is not None and r.stream_interval < 1:
        raise RequestValidationError(f"stream_interval must be at least 1, got {r.stream_interval}.", "stream_interval")
    _check_int64(r.stream_interval, "stream_interval")
    if r.routed_experts_prompt_start < 0:
        raise RequestValidationError("routed_experts_prompt_start must be non-negative.", "routed_experts_prompt_start")
    budget = r.thinking_token_budget
    if budget is not None and budget < -1:
        raise RequestValidationError(
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
            "thinking_token_budget",
        )
    if r.logit_bias is not None:
        parse_logit_bias(r.logit_bias)
    _check_cache_salt(r.cache_salt)
    if r.vllm_xargs:
        _check_xargs(r.vllm_xargs)
    if r.repetition_detection is not None:
        _check_repetition_detection(r.repetition_detection)
    if r.use_beam_search:
        raise RequestValidationError("Beam search is not supported by this server.", "use_beam_search")
    opts = r.stream_options  # vLLM tests the raw dict's truthiness: {} passes without stream
    if (
        opts is not None
        and not r.stream
        and (opts.include_usage is not UNSET or opts.continuous_usage_stats is not UNSET)
    ):
        raise RequestValidationError("Stream options can only be defined when `stream=True`.", "stream_options")
    pl = r.prompt_logprobs
    if pl is not None:
        if r.stream and (pl > 0 or pl == -1):
            raise RequestValidationError("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if pl < -1:
            raise RequestValidationError("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
        _check_max_logprobs(pl, "prompt_logprobs", "prompt logprobs")
    _check_structured_outputs(r)


def _check_max_logprobs(value: int, param: str, what: str = "sample logprobs") -> None:
    """Over ``MAX_LOGPROBS``; -1 (whole vocabulary) is refused by server.sampling, which knows the vocabulary."""
    if value > MAX_LOGPROBS:
        raise RequestValidationError(
            f"Requested {what} of {value}, which is greater than max allowed: {MAX_LOGPROBS}", param
        )


def parse_logit_bias(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` as ``{token_id: bias}`` with biases clamped to [-100, 100].

    Keys go through ``int()`` as in vLLM (``" 5"`` is token 5); token ids are checked against the
    vocabulary in :func:`pyfront.server.sampling.build_sampling_params`.
    """
    out: dict[int, float] = {}
    invalid: list[str] = []
    for key, bias in logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            invalid.append(key)
            continue
        if math.isnan(bias):
            raise RequestValidationError(f"logit_bias value for token {key!r} must be a number, got NaN.", "logit_bias")
        out[token] = min(100.0, max(-100.0, bias))
    if invalid:
        raise RequestValidationError(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
            "logit_bias",
        )
    return out


def _check_cache_salt(cache_salt: str | None) -> None:
    if cache_salt is None:
        return
    if not cache_salt:
        raise RequestValidationError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(cache_salt) > _MAX_CACHE_SALT_LENGTH or any(c in _CACHE_SALT_FORBIDDEN for c in cache_salt):
        raise RequestValidationError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


_HEADER_VALUE = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
"""A header value that is safe to send back: visible ASCII, inner spaces and tabs (no CR/LF, no controls)."""


MAX_REQUEST_ID_LENGTH = 512


def valid_header_value(value: str) -> bool:
    return _HEADER_VALUE.fullmatch(value) is not None


def _check_request_id(request_id: str | None) -> None:
    """A body ``request_id`` becomes the response's id and its X-Request-Id header: it must be a valid header value.

    Checked before anything runs: a CR, LF or NUL (or any control or non-ASCII character) cannot go back as
    a header, and finding out after the generation wasted it (or, streamed, lost the response).
    """
    if request_id is None:
        return
    if len(request_id) > MAX_REQUEST_ID_LENGTH or not valid_header_value(request_id):
        raise RequestValidationError(
            f"request_id must be 1 to {MAX_REQUEST_ID_LENGTH} visible ASCII characters (inner spaces allowed): "
            "it is sent back as the X-Request-Id header.",
            "request_id",
        )


def _check_xargs(xargs: dict[str, XArgValue]) -> None:
    for value in xargs.values():
        items = value if isinstance(value, list) else (value,)
        for item in items:
            if type(item) is int and not INT64_MIN <= item < 2**64:
                raise RequestValidationError("extra_args integers must be between -2**63 and 2**64 - 1.", "vllm_xargs")
            if type(item) is float and not math.isfinite(item):
                raise RequestValidationError("vllm_xargs values must be finite numbers.", "vllm_xargs")


def _check_repetition_detection(rd: RepetitionDetection) -> None:
    if rd.max_pattern_size < 0 or rd.min_pattern_size < 0 or rd.min_pattern_size > rd.max_pattern_size:
        raise RequestValidationError(
            "max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= max_pattern_size. "
            "Set both to 0 to disable repetitive pattern detection.",
            "repetition_detection",
        )
    if rd.max_pattern_size > 0 and rd.min_count < 2:
        raise RequestValidationError(
            "min_count must be >= 2 to detect repetitive patterns in engine output. If you do not wish to "
            "detect repetitive patterns, set max_pattern_size to 0.",
            "repetition_detection",
        )
    for name in ("max_pattern_size", "min_pattern_size", "min_count"):
        _check_int64(getattr(rd, name), f"repetition_detection.{name}")


_SO_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def merged_structured_outputs(request: ChatCompletionRequest | CompletionRequest) -> StructuredOutputsRequest | None:
    """The request's structured-output constraint, or None: what vLLM's ``extract_structured_outputs`` gives.

    ``structured_outputs`` (or, when it is absent, the legacy ``guided_*`` fields) with the
    ``response_format`` override applied (json_object -> ``json_object=True``, json_schema -> ``json``,
    structural_tag -> ``structural_tag`` = the format as JSON). Raises RequestValidationError unless
    exactly one constraint kind is left. Returns a new Struct; the request is not modified.
    """
    so = request.structured_outputs
    param = "structured_outputs"
    if so is None and (
        request.guided_json is not None
        or request.guided_regex is not None
        or request.guided_choice is not None
        or request.guided_grammar is not None
    ):
        param = "guided_json" if request.guided_json is not None else "guided_regex"
        so = StructuredOutputsRequest(
            json=request.guided_json,
            regex=request.guided_regex,
            choice=request.guided_choice,
            grammar=request.guided_grammar,
            whitespace_pattern=request.guided_whitespace_pattern,
        )
    rf = request.response_format
    if rf is not None and rf.type != "text":
        if so is None:
            param = "response_format"
        if rf.type == "json_object":
            override: dict[str, Any] = {"json_object": True}
        elif rf.type == "json_schema":
            assert rf.json_schema is not None, "checked while decoding"
            override = {"json": rf.json_schema.schema}
        else:
            override = {"structural_tag": _structural_tag_json(rf)}
        so = StructuredOutputsRequest(**override) if so is None else msgspec.structs.replace(so, **override)
    if so is None:
        return None
    kinds = [k for k in _SO_KINDS if getattr(so, k) is not None]
    if len(kinds) > 1:
        raise RequestValidationError(
            f"You can only use one kind of structured outputs constraint but multiple are specified: {kinds}", param
        )
    if not kinds:
        raise RequestValidationError(
            "You must use one kind of structured outputs constraint but none are specified.", param
        )
    return so


def _structural_tag_json(rf: ResponseFormat) -> str:
    """``json.dumps(response_format.model_dump(by_alias=True))`` as vLLM builds it (stdlib separators)."""
    if rf.structures is not None and rf.triggers is not None:
        payload: dict[str, Any] = {
            "type": "structural_tag",
            "structures": [{"begin": s.begin, "schema": s.schema, "end": s.end} for s in rf.structures],
            "triggers": rf.triggers,
        }
    else:
        payload = {"type": "structural_tag", "format": rf.format}
    return _stdlib_json.dumps(payload)


def _check_structured_outputs(r: ChatCompletionRequest | CompletionRequest) -> None:
    so = r.structured_outputs
    if so is not None:
        if sum(getattr(so, k) is not None for k in ("json", "regex", "choice")) > 1:
            raise RequestValidationError(
                "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
                "structured_outputs",
            )
        _check_structural_tag_payload(so.structural_tag, "structured_outputs")
        if not any(getattr(so, k) is not None for k in _SO_KINDS):
            raise RequestValidationError(
                "You must use one kind of structured outputs constraint but none are specified.",
                "structured_outputs",
            )
    rf = r.response_format
    if rf is not None:
        if rf.type == "json_schema" and rf.json_schema is None:
            raise RequestValidationError(
                "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                "response_format",
            )
        if rf.type == "structural_tag":
            legacy = rf.structures is not None and rf.triggers is not None
            if not legacy and rf.format is UNSET:
                raise RequestValidationError("Invalid response_format structural_tag specification.", "response_format")
    merged_structured_outputs(r)


def _check_structural_tag_payload(payload: str | None, param: str) -> None:
    if payload is None:
        return
    if not payload.strip():
        raise RequestValidationError(f"Invalid {param} structural_tag specification.", param)
    try:
        tag = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        raise RequestValidationError(f"Invalid {param} structural_tag specification.", param) from None
    if not (isinstance(tag, dict) and (("structures" in tag and "triggers" in tag) or "format" in tag)):
        raise RequestValidationError(f"Invalid {param} structural_tag specification.", param)


def _check_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise RequestValidationError("messages must contain at least one message.", "messages")
    for i, message in enumerate(messages):
        if not message.role:
            raise RequestValidationError("A message's role must be a non-empty string.", f"messages[{i}].role")
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                if part.type not in _TEXT_PART_TYPES:
                    raise RequestValidationError(
                        f"Only text content parts are supported, got type '{part.type}'.",
                        f"messages[{i}].content[{j}].type",
                    )
                if part.text is None:
                    raise RequestValidationError(
                        "Missing required parameter: 'text'.", f"messages[{i}].content[{j}].text"
                    )
        if message.reasoning is None and message.reasoning_content is not None:
            message.reasoning = message.reasoning_content


def _check_chat_template(
    chat_template: str | None, chat_template_kwargs: dict[str, Any] | None, allow_request_chat_template: bool
) -> None:
    in_kwargs = chat_template_kwargs is not None and chat_template_kwargs.get("chat_template") is not None
    if not allow_request_chat_template and (chat_template is not None or in_kwargs):
        raise RequestValidationError(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
            "chat_template",
        )


def _check_chat(r: ChatCompletionRequest, allow_request_chat_template: bool) -> None:
    _check_messages(r.messages)
    if r.n is None:
        r.n = 1
    _check_n(r.n)
    if r.top_logprobs is None:
        r.top_logprobs = 0
    name = "max_completion_tokens" if r.max_completion_tokens is not None else "max_tokens"
    requested = getattr(r, name)
    if requested is not None and requested < 1:
        raise RequestValidationError(f"max_tokens must be at least 1, got {requested}.", name)
    if r.logprob_token_ids and not r.logprobs:
        raise RequestValidationError(
            "when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids"
        )
    tl = r.top_logprobs
    if tl < 0 and tl != -1:
        raise RequestValidationError("`top_logprobs` must be a positive value or -1.", "top_logprobs")
    if (tl == -1 or tl > 0) and not r.logprobs:
        raise RequestValidationError("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if r.logprobs and not r.logprob_token_ids:
        _check_max_logprobs(tl, "top_logprobs")
    _check_sampling_ranges(r)
    _check_request_id(r.request_id)
    _check_tools(r)
    if r.continue_final_message and r.add_generation_prompt:
        raise RequestValidationError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    if r.add_generation_prompt is None:
        r.add_generation_prompt = True
    _check_chat_template(r.chat_template, r.chat_template_kwargs, allow_request_chat_template)


def _check_n(n: int) -> None:
    if n < 1:
        raise RequestValidationError(f"n must be at least 1, got {n}.", "n")
    if n > MAX_N_SEQUENCES:
        raise RequestValidationError(f"n must be at most {MAX_N_SEQUENCES}, got {n}.", "n")


def _check_tools(r: ChatCompletionRequest) -> None:
    if r.tools is not None and not r.tools:
        raise RequestValidationError(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            "tools",
        )
    if r.tool_choice is UNSET:
        r.tool_choice = "auto" if r.tools else "none"
        return
    choice = r.tool_choice
    if choice is None or choice == "none":
        return
    if r.tools is None:
        raise RequestValidationError("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if not name:
            raise RequestValidationError(
                f"Invalid `name` in `function`: `{name}` in `tool_choice`!", "tool_choice.function.name"
            )
        if not any(tool.function.name == name for tool in r.tools):
            raise RequestValidationError(
                "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice"
            )
        so = r.structured_outputs
        if so is not None and any(getattr(so, k) is not None for k in ("json", "regex", "choice")):
            raise RequestValidationError(
                "You can only either use constraints for structured outputs or tools, not both.", "tool_choice"
            )


def _check_completion(r: CompletionRequest) -> None:
    if r.prompt_embeds is not UNSET and r.prompt_embeds is not None:
        raise RequestValidationError("prompt_embeds are not supported by this server.", "prompt_embeds")
    prompt = r.prompt
    if prompt is None or prompt == "":
        raise RequestValidationError("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, list):
        _check_prompt_list(prompt)
    _check_n(r.n)
    if r.max_tokens is None:
        r.max_tokens = 16
    if r.max_tokens < 0 or (r.max_tokens == 0 and not r.echo):
        raise RequestValidationError(f"max_tokens must be at least 1, got {r.max_tokens}.", "max_tokens")
    if r.logprob_token_ids and r.echo and r.max_tokens == 0:
        raise RequestValidationError(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output "
            "tokens are generated.",
            "logprob_token_ids",
        )
    if r.logprob_token_ids and r.logprobs is None:
        raise RequestValidationError("when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids")
    lp = r.logprobs
    if lp is not None:
        if lp < -1:
            raise RequestValidationError("`logprobs` must be a positive value or -1.", "logprobs")
        if not r.logprob_token_ids:
            _check_max_logprobs(lp, "logprobs")
    _check_sampling_ranges(r)
    _check_request_id(r.request_id)
    if r.suffix is not None:
        if r.echo:
            raise RequestValidationError("Echo is unsupported with suffix.", "suffix")
        if r.truncate_prompt_tokens is not None:
            raise RequestValidationError("suffix is not supported with truncate_prompt_tokens", "suffix")
        raise RequestValidationError("suffix is only supported for models with FIM completion rendering", "suffix")


def _check_prompt_list(prompt: list[str | int | list[int]]) -> None:
    if not prompt:
        raise RequestValidationError("prompt must not be an empty list.", "prompt")
    first = prompt[0]
    kind = type(first)
    for i, item in enumerate(prompt):
        if type(item) is not kind:
            raise RequestValidationError(
                "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists.",
                f"prompt[{i}]",
            )
        if type(item) is int:  # the same as `kind is int` (type(item) is kind here), but it narrows item
            if not 0 <= item <= INT64_MAX:
                raise RequestValidationError(
                    f"prompt token ids must be non-negative integers, got {item}.", f"prompt[{i}]"
                )
        elif type(item) is list:
            if not item:
                raise RequestValidationError("a token-id prompt must not be empty.", f"prompt[{i}]")
            if any(not 0 <= t <= INT64_MAX for t in item):
                raise RequestValidationError("prompt token ids must be non-negative integers.", f"prompt[{i}]")
        elif item == "":
            raise RequestValidationError("prompt strings must not be empty.", f"prompt[{i}]")
    if kind is not int and len(prompt) > MAX_COMPLETION_PROMPTS:
        raise RequestValidationError(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {MAX_COMPLETION_PROMPTS}.",
            "prompt",
        )


# --------------------------------------------------------------------------------------
# Helpers for the server


# --------------------------------------------------------------------------------------
# POST /v1/responses (vLLM 0.32's ResponsesRequest validators)

_INCLUDE_VALUES = frozenset(
    (
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "message.input_image.image_url",
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
    )
)
"""vLLM's ``include`` literals: accepted (only the logprobs entry changes anything); others are refused."""


_ITEM_TYPES = frozenset(("message", "function_call", "function_call_output", "reasoning"))


def check_responses(r: ResponsesRequest) -> None:
    """The Responses checks that need no conversion; the converted chat request gets the chat checks
    (:func:`check_responses_chat`)."""
    if r.prompt is not UNSET and r.prompt is not None:
        raise RequestValidationError("prompt template is not supported", "prompt")
    if r.background and r.store is False:
        raise RequestValidationError("background can only be used when `store` is true", "background")
    if r.previous_input_messages is not UNSET and r.previous_input_messages is not None:
        raise RequestValidationError(
            "`previous_input_messages` is only supported for gpt-oss (harmony) models.", "previous_input_messages"
        )
    if r.enable_response_messages:
        raise RequestValidationError(
            "`enable_response_messages` is only supported for gpt-oss (harmony) models.", "enable_response_messages"
        )
    for value in r.include or ():
        if value not in _INCLUDE_VALUES:
            raise RequestValidationError(f"Unsupported value in `include`: {value!r}.", "include")
    if r.max_output_tokens is not None and r.max_output_tokens < 1:
        raise RequestValidationError(
            f"max_output_tokens must be at least 1, got {r.max_output_tokens}.", "max_output_tokens"
        )
    if r.top_logprobs is not None and not 0 <= r.top_logprobs <= MAX_LOGPROBS:
        raise RequestValidationError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {r.top_logprobs}.",
                                     "top_logprobs")  # fmt: skip
    if r.text is not None and r.text.format is not None:
        if r.structured_outputs is not None:
            raise RequestValidationError("Cannot specify both structured_outputs and text.format", "structured_outputs")
        if r.text.format.type == "json_schema" and r.text.format.schema is None:
            raise RequestValidationError("Missing required parameter: 'text.format.schema'.", "text.format.schema")
    _check_responses_tools(r)
    if isinstance(r.input, list):
        _check_input_items(r.input)


def _check_responses_tools(r: ResponsesRequest) -> None:
    """Function tools only (vLLM drops the built-in ones from the prompt unless a tool server runs them)."""
    tools = r.tools or []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise RequestValidationError(
                f"Tool type {tool.type!r} is not supported by this server: only 'function' tools are.",
                f"tools[{i}].type",
            )
        if not tool.name:
            raise RequestValidationError("Missing required parameter: 'name'.", f"tools[{i}].name")
    choice = r.tool_choice
    named = isinstance(choice, NamedResponsesToolChoice)
    if not tools:
        if choice == "required":
            raise RequestValidationError(
                "Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice"
            )
        if named:
            raise RequestValidationError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        r.tool_choice = "none"
    elif isinstance(choice, NamedResponsesToolChoice):
        if choice.type != "function":
            raise RequestValidationError(
                f"Tool choice type {choice.type!r} is not supported: only 'function' is.", "tool_choice.type"
            )
        if not choice.name or not any(tool.name == choice.name for tool in tools):
            raise RequestValidationError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")


def _check_input_items(items: list[InputItem]) -> None:
    if not items:
        raise RequestValidationError("input must contain at least one item.", "input")
    for i, item in enumerate(items):
        kind = item.type or "message"
        if kind not in _ITEM_TYPES:
            raise RequestValidationError(f"Unsupported input item type: {kind}", f"input[{i}].type")
        required: tuple[str, ...] = ()
        if kind == "message":
            required = ("role", "content")
        elif kind == "function_call":
            required = ("call_id", "name", "arguments")
        elif kind == "function_call_output":
            required = ("call_id", "output")
        for name in required:
            if getattr(item, name) is None:
                raise RequestValidationError(f"Missing required parameter: '{name}'.", f"input[{i}].{name}")
        if kind == "reasoning" and item.encrypted_content:
            raise RequestValidationError("Encrypted content is not supported.", f"input[{i}].encrypted_content")
        parts = item.content if isinstance(item.content, list) else []
        if isinstance(item.output, list):
            parts = parts + item.output
        for j, part in enumerate(parts):
            if part.text is None:
                raise RequestValidationError(
                    f"Only text content parts are supported, got type '{part.type}'.", f"input[{i}].content[{j}]"
                )


_CHAT_PARAMS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "tool_choice.function.name": "tool_choice.name",
}
"""The converted chat request's field names that the client knows under another name."""


def check_responses_chat(chat: ChatCompletionRequest, allow_request_chat_template: bool) -> None:
    """The chat checks on a converted Responses request, the failing field named as the client sent it."""
    try:
        _check_chat(chat, allow_request_chat_template)
    except RequestValidationError as exc:
        param = exc.param
        if param is not None:
            head = param.split("[", 1)[0].split(".", 1)[0]
            param = _CHAT_PARAMS.get(param) or (_CHAT_PARAMS[head] if head == "messages" else param)
        raise RequestValidationError(exc.message, param) from None
