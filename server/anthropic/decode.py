"""Decoding the Messages API bodies: one msgspec pass (the OpenAI routes' decoding and wording), then the checks."""

from __future__ import annotations

import msgspec

from pyfront.server.anthropic.types import AnthropicCountTokensRequest, AnthropicMessagesRequest
from pyfront.server.anthropic.validate import check_request
from pyfront.server.openai.decode import _decode

_MESSAGES_DECODER = msgspec.json.Decoder(AnthropicMessagesRequest, strict=False)


_COUNT_TOKENS_DECODER = msgspec.json.Decoder(AnthropicCountTokensRequest, strict=False)


def decode_messages_request(body: bytes | bytearray | memoryview | str) -> AnthropicMessagesRequest:
    """Parse and check a ``POST /v1/messages`` body; RequestValidationError (HTTP 400) on any problem."""
    request = _decode(_MESSAGES_DECODER, body)
    check_request(request)
    return request


def decode_count_tokens_request(body: bytes | bytearray | memoryview | str) -> AnthropicCountTokensRequest:
    """Parse and check a ``POST /v1/messages/count_tokens`` body; RequestValidationError (HTTP 400) on any problem."""
    request = _decode(_COUNT_TOKENS_DECODER, body)
    check_request(request)
    return request
