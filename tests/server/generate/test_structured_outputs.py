"""pyfront's structured-output checks against vLLM 0.32's own verdicts (tests/data/structured-outputs-vectors.json).

Every vector was run through vLLM's ``SamplingParams._validate_structured_outputs`` ("auto": xgrammar, then
guidance) by tools/real_engine/structured_outputs_oracle.py; the real-engine tier re-runs it so the stored
verdicts cannot drift. Here pyfront must give the same verdict: accepted with the same backend, or refused
with a 400 whose message is of the same kind (the text before the first colon: "Grammar error",
"Invalid grammar specification", ...; the rest holds positions and library wording not worth pinning).
The HTTP tests send the issue's cases through the routes: a 400 in the error shape, nothing sent to the engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pyfront.engine_client.protocol import StructuredOutputsParams
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.structured_outputs import resolve_structured_outputs
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import DATA_DIR
from tests.fakes import FakeEngine

VECTORS = json.loads((DATA_DIR / "structured-outputs-vectors.json").read_text())
CASES: list[dict[str, Any]] = VECTORS["cases"]


def _kind(message: str) -> str:
    return message.split(":", 1)[0]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_verdict_matches_vllm(case: dict[str, Any]) -> None:
    so = StructuredOutputsParams(**case["params"])
    expected = case["vllm"]
    if expected["ok"]:
        resolve_structured_outputs(so)
        assert so.backend == expected["backend"]
        assert so.backend_was_auto
    else:
        with pytest.raises(RequestValidationError) as info:
            resolve_structured_outputs(so)
        assert _kind(info.value.message) == _kind(expected["error"]), (info.value.message, expected["error"])
        assert info.value.param == "structured_outputs"


def test_vectors_cover_every_class_and_name_their_verdict() -> None:
    """Ids say what vLLM answered (-ok-: xgrammar, -guidance-, -err-: 400), and every constraint kind is there."""
    ids = [case["id"] for case in CASES]
    assert len(set(ids)) == len(ids)
    for case in CASES:
        verdict = case["vllm"]
        status = "err" if not verdict["ok"] else "guidance" if verdict["backend"] == "guidance" else "ok"
        assert f"-{status}-" in case["id"] or case["id"] == "json-object-ok", case["id"]
    prefixes = {case["id"].split("-", 1)[0] for case in CASES}
    assert prefixes == {"ebnf", "lark", "json", "regex", "choice", "stag"}
    assert VECTORS["versions"] == {"vllm": "0.32.0+cpu", "xgrammar": "0.2.8", "llguidance": "1.7.6"}


# ----------------------------------------------------------------------------------------------- HTTP

MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": "Say something."}]
BAD_TOOL = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": 5}}}


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    yield create_app(
        ServerConfig(
            model=BUNDLED_TOKENIZER_NAME,
            served_model_name=[MODEL],
            tool_call_parser="hermes",
            enable_auto_tool_choice=True,
        )
    )


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=10) as client:
        yield client


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/v1/chat/completions", {"structured_outputs": {"grammar": "root ::= ("}}, "Invalid grammar specification"),
        ("/v1/chat/completions", {"guided_json": {"type": 5}}, "Grammar error"),
        ("/v1/completions", {"guided_json": {"type": 5}}, "Grammar error"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "structural_tag", "format": {"type": "bogus"}}},
            "Invalid grammar specification",
        ),
        ("/v1/chat/completions", {"tools": [BAD_TOOL], "tool_choice": "required"}, "Invalid grammar specification"),
        (
            "/v1/chat/completions",
            {"tools": [BAD_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "Invalid grammar specification",
        ),
    ],
    ids=["grammar", "guided-json-chat", "guided-json-completion", "structural-tag", "tools-required", "tools-named"],
)
async def test_invalid_constraints_are_refused_before_the_engine(
    app: FastAPI, http: httpx.AsyncClient, route: str, body: dict[str, Any], message: str
) -> None:
    engine = FakeEngine()
    app.state.serving.engine = engine
    try:
        prompt: dict[str, Any] = {"messages": MESSAGES} if route.endswith("chat/completions") else {"prompt": "x"}
        response = await http.post(route, json={"model": MODEL, **prompt, **body})
    finally:
        app.state.serving.engine = None
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert error["message"].startswith(message), error
    assert engine.added == []
