"""Decoding the OpenAI request bodies: one msgspec pass, then vLLM's request checks, errors as 400s with a param.

Decoding is one msgspec pass (no pydantic) followed by the request-level checks vLLM 0.32's OpenAI server
makes in its pydantic validators (:mod:`~pyfront.server.openai.validate`). Everything that needs the prompt
length, the vocabulary or the generation config is checked in :mod:`pyfront.server.generate.sampling`.
msgspec's messages are translated into vLLM's wording and the failing field becomes the error's ``param``.

The legacy ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` /
``guided_whitespace_pattern`` are *accepted* and honoured when ``structured_outputs`` and
``response_format`` leave them room (vLLM 0.32 silently ignores them).
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from msgspec import Struct

from pyfront.server.errors import RequestValidationError
from pyfront.server.openai.responses_types import ResponsesRequest
from pyfront.server.openai.types import (
    INT64_MAX,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pyfront.server.openai.validate import (
    _check_chat,
    _check_chat_template,
    _check_completion,
    _check_messages,
    check_responses,
)

_T = TypeVar("_T", bound=Struct)


_CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest, strict=False)


_COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest, strict=False)


_TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeRequest, strict=False)


_DETOKENIZE_DECODER = msgspec.json.Decoder(DetokenizeRequest, strict=False)


_RESPONSES_DECODER = msgspec.json.Decoder(ResponsesRequest, strict=False)


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")


_EXPECTED = re.compile(r"^Expected `(?P<expected>[^`]+)`, got `(?P<got>[^`]+)`$")


def _path_to_param(path: str) -> str | None:
    """msgspec's ``$.messages[0].content`` path as ``messages[0].content`` (dict keys, ``[...]``, dropped)."""
    param = (path[1:] if path.startswith(".") else path).replace("[...]", "")
    return param or None


def _join(param: str | None, name: str) -> str:
    return f"{param}.{name}" if param else name


def _translate(exc: msgspec.ValidationError) -> RequestValidationError:
    text = str(exc)
    match = _AT_PATH.search(text)
    param = _path_to_param(match["path"]) if match else None
    base = text[: match.start()] if match else text
    if (missing := _MISSING_FIELD.match(base)) is not None:
        name = _join(param, missing["field"])
        return RequestValidationError(f"Missing required parameter: '{name}'.", name)
    if (expected := _EXPECTED.match(base)) is not None:
        if param is None:
            return RequestValidationError(f"The request body must be a JSON object, got {expected['got']}.", None)
        return RequestValidationError(
            f"Invalid type for '{param}': expected {expected['expected']}, got {expected['got']}.", param
        )
    if param is None:
        return RequestValidationError(f"Invalid request: {base}.", None)
    return RequestValidationError(f"Invalid value for '{param}': {base}.", param)


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes | bytearray | memoryview | str) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _translate(exc) from None
    except msgspec.DecodeError as exc:
        raise RequestValidationError(f"The request body is not valid JSON: {exc}", None) from None
    except RecursionError:
        # msgspec counts nesting against the interpreter's recursion limit (about 1,000 levels), in any field,
        # known or not: the body is refused as a whole, since no field of any route nests that deep.
        raise RequestValidationError(
            "The request body is nested too deeply: JSON arrays and objects may nest at most a few hundred levels.",
            None,
        ) from None


def decode_chat_request(
    body: bytes | bytearray | memoryview | str, *, allow_request_chat_template: bool = False
) -> ChatCompletionRequest:
    """Parse and check a chat completion body; RequestValidationError (HTTP 400) on any problem.

    ``allow_request_chat_template`` is the server's ``--trust-request-chat-template``: without it a
    ``chat_template`` (or ``chat_template_kwargs["chat_template"]``) in the request is refused.
    """
    request = _decode(_CHAT_DECODER, body)
    _check_chat(request, allow_request_chat_template)
    return request


def decode_completion_request(body: bytes | bytearray | memoryview | str) -> CompletionRequest:
    """Parse and check a completion body; RequestValidationError (HTTP 400) on any problem."""
    request = _decode(_COMPLETION_DECODER, body)
    _check_completion(request)
    return request


def decode_tokenize_request(
    body: bytes | bytearray | memoryview | str, *, allow_request_chat_template: bool = False
) -> TokenizeRequest:
    """Parse and check a ``/tokenize`` body (a ``prompt`` or chat ``messages``); RequestValidationError on error."""
    request = _decode(_TOKENIZE_DECODER, body)
    if request.messages is not None:
        _check_messages(request.messages)
        if request.add_special_tokens is None:
            request.add_special_tokens = False
    elif request.add_special_tokens is None:
        request.add_special_tokens = True
    if request.continue_final_message and request.add_generation_prompt:
        raise RequestValidationError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    if request.add_generation_prompt is None:
        request.add_generation_prompt = True
    _check_chat_template(request.chat_template, request.chat_template_kwargs, allow_request_chat_template)
    return request


def decode_responses_request(body: bytes | bytearray | memoryview | str) -> ResponsesRequest:
    """Parse and check a ``/v1/responses`` body; RequestValidationError (HTTP 400) on any problem.

    The chat checks run later, on the chat request the body becomes (they need the stored history).
    """
    request = _decode(_RESPONSES_DECODER, body)
    check_responses(request)
    return request


def decode_detokenize_request(body: bytes | bytearray | memoryview | str) -> DetokenizeRequest:
    """Parse and check a ``/detokenize`` body; token ids must be non-negative 64-bit ints (as in vLLM)."""
    request = _decode(_DETOKENIZE_DECODER, body)
    for i, token in enumerate(request.tokens):
        if not 0 <= token <= INT64_MAX:
            raise RequestValidationError(
                f"token ids must be non-negative 64-bit integers, got {token}.", f"tokens[{i}]"
            )
    return request


# --------------------------------------------------------------------------------------
# Checks (vLLM's request validators and the request-only parts of SamplingParams._verify_args)
