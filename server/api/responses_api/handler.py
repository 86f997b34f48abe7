"""POST /v1/responses: parse -> history + input as a chat request -> the chat steps -> a response or its events."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.responses import Response

from pyfront.server.api.request import RequestHeaders, decode_body, log_request
from pyfront.server.api.responses import EncodedJSON, id_headers
from pyfront.server.api.responses_api.background import EventLog
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
from pyfront.server.api.sse import SSEResponse
from pyfront.server.api.streaming import stream_frames, streamed_response
from pyfront.server.chat.plan import plan_output_parsing
from pyfront.server.chat.render import render_turn
from pyfront.server.config import ServerConfig
from pyfront.server.errors import APIError, to_api_error
from pyfront.server.generate.generation import Generation, prepare
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


_BACKGROUND_WITHOUT_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable "
    "these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM "
    "server."
)  # vLLM 0.32's words; pyfront's --enable-responses-store does the same


async def responses_response(
    store: ResponseStore, state: ServingState, config: ServerConfig, raw: bytes, headers: RequestHeaders
) -> Response:
    """POST /v1/responses: parse -> history -> render/tokenize -> engine -> a JSON response or its events."""
    body = await decode_body(decode_responses_request, raw, state.render_pool)
    model = state.check_model(body.model)
    if body.background and not store.enabled:
        raise APIError(400, _BACKGROUND_WITHOUT_STORE, param="background")
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
    admission: Admission | None  # None once a stream or a background run owns it
    admission = state.admit(1)
    try:
        if body.stream:  # a burst's admissions take turns with the outputs of streams already running
            await state.pacer.turn()
        prompt = await render_turn(state, chat, previous.prompt if previous is not None else None)
        prompt_text, prompt_ids, hashes = prompt.tokens.text, prompt.tokens.ids, prompt.blob
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
        events = EventLog() if body.background and body.stream else None

        def on_complete(response: dict[str, Any]) -> None:
            if keep:
                entry = stored_response(response, messages, prompt, previous, len(raw), events)
                store.put(response_id, entry, body.previous_response_id, unless_cancelled=bool(body.background))

        def answer() -> dict[str, Any]:
            choice = generation.choices[0]
            return response_object(
                body,
                generation,
                response_id,
                model,
                int(generation.arrival),
                output=output_items(state, body, chat, choice, plan),
                status=status_of(choice),
                usage_body=usage(generation),
            )

        response_headers = id_headers(config, response_id)
        if body.background:
            queued = response_object(body, generation, response_id, model, int(generation.arrival), output=[],
                                     status="queued", usage_body=None)  # fmt: skip
            entry = stored_response(queued, messages, prompt, previous, len(raw), events)
            store.put(response_id, entry, body.previous_response_id)
            owned, admission = admission, None  # released when the run ends
            if events is not None:
                frames = ResponsesFrames(state, body, chat, generation, response_id, model, on_complete)
                run = _stream_in_background(store, state, frames, generation, events, response_id, owned)
                store.background.start(response_id, run)
                return SSEResponse(events.read(0, state.sse_keepalive_s), response_headers)
            store.background.start(response_id, _fold_in_background(store, generation, answer, on_complete,
                                                                    response_id, owned))  # fmt: skip
            return EncodedJSON(_encode(queued), response_headers)
        if body.stream:
            streamed, admission = admission, None  # released when the stream ends
            frames = ResponsesFrames(state, body, chat, generation, response_id, model, on_complete)
            return streamed_response(state, frames, [generation], response_headers, streamed.release)
        try:
            await generation.fold()
        except BaseException:
            await generation.abort()
            raise
        generation.finish_metrics()
        result = answer()
        on_complete(result)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()


def _failed(store: ResponseStore, response_id: str, exc: BaseException) -> None:
    """A background run that ended in an error: the stored response says so (unless it was cancelled)."""
    error = to_api_error(exc)
    detail = {"code": "server_error" if error.status >= 500 else "invalid_request", "message": error.message}
    store.set_status(response_id, "failed", only_from=("queued", "in_progress"), error=detail)


async def _fold_in_background(
    store: ResponseStore,
    generation: Generation,
    answer: Callable[[], dict[str, Any]],
    on_complete: Callable[[dict[str, Any]], None],
    response_id: str,
    admission: Admission,
) -> None:
    """A background response that is not streamed: generate, then store the finished response."""
    try:
        await generation.fold()
        generation.finish_metrics()
        on_complete(answer())
    except asyncio.CancelledError:
        raise  # cancelled (the route set the status): the finally aborts
    except Exception as exc:
        _failed(store, response_id, exc)
    finally:
        try:
            await generation.abort()  # nothing once finished; a cancelled or failed run's engine request ends here
        finally:
            admission.release()


async def _stream_in_background(
    store: ResponseStore,
    state: ServingState,
    frames: ResponsesFrames,
    generation: Generation,
    events: EventLog,
    response_id: str,
    admission: Admission,
) -> None:
    """A streamed background response: its events go to the log, which every reader follows."""
    completed = False
    original = frames.on_complete

    def on_complete(response: dict[str, Any]) -> None:
        nonlocal completed
        completed = True
        original(response)

    frames.on_complete = on_complete
    try:
        async for chunk in stream_frames(state, generation.batches(), frames, [generation]):
            events.append(chunk)
        if not completed:  # stream_frames ended with an error event
            _failed(store, response_id, RuntimeError("the response ended with an error event"))
    finally:
        events.close()
        admission.release()
