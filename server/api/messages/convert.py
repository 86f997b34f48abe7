"""Engine outputs -> the Messages API answer: content blocks, stop_reason and stop_sequence, usage.

The chat steps split the text (`api.chat.convert.chat_message`, the request's reasoning and tool-call parsers);
this module says it in Anthropic's words, as vLLM 0.32's ``messages_full_converter`` and
``_to_anthropic_stop_reason`` do (vllm/entrypoints/anthropic/serving.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pyfront.server.api.chat.convert import chat_message
from pyfront.server.generate.generation import Generation


def anthropic_stop_reason(
    finish_reason: str | None, stop_reason: int | str | None, *, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) from the chat finish reason, as vLLM maps them.

    ``max_tokens`` always wins; complete tool calls are ``tool_use`` (a forced call finishes "stop" in the chat
    layer, hence `tool_used`); a matched stop string (the engine's stop_reason, a str) is ``stop_sequence``
    unless the calls are complete; an int stop reason is a stop token, a natural end.
    """
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def anthropic_usage(usage: dict[str, Any]) -> dict[str, int]:
    """The chat usage in Anthropic's terms: its input_tokens exclude the cached and the cache-written tokens.

    The cache fields appear only when the chat usage has prompt_tokens_details (--enable-prompt-tokens-details).
    """
    body = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage.get("completion_tokens") or 0}
    details = usage.get("prompt_tokens_details")
    if details is not None:
        if (created := details.get("created_cache_tokens")) is not None:
            body["input_tokens"] -= created
            body["cache_creation_input_tokens"] = created
        if (cached := details.get("cached_tokens")) is not None:
            body["input_tokens"] -= cached
            body["cache_read_input_tokens"] = cached
    body["input_tokens"] = max(0, body["input_tokens"])
    return body


def thinking_signature() -> str:
    """A thinking block's signature: vLLM's random hex (nothing verifies it; clients send it back unread)."""
    return uuid.uuid4().hex


async def messages_full(generation: Generation, message_id: str, model: str) -> dict[str, Any]:
    """The non-streamed Message: waits for the last output (aborting the engine request if that fails)."""
    try:
        await generation.fold()
    except BaseException:
        await generation.abort()
        raise
    generation.finish_metrics()
    message, finish_reason = chat_message(generation.choices[0], generation.plan)
    calls = message["tool_calls"]
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": thinking_signature()})
    if message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        function = call["function"]
        content.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                        "input": json.loads(function["arguments"])})  # fmt: skip
    if not content:
        content.append({"type": "text", "text": ""})  # Anthropic's empty answer: one empty text block
    stop_reason, stop_sequence = anthropic_stop_reason(
        finish_reason, generation.choices[0].stop_reason, tool_used=bool(calls), tool_complete=bool(calls)
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(generation.usage(streamed=False)),
    }
