"""A Messages request as the chat completion request vLLM 0.32 makes of it, so that the chat steps serve it.

vLLM's ``AnthropicServingMessages.to_chat_completion_request`` (vllm/entrypoints/anthropic/serving.py) is
followed field by field: the system prompt first (Claude Code's billing header dropped), thinking blocks as
the assistant's ``reasoning``, tool_use blocks as ``tool_calls``, a user's tool_result blocks as ``tool``
messages placed before the rest of that user message, tools as functions and tool_choice auto / any / tool /
none as auto / required / named / none. The result goes through the chat route's own checks, as vLLM's chat
layer checks the request it built.
"""

from __future__ import annotations

import json
import time
from typing import Any

from msgspec import UNSET

from pyfront.server.anthropic.types import (
    AnthropicContentBlock,
    AnthropicCountTokensRequest,
    AnthropicMessage,
    AnthropicMessagesRequest,
)
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    Tool,
    ToolCall,
)
from pyfront.server.openai.validate import _check_chat
from pyfront.server.text.tokenizer import ChatTokenizer

_BILLING_HEADER = "x-anthropic-billing-header"
"""Claude Code's per-request attribution line: a hash in the system prompt that would defeat prefix caching."""

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def template_wants_system_first(tokenizer: ChatTokenizer) -> bool:
    """vLLM's ``_detect_merge_inline_system``: does the chat template refuse a system message after the first turn?

    Asked only for a request that has such a message. Then (as vLLM) their text joins the leading system prompt.
    """
    probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        tokenizer.tokenize_chat(probe, add_generation_prompt=False)
    except Exception:  # the template's raise_exception, a jinja error, or no template at all: it refuses
        return True
    return False


