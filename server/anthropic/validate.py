"""vLLM 0.32's checks on a Messages request (its pydantic validators), and what pyfront refuses outright.

The sampling fields are checked again, with the chat route's checks, on the chat request made from the
Messages request (:mod:`~pyfront.server.anthropic.chat`), as vLLM's chat layer checks it.
"""

from __future__ import annotations

from pyfront.server.anthropic.types import AnthropicContentBlock, AnthropicCountTokensRequest, AnthropicMessagesRequest
from pyfront.server.errors import RequestValidationError
from pyfront.server.openai.types import MAX_STOP_STRINGS

MIN_THINKING_BUDGET = 1024
"""Anthropic's (and vLLM's) smallest ``thinking.budget_tokens``."""

_UNSUPPORTED_BLOCKS = {
    "image": "image blocks are not supported: this server serves text-only models",
    "document": "document blocks are not supported: this server serves text-only models",
    "tool_addition": "tool_addition blocks are not supported by this server; declare the tools in `tools`",
    "tool_removal": "tool_removal blocks are not supported by this server; declare the tools in `tools`",
}


def _check_blocks(blocks: list[AnthropicContentBlock], param: str) -> None:
    for j, block in enumerate(blocks):
        refusal = _UNSUPPORTED_BLOCKS.get(block.type)
        if refusal is not None:
            raise RequestValidationError(f"{param}[{j}]: {refusal}.", f"{param}[{j}].type")
        if block.type == "tool_result" and isinstance(block.content, list):
            for k, item in enumerate(block.content):
                kind = item.get("type")
                if kind in _UNSUPPORTED_BLOCKS:
                    raise RequestValidationError(
                        f"{param}[{j}].content[{k}]: {_UNSUPPORTED_BLOCKS[kind]}.", f"{param}[{j}].content[{k}].type"
                    )


def check_request(request: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> None:
    """RequestValidationError (a 400, invalid_request_error) for what vLLM's models refuse, and unsupported blocks."""
    if not request.model:
        raise RequestValidationError("Model is required", "model")
    if not request.messages:
        raise RequestValidationError("messages must contain at least one message.", "messages")
    if isinstance(request.system, list):
        _check_blocks(request.system, "system")
    for i, message in enumerate(request.messages):
        if isinstance(message.content, list):
            _check_blocks(message.content, f"messages[{i}].content")
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise RequestValidationError("tool_choice.name is required when type is 'tool'", "tool_choice.name")
    thinking = request.thinking
    if thinking is not None and thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None:
            raise RequestValidationError(
                "thinking.budget_tokens is required when thinking.type is 'enabled'", "thinking.budget_tokens"
            )
        if budget < MIN_THINKING_BUDGET:
            raise RequestValidationError(
                f"thinking.budget_tokens must be at least {MIN_THINKING_BUDGET}, got {budget}", "thinking.budget_tokens"
            )
    if isinstance(request, AnthropicCountTokensRequest):
        return
    if request.max_tokens <= 0:
        raise RequestValidationError("max_tokens must be positive", "max_tokens")
    if thinking is not None and thinking.type == "enabled":
        assert thinking.budget_tokens is not None
        if thinking.budget_tokens >= request.max_tokens:
            raise RequestValidationError(
                "thinking.budget_tokens must be less than max_tokens", "thinking.budget_tokens"
            )
    if request.stop_sequences is not None and len(request.stop_sequences) > MAX_STOP_STRINGS:
        raise RequestValidationError(
            f"stop_sequences may hold at most {MAX_STOP_STRINGS} strings, got {len(request.stop_sequences)}",
            "stop_sequences",
        )
