"""/docs and /redoc work offline, and /openapi.json documents the answers as the server really gives them."""

from __future__ import annotations

import re
from collections.abc import Iterator

import msgspec
import pytest

from pyfront.server.api import openapi as openapi_docs
from tests.harness import MODEL, Harness, running_harness


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with running_harness({"reasoning_parser": "qwen3", "enable_prompt_tokens_details": True}) as harness:
        yield harness


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_doc_pages_load_only_local_assets(harness: Harness, page: str) -> None:
    with harness.http() as client:
        html = client.get(page)
        assert html.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"|url: ?[\'"]([^\'"]+)[\'"]', html.text)
        assets = [u for pair in urls for u in pair if u]
        assert assets and not [u for u in assets if u.startswith(("http:", "https:", "//"))], assets
        for url in assets:
            assert client.get(url).status_code == 200, url


def test_openapi_documents_responses_and_the_error_shape(harness: Harness) -> None:
    with harness.http() as client:
        schema = client.get("/openapi.json").json()
    for (method, path), (cls, streams) in openapi_docs.RESPONSES.items():
        responses = schema["paths"][path][method]["responses"]
        ok = responses["200"]["content"]
        assert ok["application/json"]["schema"]["$ref"] == f"#/components/schemas/{cls.__name__}"
        assert ("text/event-stream" in ok) is streams
        for status in ("4XX", "5XX"):
            error = openapi_docs.error_schema(path).__name__
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{error}")
    assert set(schema["components"]["schemas"]["ErrorDetail"]["required"]) == {"message", "type", "param", "code"}


def test_real_answers_fit_the_documented_schemas(harness: Harness) -> None:
    """The schemas forbid unknown fields: an answer field added or renamed without its schema fails here."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True}
    anthropic = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "system": "Be brief."}
    with harness.http() as client:
        answers = {
            ("post", "/v1/chat/completions"): client.post("/v1/chat/completions", json=chat),
            ("post", "/v1/completions"): client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 2}
            ),
            ("post", "/v1/responses"): client.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 3}
            ),
            ("get", "/v1/models"): client.get("/v1/models"),
            ("post", "/tokenize"): client.post("/tokenize", json={"model": MODEL, "prompt": "hi"}),
            ("post", "/detokenize"): client.post("/detokenize", json={"model": MODEL, "tokens": [9707]}),
            ("post", "/v1/messages"): client.post("/v1/messages", json={**anthropic, "max_tokens": 3}),
            ("post", "/v1/messages/count_tokens"): client.post("/v1/messages/count_tokens", json=anthropic),
        }
        anthropic_error = client.post("/v1/messages", json={**anthropic, "max_tokens": 0})
        error = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "n": 0})
    assert set(answers) == set(openapi_docs.RESPONSES)
    for key, response in answers.items():
        assert response.status_code == 200, (key, response.text)
        msgspec.json.decode(response.content, type=openapi_docs.RESPONSES[key][0])
    assert error.status_code == 400
    msgspec.json.decode(error.content, type=openapi_docs.ErrorResponse)
    assert anthropic_error.status_code == 400
    msgspec.json.decode(anthropic_error.content, type=openapi_docs.AnthropicErrorResponse)


def test_docs_can_be_turned_off() -> None:
    with running_harness({"disable_fastapi_docs": True}) as harness, harness.http() as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == 404, path