def has_inline_system(request: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> bool:
    return any(message.role == "system" for message in request.messages)


def _system_text(content: str | list[AnthropicContentBlock]) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = [b.text for b in content if b.type == "text" and b.text and not b.text.startswith(_BILLING_HEADER)]
    return "".join(parts) if parts else None


def _tool_messages(block: AnthropicContentBlock) -> list[ChatMessage]:
    """A user's tool_result block: vLLM's ``tool`` message (its text blocks joined by newlines)."""
    content = block.content
    if isinstance(content, list):
        text = "\n".join(
            item.get("text", "") for item in content if isinstance(item, dict) and item.get("type") == "text"
        )
    else:
        text = content or ""
    return [ChatMessage(role="tool", tool_call_id=block.tool_use_id or "", content=text)]


def _convert_message(message: AnthropicMessage, out: list[ChatMessage]) -> None:
    if isinstance(message.content, str):
        out.append(ChatMessage(role=message.role, content=message.content))
        return
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for block in message.content:
        if block.type == "text" and block.text:
            parts.append(ContentPart(type="text", text=block.text))
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            arguments = json.dumps(block.input or {})
            name = block.name or ""
            calls.append(
                ToolCall(
                    id=block.id or f"call_{int(time.time())}", function=FunctionCall(name=name, arguments=arguments)
                )
            )
        elif block.type == "tool_result":
            if message.role == "user":
                out.extend(_tool_messages(block))
            else:  # vLLM: an assistant's tool_result becomes text (str() of the content, as vLLM writes it)
                parts.append(ContentPart(type="text", text=f"Tool result: {block.content if block.content else ''}"))
        # redacted_thinking and tool_reference blocks carry nothing for the template (vLLM skips them too)
    if not parts and not calls and not reasoning:
        if message.role != "user":
            out.append(ChatMessage(role=message.role))
        return
    content: str | list[ContentPart] | None = None
    if len(parts) == 1:
        content = parts[0].text
    elif parts:
        content = parts
    out.append(
        ChatMessage(
            role=message.role,
            content=content,
            tool_calls=calls or None,
            reasoning="".join(reasoning) if reasoning else None,
        )
    )


def chat_messages(
    request: AnthropicMessagesRequest | AnthropicCountTokensRequest, *, merge_inline_system: bool
) -> list[ChatMessage]:
    """The chat messages: the system prompt (with every inline one, for a template that wants it first), the turns."""
    out: list[ChatMessage] = []
    system: list[str] = []
    if request.system:
        if isinstance(request.system, str):
            system.append(request.system)
        else:
            system += [
                b.text for b in request.system if b.type == "text" and b.text and not b.text.startswith(_BILLING_HEADER)
            ]
    if merge_inline_system:
        system += [text for m in request.messages if m.role == "system" and (text := _system_text(m.content))]
    if system:
        out.append(ChatMessage(role="system", content="".join(system)))
    for message in request.messages:
        if message.role == "system":
            text = None if merge_inline_system else _system_text(message.content)
            if text:
                out.append(ChatMessage(role="system", content=text))
            continue
        _convert_message(message, out)
    return out


def _template_kwargs(user: dict[str, Any] | None, reasoning_effort: str | None) -> dict[str, Any] | None:
    """vLLM's ``build_chat_params``: a reasoning effort reaches the template, with ``enable_thinking`` = (effort !=
    "none") unless the request's own kwargs set it. pyfront's chat steps read both from ``chat_template_kwargs``."""
    if reasoning_effort is None:
        return user
    extra: dict[str, Any] = {"reasoning_effort": reasoning_effort, "enable_thinking": reasoning_effort != "none"}
    return {**extra, **(user or {})}


def to_chat_request(
    request: AnthropicMessagesRequest | AnthropicCountTokensRequest,
    *,
    merge_inline_system: bool,
    allow_request_chat_template: bool,
    reasoning_parser: bool,
) -> ChatCompletionRequest:
    """The chat request vLLM builds (see the module docstring), checked as the chat route checks its own.

    `reasoning_parser`: the server runs with --reasoning-parser (what a thinking budget needs, see below).
    """
    reasoning_effort: str | None = None
    response_format = None
    output = request.output_config
    if output is not None and output.format is not None and output.format.schema is not None:
        response_format = ResponseFormat(
            type="json_schema", json_schema=JsonSchemaFormat(name=output.format.type, schema=output.format.schema)
        )
    if output is not None and output.effort is not None:
        reasoning_effort = output.effort
    if request.thinking is not None and request.thinking.type == "disabled":
        reasoning_effort = "none"  # vLLM's probe gives "none" for templates that honour it (enable_thinking off)
    # thinking.type "enabled": vLLM sends budget_tokens as thinking_token_budget, which its engines enforce with the
    # reasoning config a --reasoning-parser gives them, and refuses without one. pyfront keeps the refusal (the
    # budget goes to the sampling checks, which give vLLM's 400); with a reasoning parser it has no reasoning config
    # to enforce the budget with, so the budget is checked (validate.py) and not sent: max_tokens still bounds the
    # answer. "adaptive" pins nothing, as in vLLM.
    budget = None
    if request.thinking is not None and request.thinking.type == "enabled" and not reasoning_parser:
        budget = request.thinking.budget_tokens
    tools = None
    if request.tools is not None:
        tools = [
            Tool(
                function=FunctionDefinition(
                    name=t.name,
                    description=t.description,
                    # vLLM's validator adds "type": "object" last; the template prints the schema (key order is prompt)
                    parameters=t.input_schema if "type" in t.input_schema else {**t.input_schema, "type": "object"},
                    strict=t.strict,
                    defer_loading=t.defer_loading,
                )
            )
            for t in request.tools
        ]
    choice = request.tool_choice
    tool_choice: Any = UNSET
    parallel = True
    if choice is not None:
        parallel = not choice.disable_parallel_tool_use
        if choice.type == "tool":
            assert choice.name is not None, "validate.check_request requires the name"
            tool_choice = NamedToolChoice(function=NamedFunction(name=choice.name))
        else:
            tool_choice = _TOOL_CHOICES[choice.type]
    elif tools is not None:
        tool_choice = "auto"
    chat = ChatCompletionRequest(
        model=request.model,
        messages=chat_messages(request, merge_inline_system=merge_inline_system),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=response_format,
        reasoning_effort=reasoning_effort,  # type: ignore[arg-type]  # one of the Literal's values
        chat_template_kwargs=_template_kwargs(request.chat_template_kwargs, reasoning_effort),
    )
    if isinstance(request, AnthropicMessagesRequest):
        chat.max_tokens = chat.max_completion_tokens = request.max_tokens
        chat.stop = request.stop_sequences
        chat.temperature = request.temperature
        chat.top_p = request.top_p
        chat.top_k = request.top_k
        chat.cache_salt = request.cache_salt
        chat.vllm_xargs = request.vllm_xargs
        chat.thinking_token_budget = budget
        if request.stream:
            chat.stream = True
            chat.stream_options = StreamOptions(include_usage=True)
    _check_chat(chat, allow_request_chat_template)
    return chat
