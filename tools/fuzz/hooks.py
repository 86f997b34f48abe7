"""pyfront's schemathesis hooks: its own checks and its schema's tightening (SCHEMATHESIS_HOOKS, set by the fuzz test).

Schemathesis' built-in checks see the HTTP status and the documented schemas. Three promises of pyfront's are not
visible to them, so they are checked here:

- `openai_error_shape`: every 4xx and 5xx body is the OpenAI error object pyfront documents and vLLM sends,
  `{"error": {"message": str, "type": str, "param": str | null, "code": <the HTTP status>}}`, as JSON, and
  nothing else. A body from a framework's default handler (`{"detail": ...}`, a text page), a code that
  disagrees with the status, or an empty message is a failure even when the status is a right 4xx.
- `sse_stream_framing`: a 200 event stream is `data: <JSON object>` events (comments allowed) ending with
  `data: [DONE]` and nothing after it (POST /v1/responses: `event:` + `data:` events numbered from 0, ending
  with `response.completed` or an `error` event). An error inside a started stream is an event with the same error
  object; one with a 5xx code is the stream's form of a server error (the status is already 200, so
  `not_a_server_error` cannot see it) and fails here. Streams that schemathesis cut short (its
  `max-stream-events`, or the request timeout) are only checked up to where they were cut.
- `api_key_enforced` (on when PYFRONT_FUZZ_API_KEY is set): each request is resent byte for byte without the key
  and with a wrong one; both must be refused with 401 and the error object, whatever the body.

The Messages API routes (`ANTHROPIC_PATHS`) answer in Anthropic's shapes instead: errors are
`{"type": "error", "error": {"type": <Anthropic's type for the status>, "message": str}}`, and a stream is named
events (`event: <type>` then `data: <JSON object of that type>`) ending with `message_stop`, or with an `error`
event, which must not be an api_error / overloaded_error (the stream's form of a server error).

`before_load_schema` tightens the published schema with rules the server states in its 400s, so that most
schema-valid cases reach the engine (see its docstring).

This module runs inside the fuzz venv (tools/fuzz/setup_venv.sh), where schemathesis is installed; the project's
own venv does not import it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import requests
import schemathesis
from schemathesis import Case, CheckContext, HookContext, Response

ERROR_KEYS = {"message", "type", "param", "code"}
ANTHROPIC_PATHS = {"/v1/messages", "/v1/messages/count_tokens"}
"""pyfront.server.errors.ANTHROPIC_PATHS (the fuzz venv does not install pyfront)."""
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   413: "request_too_large", 503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
API_KEY = os.environ.get("PYFRONT_FUZZ_API_KEY")  # the server's --api-key; the run sends it on every request
MODEL = "pyfront/qwen3-tokenizer"  # the bundled tokenizer's served name, which `pyfront serve --mock-engine` uses
VOCAB_SIZE = 151669  # the bundled Qwen3 tokenizer's
_probe_session = requests.Session()  # api_key_enforced's resends, on one keep-alive connection


def _anthropic_error_problem(body: Any, status: int | None) -> str | None:
    """What is wrong with `body` as Anthropic's error object (None when it is right); `status`, when given,
    is the HTTP status its type must stand for."""
    if not isinstance(body, dict) or set(body) != {"type", "error"} or body["type"] != "error":
        return f"the body is not {{'type': 'error', 'error': {{...}}}} (got {str(body)[:120]})"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"type", "message"}:
        keys = sorted(error) if isinstance(error, dict) else type(error).__name__
        return f"error has keys {keys}, not ['message', 'type']"
    if not isinstance(error["message"], str) or not error["message"].strip():
        return f"error.message is {error['message']!r}, not a non-empty string"
    if status is not None and error["type"] != ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else
                                                                    "invalid_request_error"):  # fmt: skip
        return f"error.type {error['type']!r} is not Anthropic's for HTTP {status}"
    return None


def _error_object_problem(body: Any, status: int | None, path: str = "") -> str | None:
    """What is wrong with `body` as pyfront's error object on `path` (None when it is right); `status`, when
    given, is the HTTP status its `code` must equal."""
    if path in ANTHROPIC_PATHS:
        return _anthropic_error_problem(body, status)
    if not isinstance(body, dict) or set(body) != {"error"}:
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        return f"the body is not {{'error': {{...}}}} alone (keys: {keys})"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        keys = sorted(error) if isinstance(error, dict) else type(error).__name__
        return f"error has keys {keys}, not {sorted(ERROR_KEYS)}"
    if not isinstance(error["message"], str) or not error["message"].strip():
        return f"error.message is {error['message']!r}, not a non-empty string"
    if not isinstance(error["type"], str) or not error["type"]:
        return f"error.type is {error['type']!r}, not a non-empty string"
    if error["param"] is not None and not isinstance(error["param"], str):
        return f"error.param is {error['param']!r}, not a string or null"
    if not isinstance(error["code"], int) or isinstance(error["code"], bool):
        return f"error.code is {error['code']!r}, not an integer"
    if status is not None and error["code"] != status:
        return f"error.code {error['code']} differs from the HTTP status {status}"
    return None


@schemathesis.check
def openai_error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx/5xx answer is pyfront's JSON error object with `code` equal to the status."""
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if not content_type.startswith("application/json"):
        raise AssertionError(f"{response.status_code} with content-type {content_type!r}, not application/json")
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} body is not JSON ({exc}): {response.content[:200]!r}") from None
    problem = _error_object_problem(body, response.status_code, case.path)
    if problem:
        raise AssertionError(f"{response.status_code}: {problem}: {response.content[:300]!r}")
    return None


