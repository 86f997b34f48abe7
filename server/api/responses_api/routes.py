"""The Responses routes: POST /v1/responses (also served by the fast lane) and the stored responses by id.

vLLM 0.32 has GET and POST .../cancel; DELETE is OpenAI's, added here because a bounded store wants a way
to drop what a client is done with. Cancel and GET ?stream=true apply to background responses
(responses_api/background.py): cancel answers vLLM's 400 for any other.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from pyfront.server.api.request import RequestHeaders
from pyfront.server.api.responses import id_headers, json_response
from pyfront.server.api.responses_api.handler import not_found, responses_response
from pyfront.server.api.responses_api.store import ResponseStore
from pyfront.server.api.sse import SSEResponse
from pyfront.server.config import ServerConfig
from pyfront.server.errors import APIError
from pyfront.server.state import ServingState

_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResponsesRequest"}}},
    }
}


_BY_ID = {
    "parameters": [
        {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string", "title": "Response Id"}}
    ]
}
"""The id routes' path parameter, declared here and read from ``request.path_params``: a parameter FastAPI analyses
itself makes it import ``pydantic.v1`` (to refuse v1 models; 1.4 MB and ~13 ms at start-up), and a path segment
is a string whatever it holds, so FastAPI's validation had nothing to refuse."""

_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
_RUNNING = ("queued", "in_progress")


def add_responses_routes(app: FastAPI, state: ServingState, config: ServerConfig, store: ResponseStore) -> None:
    @app.post("/v1/responses", openapi_extra=_REQUEST_BODY)
    async def create_response(request: Request) -> Response:
        return await responses_response(
            store, state, config, await request.body(), RequestHeaders(request.scope["headers"])
        )

    @app.get("/v1/responses/{response_id}", openapi_extra=_BY_ID)
    async def retrieve_response(request: Request) -> Response:
        response_id: str = request.path_params["response_id"]
        # The query is read here, not by FastAPI, so that a bad value is an OpenAI error (not FastAPI's 422).
        query = request.query_params
        stream = query.get("stream", "false").lower()
        if stream not in _BOOLEANS:
            raise APIError(400, f"Invalid value for 'stream': {stream!r} is not a boolean.", param="stream")
        raw_after = query.get("starting_after")
        try:
            starting_after = int(raw_after) if raw_after is not None else -1
        except ValueError:
            raise APIError(400, f"Invalid value for 'starting_after': {raw_after!r} is not an integer.",
                           param="starting_after") from None  # fmt: skip
        entry = store.get(response_id)
        if entry is None:
            raise not_found(store, response_id, "response_id")
        if not _BOOLEANS[stream]:
            return json_response(entry.body)
        if entry.events is None:
            raise APIError(400, f"Unknown response_id: {response_id} (only a response created with background and "
                           "stream has events to stream)", param="response_id")  # fmt: skip
        start = max(starting_after + 1, 0)
        return SSEResponse(entry.events.read(start, state.sse_keepalive_s), id_headers(config, response_id))

    @app.delete("/v1/responses/{response_id}", openapi_extra=_BY_ID)
    async def delete_response(request: Request) -> Response:
        response_id: str = request.path_params["response_id"]
        if not store.delete(response_id):
            raise not_found(store, response_id, "response_id")
        await store.background.cancel(response_id)  # a deleted background run has no one left to answer
        return json_response({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/responses/{response_id}/cancel", openapi_extra=_BY_ID)
    async def cancel_response(request: Request) -> Response:
        """vLLM's: a queued or in-progress (background) response becomes cancelled and its run is stopped;
        any other is a 400."""
        response_id: str = request.path_params["response_id"]
        entry = store.get(response_id)
        if entry is None:
            raise not_found(store, response_id, "response_id")
        cancelled = store.set_status(response_id, "cancelled", only_from=_RUNNING)
        if cancelled is None or cancelled.body.get("status") != "cancelled" or entry.body.get("status") not in _RUNNING:
            raise APIError(400, "Cannot cancel a synchronous response.", param="response_id")
        await store.background.cancel(response_id)
        return json_response(cancelled.body)
