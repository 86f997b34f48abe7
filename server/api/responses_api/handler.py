"""POST /v1/responses: parse -> history + input as a chat request -> the chat steps -> a response or its events."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from starlette.responses import Response

from pyfront.server.api.request import RequestHeaders, decode_body, log_request
from pyfront.server.api.responses import EncodedJSON, id_headers
from pyfront.server.api.responses_api.convert import (
    chat_request,
    output_items,
    response_object,
    status_of,
    turn_messages,
    usage,
)
from pyfront.server.api.responses_api.frames import ResponsesFrames
from pyfront.server.api.responses_api.store import ResponseStore, StoredResponse, stored_response
from pyfront.server.api.streaming import streamed_response
from pyfront.server.chat.plan import plan_output_parsing
from pyfront.server.chat.render import render_chat
from pyfront.server.config import ServerConfig
from pyfront.server.errors import APIError
from pyfront.server.generate.generation import fold_outputs, prepare
from pyfront.server.openai.decode import decode_responses_request
from pyfront.server.openai.validate import check_responses_chat
from pyfront.server.state import Admission, ServingState

_encode = msgspec.json.encode


def not_found(store: ResponseStore, response_id: str, param: str) -> APIError:
    """vLLM's 404 for an unknown response id; with the store off, the reason."""
    message = f"Response with id '{response_id}' not found."
    if not store.enabled:
        message += " (This server stores no responses: start it with --enable-responses-store or "
        message += "VLLM_ENABLE_RESPONSES_API_STORE=1.)"
    return APIError(404, message, param=param)


async def responses_response(
    store: ResponseStore, state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders
) -> Response:
    """POST /v1/responses: parse -> history -> render/tokenize -> engine -> a JSON response or its events."""
    body = await decode_body(decode_responses_request, raw)
    model = state.check_model(body.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    rank = state.data_parallel_rank(headers.data_parallel_rank)
    previous: StoredResponse | None = None
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise not_found(store, body.previous_response_id, "previous_response_id")
    messages = turn_messages(body, previous)
    chat = chat_request(body, messages)
    check_responses_chat(chat, state.allow_request_chat_template)
    admission: Admission | None  # None once a stream owns it
    admission = state.admit(1)
    try:
        prompt_text, prompt_ids, hashes = await render_chat(state, chat, hash_prompt=True)
        plan = plan_output_parsing(state, chat, prompt_text)
        # vLLM: the body's request_id is the response's id; else resp_ and a fresh id (X-Request-Id here).
        base = headers.request_id or uuid.uuid4().hex
        response_id = body.request_id or f"resp_{base}"
        if config.enable_log_requests:
            log_request(response_id, "/v1/responses", len(prompt_ids), chat)
        generation = await prepare(
            state,
            chat,
            prompt_ids,
            base_id=response_id,
            streaming=bool(body.stream),
            deadline=deadline,
            plan=plan,
            prompt_block_hashes=hashes,
            data_parallel_rank=rank,
        )
        keep = store.enabled and body.store is not False

        def on_complete(response: dict[str, Any]) -> None:
            if keep:
                store.put(response_id, stored_response(response, messages, prompt_text, prompt_ids))

        response_headers = id_headers(config, response_id)
        if body.stream:
            streamed, admission = admission, None  # released when the stream ends
            frames = ResponsesFrames(state, body, chat, generation, response_id, model, on_complete)
            return streamed_response(
                state, frames, [generation], generation.batches, response_headers, streamed.release
            )
        try:
            await fold_outputs(generation.batches())
        except BaseException:
            await generation.abort()
            raise
        generation.finish_metrics()
        choice = generation.choices[0]
        result = response_object(
            body,
            generation,
            response_id,
            model,
            int(generation.arrival),
            output=output_items(state, body, chat, choice, plan),
            status=status_of(choice),
            usage_body=usage(generation),
        )
        on_complete(result)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()
