"""The Messages API (POST /v1/messages, /v1/messages/count_tokens) through Anthropic's own Python SDK.

End to end over real ZMQ against the mock engine scripted with the model's output (tests/harness.py), with
`--tool-call-parser hermes --reasoning-parser qwen3`: text, thinking on and off, tool use and a tool_result
round trip, stop sequences, streamed and not; errors in Anthropic's shape (through the SDK's exception types
and raw HTTP); x-api-key and bearer auth; a client that leaves aborts its engine request; overload is 529.
In-process against tests/fakes.py's FakeEngine: what the engine is sent, and engine failures.
The side-by-side comparison with vLLM's own front end is tests/tiers/test_real_engine_messages.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest
from pyfront.server.anthropic.chat import chat_messages, to_chat_request
from pyfront.server.anthropic.decode import decode_messages_request
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.errors import RequestValidationError
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.fakes import DEFAULT_TOKENS, FakeEngine, Step
from tests.harness import API_KEY, MODEL, Harness, running_harness

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]
USER = [{"role": "user", "content": "hi"}]
PARSERS = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "reasoning_parser": "qwen3"}


def _hermes_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def env() -> Iterator[Harness]:
    with running_harness(PARSERS, output_len=None, step_interval_s=0.001) as harness:
        yield harness


def client(harness: Harness, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=harness.base_url, api_key=API_KEY, max_retries=0, **kwargs)


def script(harness: Harness, *outputs: str) -> None:
    """The next requests' outputs, one text each (the mock then samples the EOS)."""
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
    harness.mock.script(*(tokenizer.encode(text, add_special_tokens=False) for text in outputs))


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def blocks(message: anthropic.types.Message) -> list[dict[str, Any]]:
    """The content blocks with what is random (signatures, tool_use ids) checked and left out."""
    out = []
    for block in message.content:
        body = block.model_dump(exclude_none=True)
        if block.type == "thinking":
            assert len(body.pop("signature")) == 32
        if block.type == "tool_use":
            assert body.pop("id")
        out.append(body)
    return out


