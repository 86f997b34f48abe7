"""POST /v1/chat/completions: parse -> render and tokenize -> output plan -> engine -> JSON or SSE."""

from __future__ import annotations

import functools

import msgspec
from starlette.responses import Response

from pyfront.server.api.chat.convert import chat_full
from pyfront.server.api.chat.frames import ChatFrames
from pyfront.server.api.request import RequestHeaders, decode_body, log_request
from pyfront.server.api.responses import EncodedJSON, id_headers
from pyfront.server.api.streaming import streamed_response
from pyfront.server.chat.plan import plan_output_parsing
from pyfront.server.chat.render import render_chat
from pyfront.server.config import ServerConfig
from pyfront.server.generate.generation import prepare
from pyfront.server.ids import base_request_id
from pyfront.server.openai.decode import decode_chat_request
from pyfront.server.state import Admission, ServingState

_encode = msgspec.json.encode


async def chat_response(state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders) -> Response:
    """POST /v1/chat/completions: parse -> render/tokenize -> engine -> a JSON or SSE response."""
    body = await decode_body(
        functools.partial(decode_chat_request, allow_request_chat_template=state.allow_request_chat_template),
        raw,
        state.render_pool,
    )
    model = state.check_model(body.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    rank = state.data_parallel_rank(headers.data_parallel_rank)
    admission: Admission | None  # None once a stream owns it
    admission = state.admit(body.n or 1)
    try:
        if body.stream:  # a burst's admissions take turns with the outputs of streams already running
            await state.pacer.turn()
        prompt_text, prompt_ids, hashes = await render_chat(state, body, hash_prompt=True, body_bytes=len(raw))
        plan = plan_output_parsing(state, body, prompt_text)
        base = base_request_id(headers.request_id, body.request_id)
        response_id = f"chatcmpl-{base}"
        if config.enable_log_requests:
            log_request(response_id, "/v1/chat/completions", len(prompt_ids), body)
        generation = await prepare(
            state,
            body,
            prompt_ids,
            base_id=response_id,
            streaming=bool(body.stream),
            deadline=deadline,
            plan=plan,
            prompt_block_hashes=hashes,
            data_parallel_rank=rank,
        )
        response_headers = id_headers(config, base)
        if body.stream:
            streamed, admission = admission, None  # released when the stream ends
            frames = ChatFrames(state, body, generation, response_id, model)
            return streamed_response(state, frames, [generation], response_headers, streamed.release)
        result = await chat_full(state, body, generation, response_id, model)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()
