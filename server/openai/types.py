"""Request bodies of the OpenAI routes as msgspec Structs, and the limits vLLM's server puts on them.

Conventions, as in vLLM (pydantic ``extra="allow"``, lax mode): unknown fields are ignored; scalars are
decoded leniently (``"5"`` and ``5.0`` for an int, ``"0.7"`` for a float, ``"true"``/``1`` for a bool);
``null`` means "not set" wherever vLLM's field is Optional. :mod:`~pyfront.server.openai.decode` decodes
them, :mod:`~pyfront.server.openai.validate` checks them.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from msgspec import UNSET, Struct, UnsetType

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


def completion_prompts(request: CompletionRequest) -> list[str] | list[list[int]]:
    """The prompts of a decoded completion request: one entry per prompt (a string or a token-id list)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    assert prompt is not None, "decode_completion_request guarantees a prompt"
    # decode_completion_request validated the list as homogeneous: token ids, strings or id lists
    if type(prompt[0]) is int:
        return [cast("list[int]", prompt)]
    return cast("list[str] | list[list[int]]", prompt)


def message_text(message: ChatMessage) -> str | None:
    """A message's content as one string (text parts concatenated with newlines, as vLLM's 'string' format)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content
    return "\n".join(part.text or "" for part in content)