def test_text_answer_streamed_and_not(env: Harness) -> None:
    sdk = client(env)
    script(env, "Paris is the capital of France.", "Paris is the capital of France.")
    message = sdk.messages.create(model=MODEL, max_tokens=100, messages=USER, thinking={"type": "disabled"})
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert blocks(message) == [{"type": "text", "text": "Paris is the capital of France."}]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    prompt = sdk.messages.count_tokens(model=MODEL, messages=USER, thinking={"type": "disabled"}).input_tokens
    assert message.usage.input_tokens == prompt and message.usage.output_tokens == 8  # 7 tokens and the EOS
    assert message.usage.cache_read_input_tokens is None  # without --enable-prompt-tokens-details, as vLLM

    with sdk.messages.stream(model=MODEL, max_tokens=100, messages=USER, thinking={"type": "disabled"}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert blocks(final) == blocks(message) and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == prompt and final.usage.output_tokens == 8
    raw = [k for k in kinds if k not in ("text",)]  # the SDK adds a "text" event per text delta
    assert raw[:2] == ["message_start", "content_block_start"] and raw[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_raw_event_sequence_has_names_ping_and_usage(env: Harness) -> None:
    script(env, "<think>\nHmm.\n</think>\n\nHello.")
    body = {"model": MODEL, "max_tokens": 50, "messages": USER, "stream": True}
    with (
        httpx.Client(base_url=env.base_url, headers={"x-api-key": API_KEY}, timeout=30) as http,
        http.stream("POST", "/v1/messages", json=body) as response,
    ):
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    events = []
    for chunk in text.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append(data)
    kinds = [(e["type"], e.get("delta", {}).get("type") or e.get("content_block", {}).get("type")) for e in events]
    assert kinds[:4] == [("message_start", None), ("ping", None), ("content_block_start", "thinking"),
                         ("content_block_delta", "thinking_delta")]  # fmt: skip
    thinking_end = kinds.index(("content_block_stop", None))
    assert kinds[thinking_end - 1] == ("content_block_delta", "signature_delta")
    assert kinds[thinking_end + 1] == ("content_block_start", "text")
    assert kinds[-2:] == [("message_delta", None), ("message_stop", None)]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    thinking = "".join(e["delta"]["thinking"] for e in events if e.get("delta", {}).get("type") == "thinking_delta")
    content = "".join(e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta")
    assert (thinking.strip(), content.strip()) == ("Hmm.", "Hello.")
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1]
    end = events[-2]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"]["input_tokens"] == start["usage"]["input_tokens"] and end["usage"]["output_tokens"] > 0


def test_thinking_on_gives_a_thinking_block_and_off_renders_enable_thinking_false(env: Harness) -> None:
    sdk = client(env)
    output = "<think>\nThe user greets me.\n</think>\n\nHello!"
    script(env, output, output)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = sdk.messages.create(model=MODEL, max_tokens=2000, messages=USER, thinking=thinking)
    assert [b["type"] for b in blocks(message)] == ["thinking", "text"]
    assert message.content[0].thinking.strip() == "The user greets me."  # type: ignore[union-attr]
    assert message.content[1].text.strip() == "Hello!"  # type: ignore[union-attr]
    with sdk.messages.stream(model=MODEL, max_tokens=2000, messages=USER, thinking=thinking) as stream:
        signatures = [event.signature for event in stream if event.type == "signature"]
        final = stream.get_final_message()
    assert blocks(final) == blocks(message) and len(signatures) == 1
    # Off: the template's enable_thinking=False (an empty think block in the prompt, which then starts outside
    # the reasoning): more prompt tokens, and the same output is then all text (nothing is read as reasoning).
    on = sdk.messages.count_tokens(model=MODEL, messages=USER).input_tokens
    off = sdk.messages.count_tokens(model=MODEL, messages=USER, thinking={"type": "disabled"}).input_tokens
    assert off > on


def test_tool_use_round_trip(env: Harness) -> None:
    sdk = client(env)
    call = "<think>\nI need the weather.\n</think>\n\n" + _hermes_call("get_weather", {"city": "Paris"})
    answer = "<think>\nThe tool said 18 C.\n</think>\n\nIt is 18 C in Paris."
    script(env, call, call, answer)
    first = sdk.messages.create(model=MODEL, max_tokens=200, messages=USER, tools=TOOLS)
    assert first.stop_reason == "tool_use"
    assert [b["type"] for b in blocks(first)] == ["thinking", "tool_use"]
    tool_use = first.content[1]
    assert tool_use.type == "tool_use" and (tool_use.name, tool_use.input) == ("get_weather", {"city": "Paris"})
    assert tool_use.id  # the chat route's tool call id (random)

    with sdk.messages.stream(model=MODEL, max_tokens=200, messages=USER, tools=TOOLS) as stream:
        partial = "".join(event.partial_json for event in stream if event.type == "input_json")
        streamed = stream.get_final_message()
    assert json.loads(partial) == {"city": "Paris"}
    assert blocks(streamed) == blocks(first) and streamed.stop_reason == "tool_use"

    history = [
        *USER,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": [{"type": "text", "text": "18 C"}]},
        ]},
    ]  # fmt: skip
    second = sdk.messages.create(model=MODEL, max_tokens=200, messages=history, tools=TOOLS)
    assert second.stop_reason == "end_turn"
    assert second.content[-1].text.strip() == "It is 18 C in Paris."  # type: ignore[union-attr]
    with_result = sdk.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS).input_tokens
    assert second.usage.input_tokens == with_result > first.usage.input_tokens


