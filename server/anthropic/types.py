"""Request bodies of Anthropic's Messages API as msgspec Structs, with vLLM 0.32's fields and limits.

vLLM's models (vllm/entrypoints/anthropic/protocol.py) are the reference: one content-block type with every
block's fields optional, unknown fields ignored, lax scalars (as pyfront's OpenAI types). The block types vLLM
accepts are all listed so that an unsupported one gets a clear refusal from the checks
(:mod:`~pyfront.server.anthropic.validate`) rather than msgspec's enum message.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from pyfront.server.openai.types import XArgValue

BlockType = Literal[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]


class AnthropicContentBlock(Struct, kw_only=True):
    """One block of a message's (or the system prompt's) content."""

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    """image / document blocks (refused: pyfront serves text-only models)."""
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    """A tool_result's content: a string, or blocks (text is kept; images are refused)."""
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    """redacted_thinking's opaque payload (skipped, as vLLM does)."""


class AnthropicMessage(Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]


class AnthropicTool(Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class AnthropicToolChoice(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicThinkingConfig(Struct, kw_only=True):
    """``thinking``: enabled (with ``budget_tokens``), disabled, or adaptive; ``display`` is accepted, unused."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted", "updates"] | None = None


class AnthropicJsonOutputFormat(Struct, kw_only=True):
    type: Literal["json_schema"] = "json_schema"
    schema: dict[str, Any] | None = None


class AnthropicOutputConfig(Struct, kw_only=True):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: AnthropicJsonOutputFormat | None = None


class _Common(Struct, kw_only=True):
    """What a Messages request and a count_tokens request share."""

    model: str
    messages: list[AnthropicMessage]
    system: str | list[AnthropicContentBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinkingConfig | None = None
    output_config: AnthropicOutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's extension: extra arguments for the chat template."""


class AnthropicMessagesRequest(_Common, kw_only=True):
    """``POST /v1/messages``."""

    max_tokens: int
    metadata: dict[str, Any] | None = None
    """Accepted and unused (vLLM ignores it too)."""
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    cache_salt: str | None = None
    """vLLM's extension: salts the prefix cache."""
    vllm_xargs: dict[str, XArgValue] | None = None
    """vLLM's extension: extra parameters for custom engine extensions."""


class AnthropicCountTokensRequest(_Common, kw_only=True):
    """``POST /v1/messages/count_tokens``."""
