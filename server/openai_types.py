"""Request bodies of ``POST /v1/chat/completions`` and ``POST /v1/completions`` as msgspec Structs.

Decoding is one msgspec pass (no pydantic) followed by the request-level checks vLLM 0.32's OpenAI
server makes in its pydantic validators (``vllm/entrypoints/openai/chat_completion/protocol.py``,
``.../completion/protocol.py``, ``vllm/entrypoints/generate/base/protocol.py``) and the range checks of
``SamplingParams._verify_args`` that do not depend on the model. Everything that needs the prompt
length, the vocabulary or the generation config is checked in :mod:`pyfront.server.sampling`.

Conventions, as in vLLM (pydantic ``extra="allow"``, lax mode):

* unknown fields are ignored (the removed ``guided_decoding_backend`` included); the legacy
  ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` /
  ``guided_whitespace_pattern`` are *accepted* and honoured when ``structured_outputs`` and
  ``response_format`` leave them room (vLLM 0.32 silently ignores them);
* scalars are decoded leniently: ``"5"`` and ``5.0`` are accepted for an int, ``"0.7"`` for a float,
  ``"true"``/``1`` for a bool; ``5.5`` for an int is a type error;
* ``null`` means "not set" wherever vLLM's field is Optional.

Every failure raises :class:`RequestValidationError` (an HTTP 400) with ``param`` naming the field.
"""

from __future__ import annotations

import json as _stdlib_json
import math
import re
from functools import cache
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

from pyfront.server.errors import RequestValidationError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_COMPLETION_PROMPTS",
    "MAX_LOGPROBS",
    "MAX_N_SEQUENCES",
    "MAX_STOP_STRINGS",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "DetokenizeRequest",
    "FunctionCall",
    "FunctionDefinition",
    "JsonSchemaFormat",
    "NamedFunction",
    "NamedToolChoice",
    "RepetitionDetection",
    "RequestValidationError",
    "ResponseFormat",
    "StreamOptions",
    "StructuralTagItem",
    "StructuredOutputsRequest",
    "TokenizeRequest",
    "Tool",
    "ToolCall",
    "chat_request_json_schema",
    "completion_prompts",
    "completion_request_json_schema",
    "decode_chat_request",
    "decode_completion_request",
    "decode_detokenize_request",
    "decode_tokenize_request",
    "json_schema",
    "merged_structured_outputs",
    "message_text",
    "openapi_components",
    "parse_logit_bias",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``; ``-1`` (whole vocabulary) is therefore refused."""
MAX_N_SEQUENCES = 16384
"""vLLM's ``VLLM_MAX_N_SEQUENCES`` default."""
MAX_STOP_STRINGS = 4
"""vLLM's ``VLLM_MAX_STOP_STRINGS`` default (and OpenAI's limit)."""
MAX_COMPLETION_PROMPTS = 1024
"""vLLM's ``VLLM_MAX_COMPLETION_PROMPTS`` default."""
_MAX_CACHE_SALT_LENGTH = 128
_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
_TEXT_PART_TYPES = frozenset(("text", "input_text", "output_text"))


# --------------------------------------------------------------------------------------
# Structs
# --------------------------------------------------------------------------------------


class ContentPart(Struct, kw_only=True):
    """One element of a list-valued message ``content``; only text parts are supported."""

    type: str
    text: str | None = None


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str | dict[str, Any] = "{}"
    """OpenAI sends a JSON string; a JSON object is accepted too."""