def test_tool_choice_none_and_disable_parallel_tool_use(env: Harness) -> None:
    sdk = client(env)
    two = _hermes_call("get_weather", {"city": "Oslo"}) + "\n" + _hermes_call("get_time", {})
    script(env, two, two)
    one = sdk.messages.create(
        model=MODEL, max_tokens=200, messages=USER, tools=TOOLS, thinking={"type": "disabled"},
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert [b.get("name") for b in blocks(one)] == ["get_weather"] and one.stop_reason == "tool_use"
    none = sdk.messages.create(
        model=MODEL, max_tokens=200, messages=USER, tools=TOOLS, thinking={"type": "disabled"},
        tool_choice={"type": "none"},
    )  # fmt: skip
    assert [b["type"] for b in blocks(none)] == ["text"] and none.stop_reason == "end_turn"
    assert "<tool_call>" in none.content[0].text  # type: ignore[union-attr]


def test_stop_sequences_and_max_tokens(env: Harness) -> None:
    sdk = client(env)
    text = "One two three STOP four five"
    script(env, text, text, text)
    kwargs: dict[str, Any] = {"model": MODEL, "messages": USER, "thinking": {"type": "disabled"}}
    stopped = sdk.messages.create(max_tokens=100, stop_sequences=["STOP", "never"], **kwargs)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    assert stopped.content[0].text == "One two three "  # type: ignore[union-attr]
    with sdk.messages.stream(max_tokens=100, stop_sequences=["STOP"], **kwargs) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, blocks(final)) == ("stop_sequence", "STOP", blocks(stopped))
    cut = sdk.messages.create(max_tokens=2, **kwargs)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_system_prompt_as_string_or_blocks_renders_the_same(env: Harness) -> None:
    sdk = client(env)
    as_text = sdk.messages.count_tokens(model=MODEL, messages=USER, system="Be terse. Answer briefly.").input_tokens
    as_blocks = sdk.messages.count_tokens(
        model=MODEL,
        messages=USER,
        system=[{"type": "text", "text": "Be terse. "}, {"type": "text", "text": "Answer briefly."}],
    ).input_tokens
    plain = sdk.messages.count_tokens(model=MODEL, messages=USER).input_tokens
    assert as_text == as_blocks > plain


def test_errors_in_anthropics_shape_through_the_sdk(env: Harness) -> None:
    sdk = client(env)
    with pytest.raises(anthropic.NotFoundError) as not_found:
        sdk.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert not_found.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model `no-such-model` does not exist."},
    }
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 2000}, "at least 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1024}, "less than max_tokens"),
        ({"max_tokens": 0}, "max_tokens must be positive"),
        ({"tool_choice": {"type": "tool"}, "tools": TOOLS}, "tool_choice.name is required"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "does not match any"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "at most 4"),
        ({"extra_body": {"temperature": 5.0}}, "temperature"),  # this SDK no longer names the sampling fields
        ({"messages": []}, "at least one message"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                        ],
                    }
                ]
            },
            "image blocks are not supported",
        ),
    ]
    for fields, words in refusals:
        kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "messages": USER, **fields}
        with pytest.raises(anthropic.BadRequestError) as bad:
            sdk.messages.create(**kwargs)
        assert bad.value.status_code == 400
        assert bad.value.body["type"] == "error", fields  # type: ignore[index]
        assert bad.value.body["error"]["type"] == "invalid_request_error", fields  # type: ignore[index]
        assert words in bad.value.body["error"]["message"], (fields, bad.value.body)  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as unauthorized:
        anthropic.Anthropic(base_url=env.base_url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=USER
        )
    assert unauthorized.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.count_tokens(model=MODEL, messages=[])


