"""Chat messages -> prompt text and ids (and the block hashes), on a worker thread."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import msgspec

from pyfront.server.errors import APIError
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    message_text,
    tool_dicts,
)
from pyfront.server.state import ServingState
from pyfront.server.text.tokenizer import TokenizerError

logger = logging.getLogger("pyfront.server")


def message_dicts(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text parts joined, tool call arguments as objects.

    Tool calls follow vLLM 0.32's `_postprocess_messages` (vllm/renderers/chat_utils.py): an empty list is
    dropped, and arguments become a dict, `{}` when they are empty, not JSON, or JSON that is not an
    object (logged). A malformed call lives in the history, so refusing it would fail every later turn of
    that conversation: vLLM coerces it, and so does pyfront, so both render the same prompt.
    """
    messages = msgspec.to_builtins(request.messages)
    for message, original in zip(messages, request.messages, strict=True):
        if isinstance(message.get("content"), list):
            message["content"] = message_text(original)
        calls = message.get("tool_calls")
        if isinstance(calls, list) and not calls:
            del message["tool_calls"]
        for call in calls or ():
            function = call.get("function") or {}
            function["arguments"] = _arguments_object(function.get("name"), function.get("arguments"))
    return messages


def _arguments_object(name: str | None, arguments: Any) -> dict[str, Any]:
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    parsed: Any = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            logger.warning("tool call %r has arguments that are not JSON (%d chars): rendered as {}", name,
                           len(arguments))  # fmt: skip
            return {}
    if not isinstance(parsed, dict):
        logger.warning("tool call %r arguments are a %s, not an object: rendered as {}", name, type(parsed).__name__)
        return {}
    return parsed


async def render_chat(
    state: ServingState, request: ChatCompletionRequest, *, hash_prompt: bool = False
) -> tuple[str, list[int], bytes | None]:
    """Render and tokenize the chat on a worker thread; with `hash_prompt`, also its block hashes (when FEH is on).

    Hashing in the same thread hop as rendering saves a second hop per request; the blob is what
    EngineClient.add_request would compute (the same memo), so the engine request is the same.
    """
    if request.chat_template is not None and not state.allow_request_chat_template:
        raise APIError(400, "per-request chat templates are disabled on this server", param="chat_template")
    hasher = state.engine.hasher if hash_prompt and state.engine is not None else None

    def render() -> tuple[str, list[int], bytes | None]:
        # Everything proportional to the history runs here, on a worker thread.
        text, ids = state.tokenizer.tokenize_chat(
            message_dicts(request),
            tools=tool_dicts(request.tools) if request.tools else None,
            documents=msgspec.to_builtins(request.documents) if getattr(request, "documents", None) else None,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template=request.chat_template,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        # The tokenizer's ids are exact int32 ints: the memo may skip its own check (checked=True).
        blob = hasher.hash_prompt_sync(ids, request.cache_salt, checked=True) if hasher is not None else None
        return text, ids, blob

    try:
        return await asyncio.get_running_loop().run_in_executor(state.render_pool, render)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="messages") from None
