"""The completion routes in-process: the real application over httpx's ASGI transport, a FakeEngine behind it.

No sockets, no threads, no engine process: what a route sends the engine and what it answers are checked
against a scripted engine (tests/fakes.py), as vllm-rs tests its routes. The ZMQ mock engine stays for the
end-to-end tests (tests/server/test_server.py).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pyfront.engine_client.client import EngineUnavailableError
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason, LogprobsLists, WireTensor
from pyfront.hashing import ALGORITHM, HashConfig, PromptHasher, block_hashes, default_none_hash, pack_block_hashes
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.generation import Generation
from pyfront.server.state import ServingState
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.fakes import DEFAULT_TOKENS, FakeEngine, Script, Step

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


async def test_non_streamed_outputs_are_folded_where_the_engine_routes_them(
    state: ServingState, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation.fold listens to its streams: every output of a non-streamed answer is folded by the task that
    routes the engine's outputs (the fake engine's stepper here), not by the handler's task woken per output."""
    engine = use(state, FakeEngine())
    folded_in: list[asyncio.Task[Any] | None] = []
    original = Generation.on_output

    def spy(self: Generation, choice: Any, output: EngineCoreOutput) -> str:
        folded_in.append(asyncio.current_task())
        return original(self, choice, output)

    monkeypatch.setattr(Generation, "on_output", spy)
    body = (await http.post("/v1/chat/completions", json=chat_body(max_tokens=6, n=2, temperature=1.0))).json()
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert body["usage"]["completion_tokens"] == 12
    assert len(folded_in) == 12 and set(folded_in) == {engine._stepper}
    assert engine.num_in_flight == 0


async def test_an_engine_that_dies_during_a_non_streamed_answer_is_a_5xx(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine(held_open))

    async def die_once_answering() -> None:
        while not engine.num_in_flight:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        engine.die()

    killer = asyncio.create_task(die_once_answering())
    response = await http.post("/v1/chat/completions", json=chat_body())
    await killer
    assert response.status_code >= 500
    assert set(response.json()) == {"error"}
    assert engine.num_in_flight == 0


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


async def call_then_leave(app: FastAPI, path: str, body: dict[str, Any], leave: asyncio.Event) -> list[Any]:
    """Drive the application as a server would, the client disconnecting once `leave` is set; what it sent."""
    sent: list[Any] = []
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("test", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body(max_tokens=3000)),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3000, "n": 2}),
    ],
)
async def test_a_client_that_leaves_a_non_streamed_request_aborts_it_in_the_engine(
    app: FastAPI, state: ServingState, path: str, body: dict[str, Any]
) -> None:
    """As vLLM's `with_cancellation`: the engine requests are aborted and the admission slot comes back."""
    engine = use(state, FakeEngine(held_open))
    leave = asyncio.Event()

    async def leave_once_running() -> None:
        while engine.num_in_flight < len(engine.added) or not engine.added:
            await asyncio.sleep(0.01)
        leave.set()

    leaver = asyncio.create_task(leave_once_running())
    sent = await asyncio.wait_for(call_then_leave(app, path, body, leave), 5)
    await leaver
    assert sent == []  # nobody to answer
    assert sorted(engine.aborted) == sorted(engine.added_ids) and engine.num_in_flight == 0
    assert state.active == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("request_id", ["a\r\nb", "a\nx-evil: 1", "nul\x00", "é", "€", "tab\tend ", "x" * 513])
async def test_a_request_id_that_cannot_be_a_header_is_refused_up_front(
    state: ServingState, http: httpx.AsyncClient, request_id: str, stream: bool
) -> None:
    engine = use(state, FakeEngine())
    for path, body in (
        ("/v1/chat/completions", chat_body(request_id=request_id, stream=stream)),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "request_id": request_id, "stream": stream}),
    ):
        response = await http.post(path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "request_id"
    assert engine.added == []


async def test_a_valid_body_request_id_is_the_response_id(state: ServingState, http: httpx.AsyncClient) -> None:
    use(state, FakeEngine())
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "request_id": "my id-1"})
    assert response.status_code == 200 and response.json()["id"] == "cmpl-my id-1"


DEEP_CASES = [
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi"}]', "chat_template_kwargs"),
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi"}]', "x"),
    ("/v1/completions", '"prompt": "hi"', "vllm_xargs"),
    ("/v1/completions", '"prompt": "hi"', "x"),
    ("/tokenize", '"prompt": "hi"', "chat_template_kwargs"),
    ("/tokenize", '"prompt": "hi"', "x"),
    ("/detokenize", '"tokens": [1]', "x"),
]


@pytest.mark.parametrize(("path", "required", "field"), DEEP_CASES)
async def test_json_nested_thousands_deep_is_a_400_on_every_post_route(
    state: ServingState, http: httpx.AsyncClient, path: str, required: str, field: str
) -> None:
    """msgspec raises RecursionError past about 1,000 levels, in any field, known or not: a 400, not a 500."""
    engine = use(state, FakeEngine())
    deep = '{"a": ' * 3000 + "1" + "}" * 3000
    raw = f'{{"model": "{MODEL}", {required}, "{field}": {deep}}}'
    response = await http.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}
    assert engine.added == []