def _anthropic_stream_problem(text: str, cut_short: bool) -> str | None:
    """What is wrong with a Messages stream (None when it is right)."""
    events = [event for event in text.replace("\r\n", "\n").split("\n\n") if event.strip()]
    ended = False
    for event in events:
        lines = [line for line in event.split("\n") if not line.startswith(":")]  # keep-alive comments
        if not lines:
            continue
        if ended:
            return f"an event after the stream's end: {event[:200]!r}"
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            return f"an event that is not 'event: ' then 'data: ': {event[:200]!r}"
        name = lines[0][len("event: ") :]
        try:
            data = json.loads(lines[1][len("data: ") :])
        except ValueError:
            return f"an event whose data is not JSON: {event[:200]!r}"
        if not isinstance(data, dict) or data.get("type") != name:
            return f"an event whose data's type is not its name: {event[:200]!r}"
        if name == "error":
            problem = _anthropic_error_problem(data, None)
            if problem:
                return f"an error event that is not the error object: {problem}"
            if data["error"]["type"] in ("api_error", "overloaded_error"):
                return f"a server error inside the stream: {event[:300]!r}"
        ended = name in ("message_stop", "error")
    if not ended and not cut_short:
        return f"the stream ended without message_stop ({len(events)} events)"
    return None


@schemathesis.check
def sse_stream_framing(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """A 200 event stream is well framed, ends with [DONE], and carries no 5xx error event."""
    content_type = (response.headers.get("content-type") or [""])[0]
    if response.status_code != 200 or not content_type.startswith("text/event-stream"):
        return None
    text = response.content.decode("utf-8", errors="strict")
    if case.path in ANTHROPIC_PATHS:
        problem = _anthropic_stream_problem(text, response.stream_cut_short)
        if problem:
            raise AssertionError(problem)
        return None
    events = [event for event in text.replace("\r\n", "\n").split("\n\n") if event.strip()]
    named = [event for event in events if not event.startswith(":")]
    if named and named[0].startswith("event: "):
        return _responses_stream_framing(named, response.stream_cut_short)
    done = False
    for event in events:
        lines = [line for line in event.split("\n") if not line.startswith(":")]  # keep-alive comments
        if not lines:
            continue
        if done:
            raise AssertionError(f"an event after data: [DONE]: {event[:200]!r}")
        if len(lines) != 1 or not lines[0].startswith("data: "):
            raise AssertionError(f"an event that is not one 'data: ' line: {event[:200]!r}")
        data = lines[0][len("data: ") :]
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise AssertionError(f"an event whose data is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise AssertionError(f"an event whose data is not a JSON object: {data[:200]!r}")
        if "error" in chunk:
            problem = _error_object_problem(chunk, None)
            if problem:
                raise AssertionError(f"an error event that is not the error object: {problem}: {data[:300]!r}")
            if chunk["error"]["code"] >= 500:
                raise AssertionError(f"a server error inside the stream: {data[:300]!r}")
    if not done and not response.stream_cut_short:
        raise AssertionError(f"the stream ended without data: [DONE] ({len(events)} events)")
    return None


_SERVER_ERROR_TYPES = frozenset({"InternalServerError", "ServiceUnavailableError", "GatewayTimeoutError"})
"""The `code` of a Responses `error` event for a 5xx (pyfront's error types, server/errors.py)."""


def _responses_stream_framing(events: list[str], cut_short: bool) -> None:
    """POST /v1/responses' stream (OpenAI's and vLLM's): `event: <type>` + `data: <JSON>` events, the data's type
    the event's name, sequence_number 0, 1, ...; it ends with `response.completed` or an `error` event (no
    [DONE]); an error event for a 5xx is a server error."""
    ended = None
    for number, event in enumerate(events):
        lines = [line for line in event.split("\n") if not line.startswith(":")]
        if ended is not None:
            raise AssertionError(f"an event after {ended}: {event[:200]!r}")
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            raise AssertionError(f"an event that is not 'event: ' and 'data: ' lines: {event[:200]!r}")
        name = lines[0][len("event: ") :]
        try:
            data = json.loads(lines[1][len("data: ") :])
        except ValueError:
            raise AssertionError(f"an event whose data is not JSON: {event[:200]!r}") from None
        if not isinstance(data, dict) or data.get("type") != name or data.get("sequence_number") != number:
            raise AssertionError(
                f"event {number} is not its name's type with sequence_number {number}: {event[:200]!r}"
            )
        if name == "error":
            if not isinstance(data.get("message"), str) or not data["message"].strip():
                raise AssertionError(f"an error event without a message: {event[:300]!r}")
            if data.get("code") in _SERVER_ERROR_TYPES:
                raise AssertionError(f"a server error inside the stream: {event[:300]!r}")
        if name in ("response.completed", "error"):
            ended = name
    if ended is None and not cut_short:
        raise AssertionError(f"the stream ended without response.completed or an error event ({len(events)} events)")


@schemathesis.check
def api_key_enforced(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """With PYFRONT_FUZZ_API_KEY set (the server runs with that --api-key), the very request just sent, byte for
    byte, is refused with a 401 error object when it comes without the key and with a wrong one, whatever its
    body: bad JSON, wrong types and oversized values must not get past (or ahead of) the key check."""
    if API_KEY is None or case.method.upper() != "POST":
        return None
    for label, authorization in (("no key", None), ("a wrong key", f"Bearer {API_KEY}-wrong")):
        probe = response.request.copy()
        del probe.headers["Authorization"]
        if authorization is not None:
            probe.headers["Authorization"] = authorization
        answer = _probe_session.send(probe, timeout=30)
        if answer.status_code != 401:
            raise AssertionError(f"with {label}: {answer.status_code}, not 401: {answer.content[:300]!r}")
        try:
            problem = _error_object_problem(answer.json(), 401, case.path)
        except ValueError:
            problem = f"the body is not JSON: {answer.content[:200]!r}"
        if problem:
            raise AssertionError(f"with {label}: 401 but {problem}")
    return None


def _tighten(schemas: dict[str, Any]) -> None:
    """The server's own rules beyond the published types, as JSON Schema; each comment quotes the 400 (or 404)
    the server answers a request that breaks the rule with."""
    token_id = {"type": "integer", "minimum": 0, "maximum": VOCAB_SIZE - 1}  # "token ids must be in [0, 151669)"
    for request in ("ChatCompletionRequest", "CompletionRequest", "TokenizeRequest", "DetokenizeRequest"):
        # 404 "The model `...` does not exist."
        schemas[request]["properties"]["model"] = {"anyOf": [{"const": MODEL}, {"type": "null"}]}
    completion = schemas["CompletionRequest"]
    completion["required"] = ["prompt"]  # "Either prompt or prompt_embeds must be provided and non-empty."
    # "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"
    completion["properties"]["prompt"] = {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},  # "... must not be empty."
            {"type": "array", "minItems": 1, "items": token_id},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": token_id}},
        ]
    }
    completion["properties"]["prompt_embeds"] = {"type": "null"}  # "prompt_embeds are not supported by this server."
    # "suffix is only supported for models with FIM completion rendering"
    completion["properties"]["suffix"] = {"type": "null"}
    # "messages must contain at least one message."
    schemas["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1
    schemas["ChatMessage"]["properties"]["role"]["minLength"] = 1  # "A message's role must be a non-empty string."
    # "Only text content parts are supported, got type '...'." and "Missing required parameter: 'text'."
    schemas["ContentPart"]["properties"].update(type={"const": "text"}, text={"type": "string"})
    schemas["ContentPart"]["required"] = ["type", "text"]
    schemas["TokenizeRequest"]["anyOf"] = [  # "either prompt or messages is required"
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array", "minItems": 1}}},
    ]
    schemas["DetokenizeRequest"]["properties"]["tokens"]["items"] = token_id
    for request in ("AnthropicMessagesRequest", "AnthropicCountTokensRequest"):
        schemas[request]["properties"]["model"] = {"const": MODEL}  # 404 "The model `...` does not exist."
        schemas[request]["properties"]["messages"]["minItems"] = 1  # "messages must contain at least one message."
    # "max_tokens must be positive"; "max_completion_tokens=... cannot be greater than max_model_len=..."
    schemas["AnthropicMessagesRequest"]["properties"]["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": 64}


@schemathesis.hook
def before_load_schema(ctx: HookContext, raw_schema: dict[str, Any]) -> None:
    """Fuzz the published schema tightened with the server's own rules (:func:`_tighten`).

    The published `/openapi.json` documents types: `prompt` is optional there, `messages` may be empty, a token id
    any integer. Fuzzed from it alone, almost every "valid" completion request lacks a prompt and gets its 400
    before reaching the engine, so the generation paths (sampling parameters, streaming, logprobs, stop strings,
    n, front-end hashing) are hardly exercised. With the rules most positive cases are served, and the negative
    cases include each rule's violations, which must still get clean 4xx answers. A rule only excludes input the
    server refuses anyway, so nothing that would reach the engine is left out.
    """
    _tighten(raw_schema["components"]["schemas"])
