"""The Responses routes: POST /v1/responses (also served by the fast lane) and the stored responses by id.

vLLM 0.32 has GET and POST .../cancel; DELETE is OpenAI's, added here because a bounded store wants a way
to drop what a client is done with. vLLM's cancel and GET ?stream=true apply to background responses only,
which neither vLLM without its store nor pyfront runs: cancel answers vLLM's 400 for a synchronous response.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from pyfront.server.api.request import RequestHeaders
from pyfront.server.api.responses import json_response
from pyfront.server.api.responses_api.handler import not_found, responses_response
from pyfront.server.api.responses_api.store import ResponseStore
from pyfront.server.config import ServerConfig
from pyfront.server.errors import APIError
from pyfront.server.state import ServingState

_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResponsesRequest"}}},
    }
}


_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def add_responses_routes(app: FastAPI, state: ServingState, config: ServerConfig, store: ResponseStore) -> None:
    @app.post("/v1/responses", openapi_extra=_REQUEST_BODY)
    async def create_response(request: Request) -> Response:
        return await responses_response(store, state, config, await request.body(), RequestHeaders(request.scope))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, request: Request) -> Response:
        # The query is read here, not by FastAPI, so that a bad value is an OpenAI error (not FastAPI's 422).
        stream = request.query_params.get("stream", "false").lower()
        if stream not in _BOOLEANS:
            raise APIError(400, f"Invalid value for 'stream': {stream!r} is not a boolean.", param="stream")
        entry = store.get(response_id)
        if entry is None:
            raise not_found(store, response_id, "response_id")
        if _BOOLEANS[stream]:
            raise APIError(400, "Only background responses can be streamed again; this server runs none.",
                           param="stream")  # fmt: skip
        return json_response(entry.body)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        if not store.delete(response_id):
            raise not_found(store, response_id, "response_id")
        return json_response({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        if store.get(response_id) is None:
            raise not_found(store, response_id, "response_id")
        raise APIError(400, "Cannot cancel a synchronous response.", param="response_id")