def test_errors_in_anthropics_shape_over_raw_http(env: Harness) -> None:
    with httpx.Client(base_url=env.base_url, headers={"x-api-key": API_KEY}, timeout=30) as http:
        both = {b"{not json": 400, b"[1, 2]": 400, b"x" * (1024 * 1024 + 1): 413}
        messages_only = [
            {"model": MODEL, "messages": USER},  # max_tokens is required
            {"model": MODEL, "max_tokens": "many", "messages": USER},
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        ]
        cases = [
            (path, raw, status)
            for path in ("/v1/messages", "/v1/messages/count_tokens")
            for raw, status in both.items()
        ]
        cases += [("/v1/messages", json.dumps(body).encode(), 400) for body in messages_only]
        cases += [("/v1/messages/count_tokens", json.dumps({"model": MODEL, "messages": []}).encode(), 400)]
        for path, raw, status in cases:
            response = http.post(path, content=raw, headers={"content-type": "application/json"})
            assert response.status_code == status, (path, raw[:80], response.text)
            body = response.json()
            assert set(body) == {"type", "error"} and body["type"] == "error", body
            kind = "request_too_large" if status == 413 else "invalid_request_error"
            assert body["error"]["type"] == kind and body["error"]["message"], body
        no_key = httpx.post(f"{env.base_url}/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": USER})
        assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
        wrong_method = http.get("/v1/messages")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"


def test_x_api_key_and_bearer_auth(env: Harness) -> None:
    script(env, "Fine.", "Fine.")
    bearer = anthropic.Anthropic(base_url=env.base_url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(model=MODEL, max_tokens=20, messages=USER).content
    assert client(env).messages.create(model=MODEL, max_tokens=20, messages=USER).content  # x-api-key
    # The OpenAI routes keep vLLM's rule: Authorization: Bearer only.
    with httpx.Client(base_url=env.base_url, headers={"x-api-key": API_KEY}, timeout=30) as http:
        refused = http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 2})
    assert refused.status_code == 401 and set(refused.json()) == {"error"}


@pytest.fixture(scope="module")
def slow() -> Iterator[Harness]:
    """One token per 20 ms and room for one request at a time: streams that stay open while a test acts."""
    with running_harness({"max_num_seqs_in_flight": 1}, output_len=None, step_interval_s=0.02) as harness:
        yield harness


