"""The API's documentation: response schemas in /openapi.json and Swagger UI / ReDoc served offline.

FastAPI's /docs and /redoc load Swagger UI and ReDoc from a CDN, so on an offline machine (where vLLM
deployments often run) the pages are blank. The assets come from the `fastapi-offline` package instead
(Swagger UI 5, which renders the OpenAPI 3.1 that FastAPI writes, and ReDoc 2), served from this process.

The completion routes answer with dicts built on the hot path (no pydantic), so their response schemas
are the msgspec Structs below, used for the document only. They cannot drift unnoticed:
tests/server/api/test_openapi_docs.py decodes real answers into them with unknown fields forbidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from msgspec import Struct
from starlette.responses import HTMLResponse

from pyfront.server.errors import ANTHROPIC_PATHS

ASSETS_URL = "/static-offline-docs"


def _assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


class _Doc(Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class ErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(_Doc):
    """Every 4xx / 5xx of the OpenAI routes (OpenAI's and vLLM's shape)."""

    error: ErrorDetail


class PromptTokensDetails(_Doc):
    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    multimodal_tokens: dict[str, int] | None = None


class CompletionTokensDetails(_Doc):
    reasoning_tokens: int


class Usage(_Doc):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class FunctionCall(_Doc):
    name: str
    arguments: str


class ToolCall(_Doc):
    id: str
    type: str
    function: FunctionCall


class AssistantMessage(_Doc):
    role: str
    content: str | None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = []


class ChatChoice(_Doc):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_Doc):
    """`stream: true` answers with `text/event-stream` chunks of `object: chat.completion.chunk` instead, then
    `data: [DONE]`."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[dict[str, Any] | None] | None = None


class CompletionChoice(_Doc):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None


class CompletionResponse(_Doc):
    """`stream: true` answers with `text/event-stream` chunks of `object: text_completion` instead, then
    `data: [DONE]`."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class Model(_Doc):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int | None
    permission: list[Any]


class ModelList(_Doc):
    object: str
    data: list[Model]


class TokenizeResponse(_Doc):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Doc):
    prompt: str


class AnthropicErrorDetail(_Doc):
    type: str
    message: str


class AnthropicErrorResponse(_Doc):
    """Every 4xx / 5xx of the Messages API routes (Anthropic's shape)."""

    type: str
    error: AnthropicErrorDetail


class AnthropicUsage(_Doc):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class AnthropicContentBlock(_Doc):
    """`thinking` (thinking, signature), `text` (text) or `tool_use` (id, name, input)."""

    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class AnthropicMessage(_Doc):
    """`stream: true` answers with Anthropic's `text/event-stream` events (message_start ... message_stop) instead."""

    id: str
    type: str
    role: str
    content: list[AnthropicContentBlock]
    model: str
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicContextManagement(_Doc):
    original_input_tokens: int


class AnthropicTokenCount(_Doc):
    input_tokens: int
    context_management: AnthropicContextManagement


class ResponseObject(_Doc):
    """POST /v1/responses (and GET /v1/responses/{id}): vLLM 0.32's ResponsesResponse. `stream: true` answers
    with `text/event-stream` events (`event: <type>`, `data: {...}`) ending with `response.completed`."""

    id: str
    created_at: int
    incomplete_details: dict[str, Any] | None
    instructions: str | None
    metadata: dict[str, str] | None
    model: str
    object: str
    output: list[dict[str, Any]]
    parallel_tool_calls: bool
    temperature: float
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    background: bool
    max_output_tokens: int | None
    max_tool_calls: int | None
    previous_response_id: str | None
    prompt: dict[str, Any] | None
    reasoning: dict[str, Any] | None
    service_tier: str
    status: str
    text: dict[str, Any] | None
    top_logprobs: int | None
    truncation: str
    usage: dict[str, Any] | None
    user: str | None
    presence_penalty: float | None
    frequency_penalty: float | None
    kv_transfer_params: dict[str, Any] | None
    ec_transfer_params: dict[str, Any] | None
    input_messages: list[Any] | None
    output_messages: list[Any] | None


RESPONSES: dict[tuple[str, str], tuple[type[Struct], bool]] = {
    ("post", "/v1/chat/completions"): (ChatCompletionResponse, True),
    ("post", "/v1/completions"): (CompletionResponse, True),
    ("post", "/v1/responses"): (ResponseObject, True),
    ("get", "/v1/models"): (ModelList, False),
    ("post", "/tokenize"): (TokenizeResponse, False),
    ("post", "/detokenize"): (DetokenizeResponse, False),
    ("post", "/v1/messages"): (AnthropicMessage, True),
    ("post", "/v1/messages/count_tokens"): (AnthropicTokenCount, False),
}
"""Each documented route's 200 body, and whether it can stream (SSE)."""


def error_schema(path: str) -> type[Struct]:
    """A route's error body: Anthropic's on the Messages API routes, else OpenAI's."""
    return AnthropicErrorResponse if path in ANTHROPIC_PATHS else ErrorResponse


def components() -> dict[str, Any]:
    _, schemas = msgspec.json.schema_components(
        [ErrorResponse, AnthropicErrorResponse, *(cls for cls, _ in RESPONSES.values())],
        ref_template="#/components/schemas/{name}",
    )
    return schemas


def add_response_schemas(schema: dict[str, Any]) -> None:
    """Point the routes' responses at the schemas (and every route's errors at its error body)."""
    schema.setdefault("components", {}).setdefault("schemas", {}).update(components())
    for (method, path), (cls, streams) in RESPONSES.items():
        operation = schema.get("paths", {}).get(path, {}).get(method)
        if operation is None:
            continue
        ok: dict[str, Any] = {"description": "the answer", "content": _json(cls.__name__)}
        if streams:
            ok["content"]["text/event-stream"] = {
                "schema": {
                    "type": "string",
                    "description": "SSE events: Anthropic's named events on /v1/messages, the Responses events on "
                    "/v1/responses, else chunks, then [DONE]",
                }
            }
        kind = error_schema(path).__name__
        error = {"description": f"an error object ({kind})", "content": _json(kind)}
        operation["responses"] = {"200": ok, "4XX": error, "5XX": error}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def add_offline_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc from local assets; the app must be built with docs_url=redoc_url=None."""
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="static-offline-docs")
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
