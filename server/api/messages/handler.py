"""POST /v1/messages and /v1/messages/count_tokens: parse -> the chat request vLLM makes of it -> the chat steps.

vLLM 0.32 serves the Messages API by turning each request into a chat completion request and its answer back
into a Message; so does pyfront, through its own chat steps: render and tokenize (and hash) the prompt, plan the
output parsers, prepare the engine request, and fold or stream the outputs. Only the decoding (anthropic/) and
the answer's shape (convert, frames) are the Messages API's own. Errors come out in Anthropic's shape
(api.responses.exception_response by path), overload as its 529.
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from pyfront.server.anthropic.chat import has_inline_system, template_wants_system_first, to_chat_request
from pyfront.server.anthropic.decode import decode_count_tokens_request, decode_messages_request
from pyfront.server.api.messages.convert import messages_full
from pyfront.server.api.messages.frames import MessagesFrames
from pyfront.server.api.request import RequestHeaders, decode_body, log_request
from pyfront.server.api.responses import EncodedJSON, id_headers, json_response
from pyfront.server.api.streaming import streamed_response
from pyfront.server.chat.plan import plan_output_parsing
from pyfront.server.chat.render import render_chat
from pyfront.server.config import ServerConfig
from pyfront.server.generate.generation import prepare
from pyfront.server.ids import base_request_id
from pyfront.server.openai.types import ChatCompletionRequest
from pyfront.server.state import Admission, ServingState

_encode = msgspec.json.encode


def _chat_request(state: ServingState, raw: bytes, *, count_tokens: bool) -> ChatCompletionRequest:
    """Decode, check and convert in one call (on a worker thread for a large body, as the chat route decodes)."""
    body = decode_count_tokens_request(raw) if count_tokens else decode_messages_request(raw)
    merge = has_inline_system(body) and template_wants_system_first(state.tokenizer)
    return to_chat_request(
        body,
        merge_inline_system=merge,
        allow_request_chat_template=state.allow_request_chat_template,
        reasoning_parser=state.reasoning_parser is not None,
    )


async def messages_response(state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders) -> Response:
    """POST /v1/messages: parse -> render/tokenize -> engine -> a Message, or its SSE events."""
    chat = await decode_body(lambda data: _chat_request(state, data, count_tokens=False), raw, state.render_pool)
    model = state.check_model(chat.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    rank = state.data_parallel_rank(headers.data_parallel_rank)
    admission: Admission | None  # None once a stream owns it
    admission = state.admit(1)
    try:
        if chat.stream:  # a burst's admissions take turns with the outputs of streams already running
            await state.pacer.turn()
        prompt_text, prompt_ids, hashes = await render_chat(state, chat, hash_prompt=True, body_bytes=len(raw))
        plan = plan_output_parsing(state, chat, prompt_text)
        base = base_request_id(headers.request_id, None)
        message_id = f"msg_{base}"
        if config.enable_log_requests:
            log_request(message_id, "/v1/messages", len(prompt_ids), chat)
        generation = await prepare(
            state,
            chat,
            prompt_ids,
            base_id=message_id,
            streaming=bool(chat.stream),
            deadline=deadline,
            plan=plan,
            prompt_block_hashes=hashes,
            data_parallel_rank=rank,
        )
        response_headers = id_headers(config, base)
        if chat.stream:
            streamed, admission = admission, None  # released when the stream ends
            frames = MessagesFrames(generation, message_id, model)
            return streamed_response(state, frames, [generation], response_headers, streamed.release)
        result = await messages_full(generation, message_id, model)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()


async def count_tokens_response(
    state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders
) -> Response:
    """POST /v1/messages/count_tokens: the prompt's length as /v1/messages would render it (no engine needed)."""
    chat = await decode_body(lambda data: _chat_request(state, data, count_tokens=True), raw, state.render_pool)
    state.check_model(chat.model)
    _, ids, _ = await render_chat(state, chat)
    count = len(ids)
    return json_response({"input_tokens": count, "context_management": {"original_input_tokens": count}})
