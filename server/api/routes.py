"""The routes: the completion and Messages routes (also served by the fast lane) and the small ones."""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import Response

from pyfront.server.api.chat.handler import chat_response
from pyfront.server.api.completions.handler import completion_response
from pyfront.server.api.messages.handler import count_tokens_response, messages_response
from pyfront.server.api.openapi import add_response_schemas
from pyfront.server.api.request import RequestHeaders
from pyfront.server.api.responses import json_response
from pyfront.server.chat.render import render_chat
from pyfront.server.config import ServerConfig
from pyfront.server.errors import (
    APIError,
)
from pyfront.server.openai.decode import decode_detokenize_request, decode_tokenize_request
from pyfront.server.openai.schema import openapi_components
from pyfront.server.openai.types import ChatCompletionRequest
from pyfront.server.state import ServingState

PYFRONT_VERSION = version("pyfront")


def _request_body_schema(name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


def add_routes(app: FastAPI, state: ServingState, config: ServerConfig) -> None:
    @app.post("/v1/chat/completions", openapi_extra=_request_body_schema("ChatCompletionRequest"))
    async def chat_completions(request: Request) -> Response:
        return await chat_response(state, config, await request.body(), RequestHeaders(request.scope["headers"]))

    @app.post("/v1/completions", openapi_extra=_request_body_schema("CompletionRequest"))
    async def completions(request: Request) -> Response:
        return await completion_response(state, config, await request.body(), RequestHeaders(request.scope["headers"]))

    @app.post("/v1/messages", openapi_extra=_request_body_schema("AnthropicMessagesRequest"))
    async def messages(request: Request) -> Response:
        return await messages_response(state, config, await request.body(), RequestHeaders(request.scope["headers"]))

    @app.post("/v1/messages/count_tokens", openapi_extra=_request_body_schema("AnthropicCountTokensRequest"))
    async def count_tokens(request: Request) -> Response:
        return await count_tokens_response(
            state, config, await request.body(), RequestHeaders(request.scope["headers"])
        )

    @app.get("/v1/models")
    async def models() -> Response:
        data: list[dict[str, object]] = [
            {
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "pyfront",
                "root": state.tokenizer.name,
                "parent": None,
                "max_model_len": state.max_model_len or None,
                "permission": [],
            }
            for name in state.model_names
        ]
        return json_response({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        engine = state.engine
        if engine is None:
            detail = {"healthy": False, "status": state.engine_error or "starting"}
            return json_response(detail, 503)
        report = engine.health()
        tokenizer = state.tokenizer
        report["tokenizer"] = {
            "load": getattr(tokenizer, "mode", None),
            "snapshot": getattr(tokenizer, "snapshot", None),
        }
        report["pid"] = os.getpid()
        report["api_server_index"] = state.api_server_index
        return json_response(report, 200 if report["healthy"] else 503)

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 503 until every engine has been admitted, and while none is healthy (saying which it is)."""
        engine = state.engine
        if engine is None:
            return json_response({"ready": False, "status": state.engine_error or "starting"}, 503)
        if not engine.healthy:
            return json_response(
                {"ready": False, "status": "no healthy engine", "engines": engine.health()["engines"]}, 503
            )
        return json_response({"ready": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        engine = state.engine
        if engine is not None:
            state.metrics.running.set(engine.num_in_flight)
            state.metrics.waiting.set(sum(e.num_waiting for e in engine.engines))
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/version")
    async def version_route() -> Response:
        return json_response({"version": PYFRONT_VERSION})

    @app.get("/load")
    async def load() -> Response:
        engine = state.engine
        return json_response({"server_load": engine.num_in_flight if engine is not None else 0})

    @app.post("/tokenize", openapi_extra=_request_body_schema("TokenizeRequest"))
    async def tokenize(request: Request) -> Response:
        body = decode_tokenize_request(
            await request.body(), allow_request_chat_template=state.allow_request_chat_template
        )
        state.check_model(body.model)
        if body.messages is not None:
            chat = ChatCompletionRequest(
                messages=body.messages,
                model=body.model,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template=body.chat_template,
                chat_template_kwargs=body.chat_template_kwargs,
                tools=body.tools,
            )
            _, ids, _ = await render_chat(state, chat)
        elif body.prompt is not None:
            prompt = body.prompt
            add_special_tokens = bool(body.add_special_tokens)  # a bool once decode_tokenize_request resolved it
            ids = await anyio.to_thread.run_sync(
                lambda: state.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
            )
        else:
            raise APIError(400, "either prompt or messages is required")
        result: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
        if body.return_token_strs:
            result["token_strs"] = state.tokenizer.hf.convert_ids_to_tokens(ids)
        return json_response(result)

    @app.post("/detokenize", openapi_extra=_request_body_schema("DetokenizeRequest"))
    async def detokenize(request: Request) -> Response:
        body = decode_detokenize_request(await request.body())
        state.check_model(body.model)
        vocab = state.tokenizer.vocab_size
        if not all(0 <= t < vocab for t in body.tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        text = await anyio.to_thread.run_sync(lambda: state.tokenizer.decode(body.tokens))
        return json_response({"prompt": text})

    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original_openapi()
            components = openapi_components()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            add_response_schemas(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
