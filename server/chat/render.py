"""Chat messages -> prompt text and ids (and the block hashes): on a worker thread, or inline when small."""

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
from pyfront.server.text.prompts import TurnPrompt
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


def _template_args(request: ChatCompletionRequest) -> dict[str, Any]:
    """What the tokenizer's chat render takes besides the messages."""
    return {
        "tools": tool_dicts(request.tools) if request.tools else None,
        "documents": msgspec.to_builtins(request.documents) if getattr(request, "documents", None) else None,
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
        "chat_template": request.chat_template,
        "chat_template_kwargs": request.chat_template_kwargs,
    }


def _check_template(state: ServingState, request: ChatCompletionRequest) -> None:
    if request.chat_template is not None and not state.allow_request_chat_template:
        raise APIError(400, "per-request chat templates are disabled on this server", param="chat_template")


INLINE_RENDER_MAX_BYTES = 512
"""Request bodies up to this size are rendered, tokenized and hashed on the event loop, not on a worker thread.

Why: for a short chat the hop costs more than it saves. Measured on the 2-core EPYC VM: the render of a one-message
chat took ~110 us then (the jinja template's fixed cost; 13-14 us in a loop on stop 37's VM, after the sandbox
shortcuts of server/text/chat_template.py) and its tokenize ~8 us with the segment cache warm, while the round trip
through the pool costs the loop ~40-70 us of its own (submit, futures chained back, two context switches when the
server is pinned to one core); peers.py's sequential row went from 1.31 to 1.03 ms of CPU per request with this and
the access line (server/access_log.py). Off the loop that render would not free the loop anyway: it is Python
holding the GIL, so the loop waits for it all the same (threads switch every 5 ms). The bound keeps the inline work
small whatever the request holds: the worst case found at the bound, a 512-byte body of random letters (every word
new to the segment cache, ~330 tokens), takes ~0.7 ms, about one short request's own work on the loop. A request
with its own chat template always goes to the pool: its cost is the template's, not the body's.
"""


def renders_inline(request: ChatCompletionRequest, body_bytes: int | None) -> bool:
    """Whether `render_chat` does its work on the event loop (see INLINE_RENDER_MAX_BYTES)."""
    return body_bytes is not None and body_bytes <= INLINE_RENDER_MAX_BYTES and request.chat_template is None


REUSE_MIN_BYTES = 16 * 1024
"""Request bodies at least this long are tokenized and hashed from the closest recent prompt (RecentPrompts).

Why the bound: a long chat is re-sent whole every turn, and tokenizing and hashing all of it again is the part of a
turn that grows with the history (1.6 and 0.6 ms at turn 50 of benchmarks/turn_profile.py, against 0.4 and 0.2 ms
for the tail after the shared prefix). A short one costs less to tokenize than to look up and keep."""


async def render_chat(
    state: ServingState,
    request: ChatCompletionRequest,
    *,
    hash_prompt: bool = False,
    body_bytes: int | None = None,
) -> tuple[str, list[int], bytes | None]:
    """Render and tokenize the chat; with `hash_prompt`, also its block hashes (when FEH is on).

    On a worker thread, unless the request body (`body_bytes`, None: unknown) is small enough to do it inline
    (`renders_inline`). Hashing in the same thread hop as rendering saves a second hop per request; the blob
    is what EngineClient.add_request would compute (the same memo), so the engine request is the same. A long
    body (`REUSE_MIN_BYTES`) is tokenized and hashed after the prefix it shares with the closest of the process's
    recent prompts (`render_turn`), exactly as in full.
    """
    if body_bytes is not None and body_bytes >= REUSE_MIN_BYTES:
        turn = await render_turn(state, request, None, hash_prompt=hash_prompt)
        return turn.tokens.text, turn.tokens.ids, turn.blob
    _check_template(state, request)
    hasher = state.engine.hasher if hash_prompt and state.engine is not None else None

    def render() -> tuple[str, list[int], bytes | None]:
        # Everything proportional to the history runs here, on a worker thread.
        text, ids = state.tokenizer.tokenize_chat(message_dicts(request), **_template_args(request))
        # The tokenizer's ids are exact int32 ints: the memo may skip its own check (checked=True).
        blob = hasher.hash_prompt_sync(ids, request.cache_salt, checked=True) if hasher is not None else None
        return text, ids, blob

    try:
        if renders_inline(request, body_bytes):
            return render()
        return await asyncio.get_running_loop().run_in_executor(state.render_pool, render)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="messages") from None


async def render_turn(
    state: ServingState, request: ChatCompletionRequest, previous: TurnPrompt | None, *, hash_prompt: bool = True
) -> TurnPrompt:
    """``render_chat(..., hash_prompt=True)`` for a turn that continues ``previous``, or with None the closest of the
    process's recent prompts (``ServingState.recent_prompts``; the turn is kept there then).

    The template is rendered in full (a template may rewrite earlier turns; comparing the text is what
    makes reuse exact for any template), then only the text after the prefix shared with ``previous`` is
    tokenized (``SegmentTokenizer.encode_after``) and only the blocks after the shared ids are hashed
    (``PromptHasher.hash_prompt_after_sync``). The result equals a full render, tokenize and hash.
    """
    _check_template(state, request)
    hasher = state.engine.hasher if hash_prompt and state.engine is not None else None
    salt = request.cache_salt
    recent = state.recent_prompts if previous is None else None

    def render() -> TurnPrompt:
        tokenizer = state.tokenizer
        text = tokenizer.render_chat(message_dicts(request), **_template_args(request))
        before, continues = (previous, True) if recent is None else recent.closest(text)
        tokens = tokenizer.tokenize_prompt(text, before.tokens if before is not None else None)
        if hasher is None:
            blob = None
        elif before is not None and before.hash_config == hasher.config and before.salt == salt:
            blob = hasher.hash_prompt_after_sync(tokens.ids, before.blob, tokens.shared, salt, checked=True)
        else:
            blob = hasher.hash_prompt_sync(tokens.ids, salt, checked=True)
        turn = TurnPrompt(tokens, blob, hasher.config if hasher is not None else None, salt)
        if recent is not None:
            recent.add(turn, replaces=before if continues else None)
        return turn

    try:
        return await asyncio.get_running_loop().run_in_executor(state.render_pool, render)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="messages") from None