def test_client_disconnect_aborts_the_engine_request(slow: Harness) -> None:
    env = slow
    body = {"model": MODEL, "max_tokens": 4000, "messages": USER, "thinking": {"type": "disabled"}}
    before = env.mock_totals()["aborts"]
    with (
        httpx.Client(base_url=env.base_url, headers={"x-api-key": API_KEY}, timeout=30) as http,
        http.stream("POST", "/v1/messages", json={**body, "stream": True}) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("event: content_block_delta"):
                break
    assert wait_for(lambda: env.mock_totals()["aborts"] == before + 1 and env.mock_totals()["running"] == 0)
    # Non-streamed: the client gives up while the answer is being made.
    with (
        httpx.Client(base_url=env.base_url, headers={"x-api-key": API_KEY}, timeout=0.5) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post("/v1/messages", json=body)
    assert wait_for(lambda: env.mock_totals()["aborts"] == before + 2 and env.mock_totals()["running"] == 0)


def test_overload_is_529_overloaded_error(slow: Harness) -> None:
    harness = slow
    body = {"model": MODEL, "max_tokens": 4000, "messages": USER, "stream": True}
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with (
            httpx.Client(base_url=harness.base_url, headers={"x-api-key": API_KEY}, timeout=30) as http,
            http.stream("POST", "/v1/messages", json=body) as response,
        ):
            lines = response.iter_lines()  # kept: a dropped iterator closes the response (a disconnect)
            next(line for line in lines if line.startswith("event: content_block_delta"))
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            client(harness).messages.create(model=MODEL, max_tokens=5, messages=USER)
        assert overloaded.value.status_code == 529
        assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert overloaded.value.response.headers["retry-after"] == "1"
        # The OpenAI routes keep their 503.
        with harness.http() as http:
            assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 503
    finally:
        release.set()
        holder.join(10)
    assert wait_for(lambda: harness.mock_totals()["running"] == 0)


def test_thinking_budget_without_a_reasoning_parser_is_vllms_400(slow: Harness) -> None:
    """vLLM sends budget_tokens as thinking_token_budget, which it refuses without a reasoning config."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(slow).messages.create(
            model=MODEL, max_tokens=2000, messages=USER, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert "reasoning_config is not configured" in refused.value.body["error"]["message"]  # type: ignore[index]
    assert client(slow).messages.create(model=MODEL, max_tokens=2, messages=USER, thinking={"type": "disabled"})


# ------------------------------------------------------------------------- in-process, a FakeEngine behind it


def _app_and_client(engine: FakeEngine) -> tuple[Any, anthropic.AsyncAnthropic]:
    app = create_app(ServerConfig(model=BUNDLED_TOKENIZER_NAME, served_model_name=[MODEL]))
    app.state.serving.engine = engine
    # This SDK runs on httpx2 (httpx's successor), which has the same in-process ASGI transport.
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test", timeout=10)
    return app, anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http, max_retries=0)


@pytest.mark.anyio
async def test_the_engine_gets_the_requests_sampling_parameters() -> None:
    engine = FakeEngine()
    _, sdk = _app_and_client(engine)
    message = await sdk.messages.create(
        model=MODEL, max_tokens=3, messages=USER, stop_sequences=["zzz"], metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 7},  # this SDK no longer names them
    )  # fmt: skip
    (sent,) = engine.added
    params = sent.sampling_params
    assert params is not None
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (3, 0.5, 0.9, 7)
    assert params.stop == ["zzz"]
    assert message.usage.output_tokens == 3 and message.stop_reason == "max_tokens"


def _held_open(request: EngineCoreRequest) -> list[Step]:
    return [[EngineCoreOutput(request.request_id, [token])] for token in DEFAULT_TOKENS[:2]]


@pytest.mark.anyio
async def test_engine_failures_are_api_errors() -> None:
    import asyncio

    engine = FakeEngine(_held_open)
    app, sdk = _app_and_client(engine)

    async def die_soon() -> None:
        while not engine.num_in_flight:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        engine.die()

    killer = asyncio.create_task(die_soon())
    with pytest.raises(anthropic.InternalServerError) as dead:
        await sdk.messages.create(model=MODEL, max_tokens=50, messages=USER)
    await killer
    assert dead.value.status_code == 500 and dead.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert engine.num_in_flight == 0

    engine = FakeEngine(_held_open)
    app.state.serving.engine = engine
    killer = asyncio.create_task(die_soon())
    stream = await sdk.messages.create(model=MODEL, max_tokens=50, messages=USER, stream=True)
    seen = []
    with pytest.raises(anthropic.APIStatusError) as failed:
        async for event in stream:
            seen.append(event.type)
    await killer
    assert seen[0] == "message_start" and "content_block_delta" in seen
    assert failed.value.body["type"] == "error" and failed.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert engine.num_in_flight == 0

    app.state.serving.engine = None  # no engine up: 503, overloaded_error (retry later)
    with pytest.raises(anthropic.ServiceUnavailableError) as unavailable:
        await sdk.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert unavailable.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_finish_reason_stop_with_a_stop_token_is_end_turn() -> None:
    """A stop token id (an int stop_reason) is a natural end, not a stop sequence (vLLM's mapping)."""
    from pyfront.server.api.messages.convert import anthropic_stop_reason

    assert anthropic_stop_reason("stop", 151645, tool_used=False, tool_complete=False) == ("end_turn", None)
    assert anthropic_stop_reason("stop", "END", tool_used=False, tool_complete=False) == ("stop_sequence", "END")
    assert anthropic_stop_reason("stop", "END", tool_used=True, tool_complete=True) == ("tool_use", None)
    assert anthropic_stop_reason("stop", "END", tool_used=True, tool_complete=False) == ("stop_sequence", "END")
    assert anthropic_stop_reason("length", None, tool_used=True, tool_complete=True) == ("max_tokens", None)
    assert anthropic_stop_reason("abort", None, tool_used=False, tool_complete=False) == (None, None)


# ------------------------------------------------------------------------------- the conversion, on its own


def test_messages_become_vllms_chat_messages() -> None:
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"}, {"type": "text", "text": "Sys."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need a tool.", "signature": "s"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "5 C"},
                                                                              {"type": "text", "text": "windy"}]},
                {"type": "text", "text": "And tomorrow?"},
            ]},
            {"role": "system", "content": "Inline reminder."},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "done"}]},
        ],
    }  # fmt: skip
    request = decode_messages_request(json.dumps(body))
    converted = chat_messages(request, merge_inline_system=False)
    summary = [
        (m.role, m.content, m.reasoning, [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []],
         m.tool_call_id)
        for m in converted
    ]  # fmt: skip
    assert summary == [
        ("system", "Sys.", None, [], None),
        ("user", "Weather?", None, [], None),
        ("assistant", "Checking.", "Need a tool.", [("toolu_1", "get_weather", '{"city": "Oslo"}')], None),
        ("tool", "5 C\nwindy", None, [], "toolu_1"),
        ("user", "And tomorrow?", None, [], None),
        ("system", "Inline reminder.", None, [], None),
        ("tool", "done", None, [], "toolu_2"),  # a user message of tool results only: no user message
    ]
    merged = chat_messages(request, merge_inline_system=True)
    assert (merged[0].role, merged[0].content) == ("system", "Sys.Inline reminder.")
    assert [m.role for m in merged].count("system") == 1

    chat = to_chat_request(request, merge_inline_system=False, allow_request_chat_template=False, reasoning_parser=True)
    assert (chat.max_tokens, chat.max_completion_tokens, chat.tool_choice, chat.stream) == (10, 10, "none", False)
    with pytest.raises(RequestValidationError, match="Chat template is passed"):
        to_chat_request(
            decode_messages_request(json.dumps({**body, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}})),
            merge_inline_system=False,
            allow_request_chat_template=False,
            reasoning_parser=True,
        )