class ToolCall(Struct, kw_only=True):
    """An assistant message's ``tool_calls`` entry."""

    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(Struct, kw_only=True):
    """A chat message. Any non-empty ``role`` is accepted (vLLM allows custom roles)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    """Deprecated spelling of ``reasoning``; decoding copies it into ``reasoning`` when that is unset."""


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class Tool(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | None = None


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as vLLM 0.32 hands them to the chat template: `[tool.model_dump() for tool in request.tools]`.

    Its models' serializers (vllm/entrypoints/generate/base/protocol.py `FunctionDefinition`, chat_completion/
    protocol.py `ChatCompletionToolsParam`) keep `name`, `description` and `parameters` (null when absent),
    add `strict` and `defer_loading` only when set, drop any other key, and copy a tool-level
    `defer_loading` into the function when the function has none. Templates print the tools as JSON, so a
    `"strict": null` more changes the prompt (8 tokens for two tools with the Qwen3 template).
    """
    out = []
    for tool in tools:
        f = tool.function
        function: dict[str, Any] = {"name": f.name, "description": f.description, "parameters": f.parameters}
        if f.strict is not None:
            function["strict"] = f.strict
        defer = f.defer_loading if f.defer_loading is not None else tool.defer_loading
        if defer is not None:
            function["defer_loading"] = defer
        entry: dict[str, Any] = {"type": tool.type, "function": function}
        if tool.defer_loading is not None:
            entry["defer_loading"] = tool.defer_loading
        out.append(entry)
    return out


class NamedFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    function: NamedFunction
    type: Literal["function"] = "function"


class JsonSchemaFormat(Struct, kw_only=True):
    """``response_format.json_schema``."""

    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class StructuralTagItem(Struct, kw_only=True):
    """One ``structures`` entry of a legacy ``structural_tag`` response format."""

    begin: str
    schema: dict[str, Any] | None = None
    end: str


class ResponseFormat(Struct, kw_only=True):
    """``response_format``: text, json_object, json_schema, or a structural tag (legacy or ``format``)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[StructuralTagItem] | None = None
    triggers: list[str] | None = None
    format: Any = UNSET


class StructuredOutputsRequest(Struct, kw_only=True):
    """vLLM's ``structured_outputs`` request field (``StructuredOutputsParams`` without the private keys)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class StreamOptions(Struct, kw_only=True):
    """``stream_options``. Absent fields are UNSET, which is falsy (``if opts.include_usage:`` works)."""

    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET


class RepetitionDetection(Struct, kw_only=True):
    """vLLM's ``repetition_detection`` (stop on repeated n-grams); all zero disables it."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


XArgValue = str | int | float | list[str | int | float]


class _SamplingFields(Struct, kw_only=True):
    """Fields shared by both request types (vLLM's names, defaults and types)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    """OpenAI's string token ids; :func:`parse_logit_bias` converts them."""
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None

    # vLLM sampling extensions
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None

    # vLLM extra parameters
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: int = 0
    request_id: str | None = None
    session_id: str | None = None
    cache_salt: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    vllm_xargs: dict[str, XArgValue] | None = None
    repetition_detection: RepetitionDetection | None = None
    thinking_token_budget: int | None = None
    stream_interval: int | None = None
    routed_experts_prompt_start: int = 0


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions`` body. After :func:`decode_chat_request`, ``tool_choice`` and
    ``add_generation_prompt`` are resolved (never UNSET / None) and ``top_logprobs``/``n`` are ints."""

    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | UnsetType | None = UNSET
    parallel_tool_calls: bool | None = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    include_reasoning: bool = True
    echo: bool = False
    add_generation_prompt: bool | None = None
    """Default True; None on the wire means "not given" (matters for the continue_final_message check)."""
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` body. ``prompt`` is a string, a list of strings, a list of token ids or a
    list of token-id lists (checked by :func:`decode_completion_request`; see :func:`completion_prompts`)."""

    prompt: str | list[str | int | list[int]] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    """``null`` becomes 16, as in vLLM."""
    n: int = 1
    suffix: str | None = None
    add_special_tokens: bool = True
    prompt_embeds: Any = UNSET


class TokenizeRequest(Struct, kw_only=True):
    """``POST /tokenize``: vLLM's TokenizeCompletionRequest (``prompt``) and TokenizeChatRequest (``messages``)
    in one Struct. After :func:`decode_tokenize_request`, ``add_special_tokens`` (True for a prompt, False for
    messages, as in vLLM) and ``add_generation_prompt`` (True) are resolved."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool | None = False


class DetokenizeRequest(Struct, kw_only=True):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[int]


# --------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------

_T = TypeVar("_T", bound=Struct)

_CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest, strict=False)
_COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest, strict=False)
_TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeRequest, strict=False)
_DETOKENIZE_DECODER = msgspec.json.Decoder(DetokenizeRequest, strict=False)
_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_EXPECTED = re.compile(r"^Expected `(?P<expected>[^`]+)`, got `(?P<got>[^`]+)`$")


def _path_to_param(path: str) -> str | None:
    """msgspec's ``$.messages[0].content`` path as ``messages[0].content`` (dict keys, ``[...]``, dropped)."""
    param = (path[1:] if path.startswith(".") else path).replace("[...]", "")
    return param or None


def _join(param: str | None, name: str) -> str:
    return f"{param}.{name}" if param else name


def _translate(exc: msgspec.ValidationError) -> RequestValidationError:
    text = str(exc)
    match = _AT_PATH.search(text)
    param = _path_to_param(match["path"]) if match else None
    base = text[: match.start()] if match else text
    if (missing := _MISSING_FIELD.match(base)) is not None:
        name = _join(param, missing["field"])
        return RequestValidationError(f"Missing required parameter: '{name}'.", name)
    if (expected := _EXPECTED.match(base)) is not None:
        if param is None:
            return RequestValidationError(f"The request body must be a JSON object, got {expected['got']}.", None)
        return RequestValidationError(
            f"Invalid type for '{param}': expected {expected['expected']}, got {expected['got']}.", param
        )
    if param is None:
        return RequestValidationError(f"Invalid request: {base}.", None)
    return RequestValidationError(f"Invalid value for '{param}': {base}.", param)


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes | bytearray | memoryview | str) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _translate(exc) from None
    except msgspec.DecodeError as exc:
        raise RequestValidationError(f"The request body is not valid JSON: {exc}", None) from None


def decode_chat_request(
    body: bytes | bytearray | memoryview | str, *, allow_request_chat_template: bool = False
) -> ChatCompletionRequest:
    """Parse and check a chat completion body; RequestValidationError (HTTP 400) on any problem.

    ``allow_request_chat_template`` is the server's ``--trust-request-chat-template``: without it a
    ``chat_template`` (or ``chat_template_kwargs["chat_template"]``) in the request is refused.
    """
    request = _decode(_CHAT_DECODER, body)
    _check_chat(request, allow_request_chat_template)
    return request


def decode_completion_request(body: bytes | bytearray | memoryview | str) -> CompletionRequest:
    """Parse and check a completion body; RequestValidationError (HTTP 400) on any problem."""
    request = _decode(_COMPLETION_DECODER, body)
    _check_completion(request)
    return request


def decode_tokenize_request(
    body: bytes | bytearray | memoryview | str, *, allow_request_chat_template: bool = False
) -> TokenizeRequest:
    """Parse and check a ``/tokenize`` body (a ``prompt`` or chat ``messages``); RequestValidationError on error."""
    request = _decode(_TOKENIZE_DECODER, body)
    if request.messages is not None:
        _check_messages(request.messages)
        if request.add_special_tokens is None:
            request.add_special_tokens = False
    elif request.add_special_tokens is None:
        request.add_special_tokens = True
    if request.continue_final_message and request.add_generation_prompt:
        raise _fail(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    if request.add_generation_prompt is None:
        request.add_generation_prompt = True
    _check_chat_template(request.chat_template, request.chat_template_kwargs, allow_request_chat_template)
    return request


def decode_detokenize_request(body: bytes | bytearray | memoryview | str) -> DetokenizeRequest:
    """Parse and check a ``/detokenize`` body; token ids must be non-negative 64-bit ints (as in vLLM)."""
    request = _decode(_DETOKENIZE_DECODER, body)
    for i, token in enumerate(request.tokens):
        if not 0 <= token <= INT64_MAX:
            raise _fail(f"token ids must be non-negative 64-bit integers, got {token}.", f"tokens[{i}]")
    return request


# --------------------------------------------------------------------------------------
# Checks (vLLM's request validators and the request-only parts of SamplingParams._verify_args)
# --------------------------------------------------------------------------------------


def _fail(message: str, param: str | None) -> RequestValidationError:
    return RequestValidationError(message, param)


def _check_int64(value: int | None, name: str) -> None:
    if value is not None and not INT64_MIN <= value <= INT64_MAX:
        raise _fail(f"{name} must be a 64-bit signed integer, got {value}.", name)


def _check_finite_range(value: float | None, name: str, low: float, high: float) -> None:
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise _fail(f"{name} must be in [{low:g}, {high:g}], got {value}.", name)


def _check_sampling_ranges(r: ChatCompletionRequest | CompletionRequest) -> None:
    """The checks of ``SamplingParams._verify_args`` on values the request sets explicitly."""
    _check_finite_range(r.presence_penalty, "presence_penalty", -2.0, 2.0)
    _check_finite_range(r.frequency_penalty, "frequency_penalty", -2.0, 2.0)
    rp = r.repetition_penalty
    if rp is not None:
        if not math.isfinite(rp):
            raise _fail(f"repetition_penalty must be a finite number, got {rp}.", "repetition_penalty")
        if rp <= 0.0:
            raise _fail(f"repetition_penalty must be greater than zero, got {rp}.", "repetition_penalty")
    t = r.temperature
    if t is not None:
        if not math.isfinite(t):
            raise _fail(f"temperature must be a finite number, got {t}.", "temperature")
        if t < 0.0:
            raise _fail(f"temperature must be non-negative, got {t}.", "temperature")
        if t > 2.0:
            raise _fail(f"temperature must be in [0, 2], got {t}.", "temperature")
    if r.top_p is not None and not (math.isfinite(r.top_p) and 0.0 < r.top_p <= 1.0):
        raise _fail(f"top_p must be in (0, 1], got {r.top_p}.", "top_p")
    if r.top_k is not None and r.top_k < -1:
        raise _fail(f"top_k must be 0 (disable), or at least 1, got {r.top_k}.", "top_k")
    if r.top_k is not None and r.top_k > INT64_MAX:
        raise _fail(f"top_k must be a 64-bit integer, got {r.top_k}.", "top_k")
    if r.min_p is not None and not (math.isfinite(r.min_p) and 0.0 <= r.min_p <= 1.0):
        raise _fail(f"min_p must be in [0, 1], got {r.min_p}.", "min_p")
    if r.min_tokens < 0:
        raise _fail(f"min_tokens must be greater than or equal to 0, got {r.min_tokens}.", "min_tokens")
    _check_int64(r.min_tokens, "min_tokens")
    _check_int64(r.seed, "seed")
    _check_int64(r.priority, "priority")
    stop = r.stop
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_STRINGS:
            raise _fail(f"stop may contain at most {MAX_STOP_STRINGS} strings, got {len(stop)}.", "stop")
        if not all(stop):
            raise _fail("stop cannot contain an empty string.", "stop")
    elif stop == "":
        raise _fail("stop cannot contain an empty string.", "stop")
    if r.bad_words is not None and not all(r.bad_words):
        raise _fail(f"bad_words cannot contain an empty string. Got bad_words={r.bad_words}", "bad_words")
    if r.truncate_prompt_tokens is not None and not -1 <= r.truncate_prompt_tokens <= INT64_MAX:
        raise _fail("truncate_prompt_tokens must be -1 or a non-negative integer.", "truncate_prompt_tokens")
    if r.stream_interval is not None and r.stream_interval < 1:
        raise _fail(f"stream_interval must be at least 1, got {r.stream_interval}.", "stream_interval")
    _check_int64(r.stream_interval, "stream_interval")
    if r.routed_experts_prompt_start < 0:
        raise _fail("routed_experts_prompt_start must be non-negative.", "routed_experts_prompt_start")
    budget = r.thinking_token_budget
    if budget is not None and budget < -1:
        raise _fail(
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
        raise _fail("Beam search is not supported by this server.", "use_beam_search")
    opts = r.stream_options  # vLLM tests the raw dict's truthiness: {} passes without stream
    if (
        opts is not None
        and not r.stream
        and (opts.include_usage is not UNSET or opts.continuous_usage_stats is not UNSET)
    ):
        raise _fail("Stream options can only be defined when `stream=True`.", "stream_options")
    pl = r.prompt_logprobs
    if pl is not None:
        if r.stream and (pl > 0 or pl == -1):
            raise _fail("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if pl < -1:
            raise _fail("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
        _check_max_logprobs(pl, "prompt_logprobs", "prompt logprobs")
    _check_structured_outputs(r)


def _check_max_logprobs(value: int, param: str, what: str = "sample logprobs") -> None:
    """Over ``MAX_LOGPROBS``; -1 (whole vocabulary) is refused by server.sampling, which knows the vocabulary."""
    if value > MAX_LOGPROBS:
        raise _fail(f"Requested {what} of {value}, which is greater than max allowed: {MAX_LOGPROBS}", param)


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
            raise _fail(f"logit_bias value for token {key!r} must be a number, got NaN.", "logit_bias")
        out[token] = min(100.0, max(-100.0, bias))
    if invalid:
        raise _fail(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
            "logit_bias",
        )
    return out


def _check_cache_salt(cache_salt: str | None) -> None:
    if cache_salt is None:
        return
    if not cache_salt:
        raise _fail("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(cache_salt) > _MAX_CACHE_SALT_LENGTH or any(c in _CACHE_SALT_FORBIDDEN for c in cache_salt):
        raise _fail(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def _check_xargs(xargs: dict[str, XArgValue]) -> None:
    for value in xargs.values():
        items = value if isinstance(value, list) else (value,)
        for item in items:
            if type(item) is int and not INT64_MIN <= item < 2**64:
                raise _fail("extra_args integers must be between -2**63 and 2**64 - 1.", "vllm_xargs")
            if type(item) is float and not math.isfinite(item):
                raise _fail("vllm_xargs values must be finite numbers.", "vllm_xargs")


def _check_repetition_detection(rd: RepetitionDetection) -> None:
    if rd.max_pattern_size < 0 or rd.min_pattern_size < 0 or rd.min_pattern_size > rd.max_pattern_size:
        raise _fail(
            "max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= max_pattern_size. "
            "Set both to 0 to disable repetitive pattern detection.",
            "repetition_detection",
        )
    if rd.max_pattern_size > 0 and rd.min_count < 2:
        raise _fail(
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
        raise _fail(
            f"You can only use one kind of structured outputs constraint but multiple are specified: {kinds}", param
        )
    if not kinds:
        raise _fail("You must use one kind of structured outputs constraint but none are specified.", param)
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
            raise _fail(
                "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
                "structured_outputs",
            )
        _check_structural_tag_payload(so.structural_tag, "structured_outputs")
        if not any(getattr(so, k) is not None for k in _SO_KINDS):
            raise _fail(
                "You must use one kind of structured outputs constraint but none are specified.",
                "structured_outputs",
            )
    rf = r.response_format
    if rf is not None:
        if rf.type == "json_schema" and rf.json_schema is None:
            raise _fail(
                "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                "response_format",
            )
        if rf.type == "structural_tag":
            legacy = rf.structures is not None and rf.triggers is not None
            if not legacy and rf.format is UNSET:
                raise _fail("Invalid response_format structural_tag specification.", "response_format")
    merged_structured_outputs(r)


def _check_structural_tag_payload(payload: str | None, param: str) -> None:
    if payload is None:
        return
    if not payload.strip():
        raise _fail(f"Invalid {param} structural_tag specification.", param)
    try:
        tag = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        raise _fail(f"Invalid {param} structural_tag specification.", param) from None
    if not (isinstance(tag, dict) and (("structures" in tag and "triggers" in tag) or "format" in tag)):
        raise _fail(f"Invalid {param} structural_tag specification.", param)


def _check_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise _fail("messages must contain at least one message.", "messages")
    for i, message in enumerate(messages):
        if not message.role:
            raise _fail("A message's role must be a non-empty string.", f"messages[{i}].role")
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                if part.type not in _TEXT_PART_TYPES:
                    raise _fail(
                        f"Only text content parts are supported, got type '{part.type}'.",
                        f"messages[{i}].content[{j}].type",
                    )
                if part.text is None:
                    raise _fail("Missing required parameter: 'text'.", f"messages[{i}].content[{j}].text")
        if message.reasoning is None and message.reasoning_content is not None:
            message.reasoning = message.reasoning_content


def _check_chat_template(
    chat_template: str | None, chat_template_kwargs: dict[str, Any] | None, allow_request_chat_template: bool
) -> None:
    in_kwargs = bool(chat_template_kwargs) and chat_template_kwargs.get("chat_template") is not None  # type: ignore[union-attr]
    if not allow_request_chat_template and (chat_template is not None or in_kwargs):
        raise _fail(
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
        raise _fail(f"max_tokens must be at least 1, got {requested}.", name)
    if r.logprob_token_ids and not r.logprobs:
        raise _fail("when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids")
    tl = r.top_logprobs
    if tl < 0 and tl != -1:
        raise _fail("`top_logprobs` must be a positive value or -1.", "top_logprobs")
    if (tl == -1 or tl > 0) and not r.logprobs:
        raise _fail("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if r.logprobs and not r.logprob_token_ids:
        _check_max_logprobs(tl, "top_logprobs")
    _check_sampling_ranges(r)
    _check_tools(r)
    if r.continue_final_message and r.add_generation_prompt:
        raise _fail(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    if r.add_generation_prompt is None:
        r.add_generation_prompt = True
    _check_chat_template(r.chat_template, r.chat_template_kwargs, allow_request_chat_template)


def _check_n(n: int) -> None:
    if n < 1:
        raise _fail(f"n must be at least 1, got {n}.", "n")
    if n > MAX_N_SEQUENCES:
        raise _fail(f"n must be at most {MAX_N_SEQUENCES}, got {n}.", "n")


def _check_tools(r: ChatCompletionRequest) -> None:
    if r.tools is not None and not r.tools:
        raise _fail(
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
        raise _fail("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if not name:
            raise _fail(f"Invalid `name` in `function`: `{name}` in `tool_choice`!", "tool_choice.function.name")
        if not any(tool.function.name == name for tool in r.tools):
            raise _fail(
                "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice"
            )
        so = r.structured_outputs
        if so is not None and any(getattr(so, k) is not None for k in ("json", "regex", "choice")):
            raise _fail("You can only either use constraints for structured outputs or tools, not both.", "tool_choice")


def _check_completion(r: CompletionRequest) -> None:
    if r.prompt_embeds is not UNSET and r.prompt_embeds is not None:
        raise _fail("prompt_embeds are not supported by this server.", "prompt_embeds")
    prompt = r.prompt
    if prompt is None or prompt == "":
        raise _fail("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, list):
        _check_prompt_list(prompt)
    _check_n(r.n)
    if r.max_tokens is None:
        r.max_tokens = 16
    if r.max_tokens < 0 or (r.max_tokens == 0 and not r.echo):
        raise _fail(f"max_tokens must be at least 1, got {r.max_tokens}.", "max_tokens")
    if r.logprob_token_ids and r.echo and r.max_tokens == 0:
        raise _fail(
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output "
            "tokens are generated.",
            "logprob_token_ids",
        )
    if r.logprob_token_ids and r.logprobs is None:
        raise _fail("when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids")
    lp = r.logprobs
    if lp is not None:
        if lp < -1:
            raise _fail("`logprobs` must be a positive value or -1.", "logprobs")
        if not r.logprob_token_ids:
            _check_max_logprobs(lp, "logprobs")
    _check_sampling_ranges(r)
    if r.suffix is not None:
        if r.echo:
            raise _fail("Echo is unsupported with suffix.", "suffix")
        if r.truncate_prompt_tokens is not None:
            raise _fail("suffix is not supported with truncate_prompt_tokens", "suffix")
        raise _fail("suffix is only supported for models with FIM completion rendering", "suffix")


def _check_prompt_list(prompt: list[str | int | list[int]]) -> None:
    if not prompt:
        raise _fail("prompt must not be an empty list.", "prompt")
    first = prompt[0]
    kind = type(first)
    for i, item in enumerate(prompt):
        if type(item) is not kind:
            raise _fail(
                "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists.",
                f"prompt[{i}]",
            )
        if kind is int:
            if not 0 <= item <= INT64_MAX:  # type: ignore[operator]
                raise _fail(f"prompt token ids must be non-negative integers, got {item}.", f"prompt[{i}]")
        elif kind is list:
            if not item:
                raise _fail("a token-id prompt must not be empty.", f"prompt[{i}]")
            if any(not 0 <= t <= INT64_MAX for t in item):  # type: ignore[union-attr]
                raise _fail("prompt token ids must be non-negative integers.", f"prompt[{i}]")
        elif item == "":
            raise _fail("prompt strings must not be empty.", f"prompt[{i}]")
    if kind is not int and len(prompt) > MAX_COMPLETION_PROMPTS:
        raise _fail(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {MAX_COMPLETION_PROMPTS}.",
            "prompt",
        )


# --------------------------------------------------------------------------------------
# Helpers for the server
# --------------------------------------------------------------------------------------


def completion_prompts(request: CompletionRequest) -> list[str] | list[list[int]]:
    """The prompts of a decoded completion request: one entry per prompt (a string or a token-id list)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    assert prompt is not None, "decode_completion_request guarantees a prompt"
    if type(prompt[0]) is int:
        return [prompt]  # type: ignore[list-item]
    return prompt  # type: ignore[return-value]


def message_text(message: ChatMessage) -> str | None:
    """A message's content as one string (text parts concatenated with newlines, as vLLM's 'string' format)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content
    return "\n".join(part.text or "" for part in content)


@cache
def json_schema(request_type: type[Struct]) -> dict[str, Any]:
    """JSON schema of a request Struct (``msgspec.json.schema``), for FastAPI's OpenAPI ``requestBody``."""
    return msgspec.json.schema(request_type)


@cache
def openapi_components() -> dict[str, Any]:
    """OpenAPI ``components.schemas`` for the four request bodies (and the Structs they use).

    Keys include ``ChatCompletionRequest``, ``CompletionRequest``, ``TokenizeRequest`` and
    ``DetokenizeRequest``; references are ``#/components/schemas/<Name>``.
    """
    _, components = msgspec.json.schema_components(
        (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest),
        ref_template="#/components/schemas/{name}",
    )
    return components


def chat_request_json_schema() -> dict[str, Any]:
    """JSON schema of :class:`ChatCompletionRequest`."""
    return json_schema(ChatCompletionRequest)


def completion_request_json_schema() -> dict[str, Any]:
    """JSON schema of :class:`CompletionRequest`."""
    return json_schema(CompletionRequest)