async def test_ready_says_no_engine_is_healthy_rather_than_starting(
    state: ServingState, http: httpx.AsyncClient
) -> None:
    engine = use(state, FakeEngine())
    assert (await http.get("/ready")).json() == {"ready": True}
    engine.die()
    response = await http.get("/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False and body["status"] == "no healthy engine"
    assert [e["status"] for e in body["engines"]] == ["disconnected"]


def one_token_outputs_with_logprobs(count: int) -> Script:
    """`count` outputs of one token each, every one with its logprob row (sampled token + 1 top)."""

    def script(request: EngineCoreRequest) -> list[Step]:
        steps: list[Step] = []
        for i in range(count):
            token = DEFAULT_TOKENS[i % len(DEFAULT_TOKENS)]
            ids = WireTensor("<i4", (1, 2), struct.pack("<2i", token, token))
            logprobs = WireTensor("<f4", (1, 2), struct.pack("<2f", -0.5, -0.5))
            ranks = WireTensor("<i8", (1,), struct.pack("<q", 1))
            finish = FinishReason.LENGTH if i == count - 1 else None
            output = EngineCoreOutput(
                request.request_id, [token], new_logprobs=LogprobsLists(ids, logprobs, ranks), finish_reason=finish
            )
            steps.append([output])
        return steps

    return script


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_long_stream_with_logprobs_does_per_output_work_for_the_new_tokens_only(
    state: ServingState, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The rows turned into logprobs per output are the output's own, however long the stream already is.

    Rebuilding a choice's rows on every output made a long stream with logprobs quadratic, enough to
    starve the event loop with a few concurrent streams (issue 13).
    """
    count = 1500
    use(state, FakeEngine(one_token_outputs_with_logprobs(count)))
    seen: list[int] = []

    def counting(real: Any) -> Any:
        def wrapper(tokenizer: Any, rows: Any, **kwargs: Any) -> Any:
            seen.append(len(rows))
            return real(tokenizer, rows, **kwargs)

        return wrapper

    if path == "/v1/chat/completions":
        from pyfront.server.api.chat import convert

        monkeypatch.setattr(convert, "chat_logprobs_content", counting(convert.chat_logprobs_content))
        body: dict[str, Any] = chat_body(stream=True, logprobs=True, top_logprobs=1, max_tokens=count)
    else:
        from pyfront.server.api.completions import convert as completion_convert

        monkeypatch.setattr(completion_convert, "completion_logprobs", counting(completion_convert.completion_logprobs))
        body = {"model": MODEL, "prompt": "hi", "stream": True, "logprobs": 1, "max_tokens": count}
    response = await http.post(path, json=body)
    assert response.status_code == 200
    assert len(seen) == count and set(seen) == {1}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_that_renders_to_no_tokens_is_a_400(
    state: ServingState, http: httpx.AsyncClient, stream: bool
) -> None:
    """The bundled Qwen3 template renders nothing for an unknown role: vLLM's "prompt cannot be empty" 400."""
    engine = use(state, FakeEngine())
    body = {"model": MODEL, "messages": [{"role": "x", "content": "hi"}], "add_generation_prompt": False}
    response = await http.post("/v1/chat/completions", json={**body, "stream": stream})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "The decoder prompt cannot be empty"
    assert engine.added == []


async def test_a_request_larger_than_the_whole_capacity_is_a_400_not_a_retry_later(
    state: ServingState, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = use(state, FakeEngine())
    monkeypatch.setattr(state, "max_in_flight", 16)
    too_big = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "n": 17})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "n"
    assert "retry-after" not in too_big.headers
    fits = await http.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"], "n": 8, "max_tokens": 2})
    assert fits.status_code == 200
    assert len(engine.added) == 16


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_a_client_that_leaves_mid_body_on_a_small_route_is_no_server_error(
    app: FastAPI, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """Starlette raises ClientDisconnect from `request.body()`: answered quietly, not logged as a bug."""
    messages = [
        {"type": "http.request", "body": b'{"prompt":', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        pass

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("test", 80),
    }  # fmt: skip
    with caplog.at_level("WARNING"):
        await app(scope, receive, send)
    assert [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


class _CountingPacer:
    """Stands in for ServingState.pacer: counts the turns asked for; `hold` keeps every turn waiting."""

    def __init__(self, hold: bool = False) -> None:
        self.turns = 0
        self.hold = hold

    async def turn(self) -> None:
        self.turns += 1
        if self.hold:
            await asyncio.Event().wait()


PACED_ROUTES = [
    ("/v1/chat/completions", chat_body(max_tokens=4)),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4}),
]


@pytest.mark.parametrize(("path", "body"), PACED_ROUTES)
async def test_streamed_requests_take_their_turn_and_others_do_not(
    state: ServingState, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    use(state, FakeEngine())
    pacer = _CountingPacer()
    monkeypatch.setattr(state, "pacer", pacer)
    assert (await http.post(path, json=body)).status_code == 200
    assert pacer.turns == 0
    response = await http.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert pacer.turns == 1


@pytest.mark.parametrize(("path", "body"), PACED_ROUTES)
async def test_a_stream_whose_client_leaves_while_it_waits_its_turn_is_never_admitted(
    app: FastAPI, state: ServingState, monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    engine = use(state, FakeEngine())
    pacer = _CountingPacer(hold=True)
    monkeypatch.setattr(state, "pacer", pacer)
    leave = asyncio.Event()

    async def leave_once_waiting() -> None:
        while not pacer.turns:
            await asyncio.sleep(0.01)
        leave.set()

    leaver = asyncio.create_task(leave_once_waiting())
    sent = await asyncio.wait_for(call_then_leave(app, path, {**body, "stream": True}, leave), 5)
    await leaver
    assert sent == [] and engine.added == []
    assert state.active == 0
