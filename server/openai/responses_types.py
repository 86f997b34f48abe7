"""``POST /v1/responses`` bodies (OpenAI's Responses API, as vLLM 0.32 accepts them) as msgspec Structs.

The conventions of :mod:`~pyfront.server.openai.types` hold: unknown fields are ignored, scalars decode
leniently, ``null`` means "not set". Input items are one Struct with every item type's fields (messages may
omit ``type``, so no tagged union can tell them apart); :func:`~pyfront.server.openai.validate.check_responses`
checks each item against its type. :mod:`pyfront.server.api.responses_api.convert` turns a request into
the chat request the chat steps run.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

from pyfront.server.openai.types import StructuredOutputsRequest, XArgValue

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` entry that asks for output logprobs."""


class ItemContent(Struct, kw_only=True):
    """A content part of an input item: ``input_text`` / ``output_text`` / ``reasoning_text`` / ``summary_text``."""

    type: str
    text: str | None = None


class InputItem(Struct, kw_only=True):
    """One ``input`` item: a message (``type`` absent or ``"message"``), ``function_call``,
    ``function_call_output`` or ``reasoning``; the fields of the other types stay unset."""

    type: str | None = None
    role: str | None = None
    content: str | list[ItemContent] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    output: str | list[ItemContent] | None = None
    summary: list[ItemContent] | None = None
    encrypted_content: str | None = None


class ResponsesTool(Struct, kw_only=True):
    """A ``tools`` entry. Only ``type: "function"`` is served; the others are refused by the checks."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedResponsesToolChoice(Struct, kw_only=True):
    """``tool_choice: {"type": "function", "name": ...}`` (flat, unlike the chat route's)."""

    type: str
    name: str | None = None


class TextFormat(Struct, kw_only=True):
    """``text.format``: plain text, a JSON object, or a JSON schema (structured outputs, as vLLM maps it)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(Struct, kw_only=True):
    """``reasoning``: vLLM hands ``effort`` to the chat template (and turns thinking off for ``"none"``); the
    response echoes every field, in this order."""

    context: str | None = None
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    generate_summary: str | None = None
    mode: str | None = None
    summary: str | None = None


ToolChoiceMode = Literal["none", "auto", "required"]


class ResponsesRequest(Struct, kw_only=True):
    """``POST /v1/responses``: vLLM 0.32's ``ResponsesRequest`` fields, its defaults and types."""

    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: Any = UNSET
    """OpenAI's prompt templates: refused, as vLLM does."""
    reasoning: ReasoningConfig | None = None
    include_reasoning: bool = True
    include: list[str] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    background: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    text: TextConfig | None = None
    tool_choice: ToolChoiceMode | NamedResponsesToolChoice = "auto"
    tools: list[ResponsesTool] | None = None
    top_logprobs: int | None = 0
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    prompt_cache_key: str | None = None
    """Accepted and ignored, as vLLM does."""
    request_id: str | None = None
    session_id: str | None = None
    cache_salt: str | None = None
    priority: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    vllm_xargs: dict[str, XArgValue] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    previous_input_messages: list[Any] | UnsetType | None = UNSET
    """vLLM's harmony-only history field: refused (pyfront serves no gpt-oss models)."""
    enable_response_messages: bool = False
    """vLLM's raw harmony messages in the response: refused (harmony only)."""
