"""JSON Schemas of the request types, for /openapi.json (msgspec's, with the components FastAPI merges in)."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
from msgspec import Struct

from pyfront.server.anthropic.types import AnthropicCountTokensRequest, AnthropicMessagesRequest
from pyfront.server.openai.responses_types import ResponsesRequest
from pyfront.server.openai.types import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest


@cache
def json_schema(request_type: type[Struct]) -> dict[str, Any]:
    """JSON schema of a request Struct (``msgspec.json.schema``), for FastAPI's OpenAPI ``requestBody``."""
    return msgspec.json.schema(request_type)


@cache
def openapi_components() -> dict[str, Any]:
    """OpenAPI ``components.schemas`` for the request bodies (and the Structs they use).

    Keys include ``ChatCompletionRequest``, ``CompletionRequest``, ``TokenizeRequest``, ``DetokenizeRequest``,
    ``ResponsesRequest``, ``AnthropicMessagesRequest`` and ``AnthropicCountTokensRequest``; references are
    ``#/components/schemas/<Name>``.
    """
    _, components = msgspec.json.schema_components(
        (
            ChatCompletionRequest,
            CompletionRequest,
            TokenizeRequest,
            DetokenizeRequest,
            ResponsesRequest,
            AnthropicMessagesRequest,
            AnthropicCountTokensRequest,
        ),
        ref_template="#/components/schemas/{name}",
    )
    return components


def chat_request_json_schema() -> dict[str, Any]:
    """JSON schema of :class:`ChatCompletionRequest`."""
    return json_schema(ChatCompletionRequest)


def completion_request_json_schema() -> dict[str, Any]:
    """JSON schema of :class:`CompletionRequest`."""
    return json_schema(CompletionRequest)
