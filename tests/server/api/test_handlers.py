"""The completion routes in-process: the real application over httpx's ASGI transport, a FakeEngine behind it.

No sockets, no threads, no engine process: what a route sends the engine and what it answers are checked
against a scripted engine (tests/fakes.py), as vllm-rs tests its routes. The ZMQ mock engine stays for the
end-to-end tests (tests/server/test_server.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pyfront.engine_client.client import EngineUnavailableError
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest
from pyfront.hashing import ALGORITHM, HashConfig, PromptHasher, block_hashes, default_none_hash, pack_block_hashes
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.errors import RequestValidationError
from pyfront.server.state import ServingState
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.fakes import DEFAULT_TOKENS, FakeEngine, Step

pytestmark = pytest.mark.anyio

MODEL = "fake-model"


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    yield create_app(ServerConfig(model=BUNDLED_TOKENIZER_NAME, served_model_name=[MODEL]))


@pytest.fixture
def state(app: FastAPI) -> Iterator[ServingState]:
    serving: ServingState = app.state.serving
    yield serving
    serving.engine = None


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=10) as client:
        yield client


def use(state: ServingState, engine: FakeEngine) -> FakeEngine:
    state.engine = engine
    return engine


def words(state: ServingState, ids: tuple[int, ...] | list[int]) -> str:
    return state.tokenizer.decode(list(ids))


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], **extra}


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_chat_sends_the_rendered_prompt_and_answers_with_the_engine_text(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine())
    response = await http.post("/v1/chat/completions", json=chat_body(max_tokens=5, stop=["never"]))
    assert response.status_code == 200, response.text
    body = response.json()
    [request] = engine.added
    _, expected_ids = state.tokenizer.tokenize_chat(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True
    )
    assert request.prompt_token_ids == expected_ids
    assert request.sampling_params.max_tokens == 5
    assert request.sampling_params.stop == ["never"]
    assert request.external_req_id == body["id"]
    assert body["choices"][0]["message"]["content"] == words(state, DEFAULT_TOKENS[:5])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len(expected_ids),
        "total_tokens": len(expected_ids) + 5,
        "completion_tokens": 5,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert engine.num_in_flight == 0


async def test_chat_stream_carries_the_same_text_as_the_answer(state: ServingState, http: httpx.AsyncClient) -> None:
    use(state, FakeEngine())
    full = (await http.post("/v1/chat/completions", json=chat_body(max_tokens=6))).json()
    streamed = await http.post(
        "/v1/chat/completions", json=chat_body(max_tokens=6, stream=True, stream_options={"include_usage": True})
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


async def test_n_choices_are_one_engine_request_each(state: ServingState, http: httpx.AsyncClient) -> None:
    engine = use(state, FakeEngine())
    body = (await http.post("/v1/chat/completions", json=chat_body(max_tokens=3, n=2, temperature=1.0))).json()
    ids = engine.added_ids
    assert len(ids) == 2 and ids[0].startswith("0_") and ids[1].startswith("1_") and ids[0][2:] == ids[1][2:]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6
    assert engine.num_in_flight == 0


async def test_completions_with_two_prompts_number_their_choices_across(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine())
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": ["one", "two"], "max_tokens": 2})
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [r.prompt_token_ids for r in engine.added] == [state.tokenizer.encode(p) for p in ("one", "two")]
    assert all(c["text"] == words(state, DEFAULT_TOKENS[:2]) for c in body["choices"])


async def test_a_stop_string_aborts_the_engine_request(state: ServingState, http: httpx.AsyncClient) -> None:
    engine = use(state, FakeEngine())
    stop = words(state, DEFAULT_TOKENS[2:3]).strip()
    body = (await http.post("/v1/chat/completions", json=chat_body(max_tokens=8, stop=[stop]))).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["stop_reason"] == stop
    assert stop not in body["choices"][0]["message"]["content"]
    await engine.wait_idle()
    assert engine.aborted == engine.added_ids  # the engine was still generating: pyfront stopped it


async def test_engine_refusals_map_to_the_api_error_shape(state: ServingState, http: httpx.AsyncClient) -> None:
    engine = use(state, FakeEngine())
    engine.fail_next_add(EngineUnavailableError("no engine can take it"))
    unavailable = await http.post("/v1/chat/completions", json=chat_body())
    assert unavailable.status_code == 503
    assert unavailable.json()["error"]["code"] == 503
    engine.fail_next_add(RequestValidationError("the engine would refuse this"))
    refused = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "the engine would refuse this"
    # A plain ValueError from the engine client (its own checks, after the server validated) is a server
    # bug by the error table (server/errors.py): a logged 500, not the client's fault.
    engine.fail_next_add(ValueError("validate_request refused it"))
    bug = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert bug.status_code == 500
    assert engine.num_in_flight == 0


def held_open(request: EngineCoreRequest) -> list[Step]:
    """Two tokens, then nothing: the request stays in flight until something ends it."""
    return [[EngineCoreOutput(request.request_id, [token])] for token in DEFAULT_TOKENS[:2]]


async def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error_event(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine(held_open))

    async def die_while_streaming() -> None:
        # httpx's ASGITransport hands back a response only once the app has finished, so the test cannot
        # react to chunks as they come: the engine dies from here once its two tokens had time to stream.
        while not engine.num_in_flight:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        engine.die()

    killer = asyncio.create_task(die_while_streaming())
    response = await http.post("/v1/chat/completions", json=chat_body(stream=True))
    await killer
    assert response.status_code == 200
    events = sse_events(response.text)
    streamed = "".join(
        e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict) and e.get("choices")
    )
    assert streamed == words(state, DEFAULT_TOKENS[:2])  # what came before the engine died
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] >= 500
    assert events[-1] == "[DONE]"
    assert engine.num_in_flight == 0


async def test_the_deadline_aborts_a_request_the_engine_never_finishes(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine(held_open))
    response = await http.post("/v1/chat/completions", json=chat_body(), headers={"X-Request-Timeout": "0.2"})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == 504
    assert engine.aborted == engine.added_ids


async def test_a_request_without_an_engine_is_a_503(state: ServingState, http: httpx.AsyncClient) -> None:
    state.engine = None
    response = await http.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 503
    assert response.headers["retry-after"]


async def test_prompt_block_hashes_go_with_the_request_when_the_engine_hashes(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    config = HashConfig(ALGORITHM, 16, default_none_hash())
    engine = use(state, FakeEngine(hasher=PromptHasher(config)))
    long_text = "word " * 200
    await http.post("/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": long_text}]))
    [request] = engine.added
    assert request.prompt_token_ids is not None and len(request.prompt_token_ids) > 16
    assert request.prompt_block_hashes == pack_block_hashes(block_hashes(request.prompt_token_ids, config), 16)