def test_tool_choices_and_thinking_map_as_vllm_maps_them() -> None:
    def chat(**fields: Any):
        body = {"model": MODEL, "max_tokens": 2000, "messages": USER, **fields}
        return to_chat_request(decode_messages_request(json.dumps(body)), merge_inline_system=False,
                               allow_request_chat_template=False, reasoning_parser=True)  # fmt: skip

    assert chat(tools=TOOLS).tool_choice == "auto"
    assert chat(tools=TOOLS, tool_choice={"type": "any"}).tool_choice == "required"
    assert chat(tools=TOOLS, tool_choice={"type": "none"}).tool_choice == "none"
    named = chat(tools=TOOLS, tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True})
    assert named.tool_choice.function.name == "get_time" and named.parallel_tool_calls is False  # type: ignore[union-attr]
    no_type = chat(tools=[{"name": "t", "input_schema": {"properties": {}}}]).tools
    assert no_type is not None and no_type[0].function.parameters == {"properties": {}, "type": "object"}
    assert chat(thinking={"type": "disabled"}).chat_template_kwargs == {"reasoning_effort": "none",
                                                                        "enable_thinking": False}  # fmt: skip
    kept = chat(thinking={"type": "disabled"}, chat_template_kwargs={"enable_thinking": True})
    assert kept.chat_template_kwargs is not None and kept.chat_template_kwargs["enable_thinking"] is True
    assert chat(thinking={"type": "enabled", "budget_tokens": 1024}).chat_template_kwargs is None
    assert chat(output_config={"effort": "low"}).chat_template_kwargs == {"reasoning_effort": "low",
                                                                          "enable_thinking": True}  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    formatted = chat(output_config={"format": {"type": "json_schema", "schema": schema}}).response_format
    assert formatted is not None and formatted.json_schema is not None and formatted.json_schema.schema == schema
