"""POST /v1/responses and the stored responses, through openai-python's `client.responses`.

In-process (the real application over httpx's ASGI transport, a FakeEngine scripted with texts) where the
prompt the engine was sent is checked against a full render of the same conversation; end to end over ZMQ
with the mock engine (tests/harness.py) for a function-call round trip.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason
from pyfront.server.api.responses_api.store import ResponseStore, stored_response
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.state import ServingState
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.fakes import FakeEngine, Step
from tests.harness import MODEL as HARNESS_MODEL
from tests.harness import running_harness
from tests.server.api.test_handlers import call_then_leave, held_open

pytestmark = pytest.mark.anyio

MODEL = "fake-model"
PARSERS = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "reasoning_parser": "qwen3"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
CALL_TEXT = (
    "<think>I need the weather.</think>\n<tool_call>\n"
    + '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
ANSWER_TEXT = "<think>It is sunny.</think>It is sunny in Paris."


def make_app(**overrides: Any) -> FastAPI:
    return create_app(ServerConfig(model=BUNDLED_TOKENIZER_NAME, served_model_name=[MODEL], **overrides))


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    yield make_app(enable_responses_store=True, **PARSERS)


class TextEngine(FakeEngine):
    """A FakeEngine that answers each request with the next queued text, one token a step, then EOS."""

    def __init__(self, state: ServingState) -> None:
        self.texts: deque[str] = deque()
        self.tokenizer = state.tokenizer
        super().__init__(self._steps)

    def _steps(self, request: EngineCoreRequest) -> list[Step]:
        ids = self.tokenizer.encode(self.texts.popleft(), add_special_tokens=False)
        steps: list[Step] = [[EngineCoreOutput(request.request_id, [token])] for token in ids]
        eos = request.sampling_params.eos_token_id if request.sampling_params is not None else None
        assert eos is not None
        steps.append([EngineCoreOutput(request.request_id, [eos], finish_reason=int(FinishReason.STOP))])
        return steps

    def prompt(self, index: int = -1) -> list[int]:
        return list(self.added[index].prompt_token_ids or ())


@pytest.fixture
def engine(app: FastAPI) -> Iterator[TextEngine]:
    state: ServingState = app.state.serving
    state.engine = engine = TextEngine(state)
    yield engine
    state.engine = None


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=10) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=http, max_retries=0)


def render(app: FastAPI, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The full render of a conversation, as the chat route makes it: what a turn's prompt must equal."""
    tool_dicts = None
    if tools:
        keys = ("name", "description", "parameters", "strict")
        tool_dicts = [{"type": "function", "function": {k: t[k] for k in keys}} for t in tools]
    _, ids = app.state.serving.tokenizer.tokenize_chat(messages, tools=tool_dicts, add_generation_prompt=True)
    return list(ids)


