"""POST /v1/completions: parse -> tokenize each prompt -> engine -> JSON or SSE."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from pyfront.server.api.completions.convert import CompletionBatch, completion_full, tokenize_completion_prompts
from pyfront.server.api.completions.frames import CompletionFrames
from pyfront.server.api.request import RequestHeaders, decode_body, log_request
from pyfront.server.api.responses import EncodedJSON, id_headers
from pyfront.server.api.streaming import streamed_response
from pyfront.server.config import ServerConfig
from pyfront.server.generate.generation import Generation, prepare
from pyfront.server.ids import base_request_id
from pyfront.server.openai.decode import decode_completion_request
from pyfront.server.state import Admission, ServingState

_encode = msgspec.json.encode


async def completion_response(
    state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders
) -> Response:
    """POST /v1/completions: parse -> tokenize each prompt -> engine -> a JSON or SSE response."""
    body = await decode_body(decode_completion_request, raw, state.render_pool)
    model = state.check_model(body.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    rank = state.data_parallel_rank(headers.data_parallel_rank)
    if body.stream:  # a burst's admissions take turns with the outputs of streams already running
        await state.pacer.turn()
    prompts = await tokenize_completion_prompts(state, body, len(raw))
    admission: Admission | None  # None once a stream owns it
    admission = state.admit((body.n or 1) * len(prompts))
    try:
        base = base_request_id(headers.request_id, body.request_id)
        response_id = f"cmpl-{base}"
        if config.enable_log_requests:
            log_request(response_id, "/v1/completions", sum(len(p) for p in prompts), body)
        generations: list[Generation] = []
        try:
            for i, (_, prompt_ids) in enumerate(prompts):
                sub_id = response_id if len(prompts) == 1 else f"{response_id}-{i}"
                generations.append(
                    await prepare(
                        state,
                        body,
                        prompt_ids,
                        base_id=sub_id,
                        streaming=bool(body.stream),
                        deadline=deadline,
                        data_parallel_rank=rank,
                    )
                )
        except BaseException:
            for generation in generations:
                await generation.abort()
            raise
        echo_texts = [text or "" for text, _ in prompts] if body.echo else None
        echo_only = bool(body.echo and body.max_tokens == 0)
        batch = CompletionBatch(generations, echo_texts, body.n or 1, echo_only=echo_only)
        response_headers = id_headers(config, base)
        if body.stream:
            streamed, admission = admission, None  # released when the stream ends
            frames = CompletionFrames(state, body, batch, response_id, model)
            return streamed_response(state, frames, generations, response_headers, streamed.release)
        result = await completion_full(state, body, batch, response_id, model)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()