def without_ids(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        body = item.model_dump() if not isinstance(item, dict) else dict(item)
        body.pop("id", None)
        body.pop("call_id", None)
        out.append(body)
    return out


async def test_a_text_answer_with_reasoning_streamed_and_not(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    engine.texts.extend([ANSWER_TEXT, ANSWER_TEXT])
    response = await client.responses.create(model=MODEL, input="Weather in Paris?", instructions="Be brief.")
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning, message = response.output
    assert reasoning.content is not None and reasoning.content[0].text == "It is sunny."
    assert message.content[0].text == "It is sunny in Paris." and response.output_text == "It is sunny in Paris."
    assert engine.prompt() == render(app, [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Weather in Paris?"}])  # fmt: skip
    usage = response.usage
    assert usage is not None and usage.input_tokens == len(engine.prompt())
    answer_ids = app.state.serving.tokenizer.encode(ANSWER_TEXT, add_special_tokens=False)
    assert usage.output_tokens == len(answer_ids) + 1  # and the EOS
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens

    stream = await client.responses.create(model=MODEL, input="Weather in Paris?", instructions="Be brief.",
                                           stream=True)  # fmt: skip
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert set(kinds[4 : kinds.index("response.reasoning_text.done")]) == {"response.reasoning_text.delta"}
    middle = kinds[kinds.index("response.reasoning_text.done") : kinds.index("response.output_text.delta")]
    assert middle == ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                      "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "It is sunny in Paris."
    final = events[-1].response
    # As vLLM 0.32: a non-streamed reasoning item has status null, a streamed one "completed".
    assert response.output[0].status is None and final.output[0].status == "completed"
    assert without_ids(final.output)[1:] == without_ids(response.output)[1:]
    assert final.output[0].content == response.output[0].content
    assert final.usage.output_tokens == usage.output_tokens and final.usage.input_tokens == usage.input_tokens


async def test_a_function_call_round_trip_explicit_and_by_previous_response_id(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    engine.texts.extend([CALL_TEXT, ANSWER_TEXT, ANSWER_TEXT])
    first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.name == "get_weather" and call.arguments == '{"city": "Paris"}' and call.call_id
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}

    explicit = [{"role": "user", "content": "Weather in Paris?"}, *[i.model_dump() for i in first.output], result]
    second = await client.responses.create(model=MODEL, input=explicit, tools=[WEATHER])
    assert second.output_text == "It is sunny in Paris."
    expected = render(app, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning": "I need the weather.", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": call.call_id},
    ], [WEATHER])  # fmt: skip
    assert engine.prompt() == expected

    chained = await client.responses.create(model=MODEL, input=[result], tools=[WEATHER], previous_response_id=first.id)
    assert engine.prompt() == expected
    assert chained.previous_response_id == first.id and chained.output_text == "It is sunny in Paris."


async def test_previous_response_id_over_several_turns_renders_the_whole_conversation(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    """Each turn's prompt is the full render of every earlier turn and its own input; instructions do not
    carry over (OpenAI's rule, and vLLM's)."""
    texts = ["<think>A.</think>One.", "<think>B.</think>Two.", "<think>C.</think>Three."]
    engine.texts.extend(texts)
    history: list[dict[str, Any]] = []
    previous = None
    for turn, (question, text) in enumerate(zip(["First?", "Second?", "Third?"], texts, strict=True)):
        response = await client.responses.create(model=MODEL, input=question, previous_response_id=previous,
                                                 instructions="Be brief." if turn == 0 else None)  # fmt: skip
        system = [{"role": "system", "content": "Be brief."}] if turn == 0 else []
        history.append({"role": "user", "content": question})
        assert engine.prompt() == render(app, system + history), turn
        reasoning, answer = text.removeprefix("<think>").split("</think>")
        history.append({"role": "assistant", "reasoning": reasoning, "content": answer})
        assert response.output_text == answer
        previous = response.id


async def test_stored_responses_get_delete_and_cancel(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    engine.texts.append(ANSWER_TEXT)
    response = await client.responses.create(model=MODEL, input="hi")
    got = await client.responses.retrieve(response.id)
    assert got.model_dump() == response.model_dump()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        for query, status, param in (("stream=maybe", 400, "stream"), ("stream=true", 400, "response_id"),
                                     ("stream=false", 200, None)):  # fmt: skip
            r = await http.get(f"/v1/responses/{response.id}?{query}")
            assert r.status_code == status and (status == 200 or r.json()["error"]["param"] == param), r.text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        await client.responses.cancel(response.id)
    await client.responses.delete(response.id)
    for call in (client.responses.retrieve, client.responses.delete, client.responses.cancel):
        with pytest.raises(openai.NotFoundError) as error:
            await call(response.id)
        assert error.value.body["param"] == "response_id" and response.id in error.value.body["message"]
    with pytest.raises(openai.NotFoundError) as error:
        await client.responses.create(model=MODEL, input="hi", previous_response_id=response.id)
    assert error.value.body["param"] == "previous_response_id"
    engine.texts.append(ANSWER_TEXT)
    unstored = await client.responses.create(model=MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_background_response_is_queued_then_completed(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    engine.texts.append(ANSWER_TEXT)
    queued = await client.responses.create(model=MODEL, input="hi", background=True)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    store: ResponseStore = app.state.responses_store
    await _until(lambda: not store.background.running(queued.id))
    done = await client.responses.retrieve(queued.id)
    assert done.status == "completed" and done.output_text == "It is sunny in Paris." and done.id == queued.id
    assert done.usage is not None and done.usage.output_tokens > 0
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        await client.responses.cancel(queued.id)  # finished: nothing to cancel


async def test_a_background_response_outlives_its_request_until_cancelled(app: FastAPI) -> None:
    """The POST returns while the engine request runs on; cancel aborts it and the status stays cancelled."""
    state: ServingState = app.state.serving
    state.engine = engine = FakeEngine(held_open)
    store: ResponseStore = app.state.responses_store
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            body = {"model": MODEL, "input": "hi", "background": True, "max_output_tokens": 3000}
            queued = (await http.post("/v1/responses", json=body)).json()
            assert queued["status"] == "queued"
            await _until(lambda: engine.num_in_flight == 1)
            assert state.active == 1 and store.background.running(queued["id"])  # the run owns its admission
            cancelled = await http.post(f"/v1/responses/{queued['id']}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
            assert engine.aborted == engine.added_ids and engine.num_in_flight == 0 and state.active == 0
            assert not store.background.running(queued["id"])
            got = await http.get(f"/v1/responses/{queued['id']}")
            assert got.json()["status"] == "cancelled"
            again = await http.post(f"/v1/responses/{queued['id']}/cancel")
            assert again.status_code == 400 and again.json()["error"]["param"] == "response_id"
            # Deleting a running one stops it too.
            second = (await http.post("/v1/responses", json=body)).json()
            await _until(lambda: engine.num_in_flight == 1)
            assert (await http.delete(f"/v1/responses/{second['id']}")).status_code == 200
            assert engine.num_in_flight == 0 and state.active == 0 and len(store.background) == 0
    finally:
        state.engine = None


async def test_a_streamed_background_response_can_be_streamed_again_from_any_event(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    engine.texts.append(CALL_TEXT)
    stream = await client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], background=True,
                                           stream=True)  # fmt: skip
    first = [event async for event in stream]
    kinds = [event.type for event in first]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in first] == list(range(len(first)))
    assert "response.function_call_arguments.delta" in kinds
    response_id = first[-1].response.id
    replay = await client.responses.retrieve(response_id, stream=True, starting_after=2)
    again = [event async for event in replay]
    assert [e.model_dump() for e in again] == [e.model_dump() for e in first[3:]]
    done = await client.responses.retrieve(response_id)
    assert done.status == "completed" and done.output[-1].type == "function_call"
    engine.texts.append(ANSWER_TEXT)
    plain = await client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as error:
        await client.responses.retrieve(plain.id, stream=True)
    assert error.value.body["param"] == "response_id"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        bad = await http.get(f"/v1/responses/{response_id}?stream=true&starting_after=x")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


async def test_background_needs_the_store() -> None:
    app = make_app()
    state: ServingState = app.state.serving
    state.engine = engine = TextEngine(state)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "background": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "background"
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in response.json()["error"]["message"] and engine.added == []


@pytest.mark.parametrize("env", [None, "1"])
async def test_without_the_store_nothing_is_kept_unless_vllm_s_variable_says_so(
    monkeypatch: pytest.MonkeyPatch, env: str | None
) -> None:
    """vLLM 0.32: `store` is ignored unless VLLM_ENABLE_RESPONSES_API_STORE=1; a previous id is then unknown."""
    if env is not None:
        monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", env)
    else:
        monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    app = make_app()
    state: ServingState = app.state.serving
    state.engine = engine = TextEngine(state)
    engine.texts.extend([ANSWER_TEXT, ANSWER_TEXT])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        first = (await http.post("/v1/responses", json={"model": MODEL, "input": "hi"})).json()
        again = await http.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "previous_response_id": first["id"]}
        )
        got = await http.get(f"/v1/responses/{first['id']}")
    if env is None:
        assert again.status_code == 404 and again.json()["error"]["param"] == "previous_response_id", again.text
        assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in again.json()["error"]["message"]
        assert got.status_code == 404
    else:
        assert again.status_code == 200, again.text
        assert got.status_code == 200 and got.json() == first


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
        ({"input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}, "input[0].encrypted_content"),
        ({"input": []}, "input"),
        ({"background": True, "store": False}, "background"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"include": ["everything"]}, "include"),
        ({"input": 5}, "input"),
        ({"request_id": "a\nb"}, "request_id"),
    ],
)
async def test_bad_requests_are_400s_naming_the_field(
    app: FastAPI, engine: TextEngine, extra: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError" and error["message"], error
    assert engine.added == []


async def test_an_unknown_model_is_a_404(app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="other", input="hi")
    assert engine.added == []


async def test_text_format_and_reasoning_effort_reach_the_engine_and_the_template(
    app: FastAPI, engine: TextEngine, client: openai.AsyncOpenAI
) -> None:
    """json_schema -> structured outputs (vLLM's mapping); effort "none" turns Qwen3's thinking off."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    engine.texts.append('{"city": "Paris"}')
    response = await client.responses.create(
        model=MODEL, input="City?", reasoning={"effort": "none"},
        text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
    )  # fmt: skip
    params = engine.added[-1].sampling_params
    assert params is not None and params.structured_outputs is not None
    assert params.structured_outputs.json == schema
    prompt = app.state.serving.tokenizer.decode(engine.prompt())
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert response.output_text == '{"city": "Paris"}' and response.reasoning is not None
    assert response.text is not None and response.text.format is not None and response.text.format.type == "json_schema"


async def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error_event(
    app: FastAPI, engine: TextEngine
) -> None:
    state: ServingState = app.state.serving
    state.engine = dying = FakeEngine(held_open)

    async def die_while_streaming() -> None:
        while not dying.num_in_flight:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        dying.die()

    killer = asyncio.create_task(die_while_streaming())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=10) as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True})
    await killer
    blocks = [b for b in response.text.split("\n\n") if b]
    assert blocks[0].startswith("event: response.created\n")
    assert blocks[-1].startswith("event: error\n") and '"type":"error"' in blocks[-1]
    assert dying.num_in_flight == 0 and state.active == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_aborts_the_engine_request(app: FastAPI, stream: bool) -> None:
    """As the chat route: non-streamed, the lane cancels the handler; streamed, the SSE response sees it."""
    state: ServingState = app.state.serving
    state.engine = engine = FakeEngine(held_open)
    leave = asyncio.Event()

    async def leave_once_running() -> None:
        while not engine.added or engine.num_in_flight < len(engine.added):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        leave.set()

    leaver = asyncio.create_task(leave_once_running())
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 3000, "stream": stream}
    await asyncio.wait_for(call_then_leave(app, "/v1/responses", body, leave), 5)
    await leaver
    assert engine.added and sorted(engine.aborted) == sorted(engine.added_ids) and engine.num_in_flight == 0
    assert state.active == 0
    state.engine = None


def test_the_store_evicts_least_recently_used_by_count_and_by_bytes() -> None:
    def entry(text: str) -> Any:
        return stored_response({"output": [], "text": text}, [], None, None, len(text))

    small = entry("x")
    store = ResponseStore(enabled=True, max_responses=2, max_bytes=10 * small.nbytes)
    store.put("a", small)
    store.put("b", entry("y"))
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", entry("z"))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None and len(store) == 2
    by_bytes = ResponseStore(enabled=True, max_responses=100, max_bytes=3 * small.nbytes)
    for name in "abcd":
        by_bytes.put(name, entry(name))
    assert [by_bytes.get(n) is not None for n in "abcd"] == [False, True, True, True]
    assert by_bytes.nbytes == 3 * small.nbytes
    by_bytes.put("huge", entry("h" * 10 * small.nbytes))  # larger than the whole store: not kept, nothing evicted
    assert by_bytes.get("huge") is None and len(by_bytes) == 3
    assert by_bytes.delete("b") and not by_bytes.delete("b") and by_bytes.nbytes == 2 * small.nbytes
    off = ResponseStore(enabled=False, max_responses=10, max_bytes=10**6)
    off.put("a", small)
    assert off.get("a") is None


def test_a_stored_continuation_drops_its_parents_prompt_and_its_bytes() -> None:
    """Only the newest response of a chain keeps its rendered prompt; the store's byte count follows."""
    from pyfront.server.text.prompts import TurnPrompt
    from pyfront.server.text.segment_cache import PromptTokens, _Cuts

    prompt = TurnPrompt(PromptTokens("x" * 1000, list(range(300)), _Cuts(0, 0)), b"FEH1" + b"\0" * 36, None, None)
    parent = stored_response({"output": []}, [], prompt, None, 100)
    store = ResponseStore(enabled=True, max_responses=10, max_bytes=10**6)
    store.put("a", parent)
    assert store.nbytes == parent.nbytes and parent.nbytes > prompt.nbytes
    child = stored_response({"output": []}, [], prompt, parent, 50)
    assert child.messages_bytes == parent.messages_bytes + parent.body_bytes + 50  # grows by the turn only
    store.put("b", child, "a")
    lean = store.get("a")
    assert lean is not None and lean.prompt is None and lean.body is parent.body
    assert store.nbytes == lean.nbytes + child.nbytes == parent.nbytes - prompt.nbytes + child.nbytes
    store.put("c", stored_response({"output": []}, [], None, child, 10), "gone")  # an evicted parent: fine
    assert store.get("b") is not None and store.get("b").prompt is prompt  # type: ignore[union-attr]


def test_a_function_call_round_trip_over_zmq_with_the_sync_client() -> None:
    """End to end (mock engine over ZMQ), streamed: the call, then its output answered by previous_response_id."""
    with running_harness({**PARSERS, "enable_responses_store": True}) as harness:
        client = harness.client()
        tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
        harness.mock.script(tokenizer.encode(CALL_TEXT, add_special_tokens=False),
                            tokenizer.encode(ANSWER_TEXT, add_special_tokens=False))  # fmt: skip
        with client.responses.stream(model=HARNESS_MODEL, input="Weather in Paris?", tools=[WEATHER]) as stream:
            kinds = [event.type for event in stream]
            first = stream.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
        call = first.output[-1]
        assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
        second = client.responses.create(
            model=HARNESS_MODEL, previous_response_id=first.id, tools=[WEATHER],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        )  # fmt: skip
        assert second.output_text == "It is sunny in Paris."
        assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens
