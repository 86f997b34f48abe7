"""The HTTP server end to end: the official openai client against pyfront and the mock engine."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from tests.harness import API_KEY, MODEL, Harness, running_harness


def chat(harness: Harness, content: str = "Hello!", **kwargs):
    return harness.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kwargs
    )


# ---------------------------------------------------------------- happy paths


def test_chat_non_streaming(harness: Harness) -> None:
    response = chat(harness, max_tokens=5)
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert response.model == MODEL
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert len(choice.message.content.split()) == 5  # five whole-word tokens
    assert response.usage.completion_tokens == 5
    assert response.usage.prompt_tokens > 5
    assert response.usage.total_tokens == response.usage.prompt_tokens + 5


def test_chat_stops_on_eos(harness: Harness) -> None:
    response = chat(harness, max_tokens=100)
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens in (12, 13)  # 12 words, then EOS (counted like vLLM)
    assert "<|im_end|>" not in response.choices[0].message.content


def test_chat_streaming_matches_non_streaming(harness: Harness) -> None:
    full = chat(harness, "same prompt", max_tokens=8).choices[0].message.content
    stream = chat(harness, "same prompt", max_tokens=8, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []


def test_async_client_stream_and_not(harness: Harness) -> None:
    async def main() -> None:
        client = harness.async_client()
        response = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "async"}], max_tokens=4
        )
        assert response.usage.completion_tokens == 4
        stream = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, stream=True)
        texts = [c.choices[0].text async for c in stream]
        assert "".join(texts).strip()
        await client.close()

    asyncio.run(main())


def test_completions(harness: Harness) -> None:
    client = harness.client()
    response = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=6)
    assert response.object == "text_completion"
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 6
    echoed = client.completions.create(model=MODEL, prompt="Echo me", max_tokens=2, echo=True)
    assert echoed.choices[0].text.startswith("Echo me")
    batch = client.completions.create(model=MODEL, prompt=["first", "second"], max_tokens=2)
    assert sorted(c.index for c in batch.choices) == [0, 1]
    ids = client.completions.create(model=MODEL, prompt=[9707, 1879], max_tokens=2)
    assert ids.usage.prompt_tokens == 2


def test_streamed_completions_of_several_prompts_with_echo_match_non_streamed(harness: Harness) -> None:
    kwargs = {"model": MODEL, "prompt": ["first", "second"], "max_tokens": 3, "echo": True, "seed": 1}
    full = harness.client().completions.create(**kwargs)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in harness.client().completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in full.choices}
    assert texts[0].startswith("first") and texts[1].startswith("second")
    assert finishes == {0: "length", 1: "length"}


def test_n_two(harness: Harness) -> None:
    response = chat(harness, "two answers", n=2, max_tokens=4, seed=3)
    assert sorted(c.index for c in response.choices) == [0, 1]
    assert response.usage.completion_tokens == 8
    stream = chat(harness, "two answers", n=2, max_tokens=4, seed=3, stream=True)
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == {c.index: c.message.content for c in response.choices}


def test_logprobs(harness: Harness) -> None:
    response = chat(harness, "logprobs please", max_tokens=3, logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == 3
    assert "".join(entry.token for entry in content) == response.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)
    completion = harness.client().completions.create(model=MODEL, prompt="lp", max_tokens=3, logprobs=2)
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3 and len(lp.top_logprobs[0]) >= 2


def test_stop_string_across_tokens_aborts_engine(harness: Harness) -> None:
    full = chat(harness, "stop test", max_tokens=10).choices[0].message.content
    words = full.split(" ")
    # A stop string that starts inside one token and ends inside the next.
    stop = words[2][-2:] + " " + words[3][:2]
    before = harness.mock_totals()["aborts"]
    for stream in (False, True):
        response = chat(harness, "stop test", max_tokens=10, stop=[stop, "never-matches"], stream=stream)
        if stream:
            chunks = list(response)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            text = response.choices[0].message.content
            finish = [response.choices[0].finish_reason]
        assert text == full[: full.index(stop)]
        assert finish == ["stop"]
    time.sleep(0.2)
    assert harness.mock_totals()["aborts"] - before >= 1


def test_requests_of_one_shape_share_their_sampling_parameters(harness: Harness) -> None:
    """A request with the sampling fields of an earlier one is a SamplingMemo hit (server/generate/sampling.py), and
    still gets its own max_tokens."""
    first = chat(harness, "first question", max_tokens=3, temperature=0.5, stop=["zz"])
    memo = harness.app.state.serving.sampling_memo  # type: ignore[attr-defined]
    before = memo.hits
    second = chat(harness, "a second, longer question", max_tokens=5, temperature=0.5, stop=["zz"])
    assert memo.hits == before + 1
    assert first.usage.completion_tokens == 3 and second.usage.completion_tokens == 5


def test_multibyte_characters_split_over_tokens(harness: Harness) -> None:
    tokenizer = harness.app.state.serving.tokenizer
    text = "héllo 世界 🎉 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # some characters span several tokens
    for stream in (False, True):
        harness.mock.script(ids)
        response = chat(harness, "script", max_tokens=50, stream=stream)
        if stream:
            deltas = [c.choices[0].delta.content or "" for c in response if c.choices]
            assert all("\ufffd" not in d for d in deltas)
            got = "".join(deltas)
        else:
            got = response.choices[0].message.content
        assert got == text


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("payload", "status", "fragment"),
    [
        ({"messages": "not a list"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "no-such-model"}, 404, "does not exist"),
        ({"messages": [{"role": "user", "content": "x " * 5000}]}, 400, "context length"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400, "max_tokens"),
    ],
)
def test_bad_requests(harness: Harness, payload: dict, status: int, fragment: str) -> None:
    payload = {"model": MODEL, **payload}
    with harness.http() as http:
        response = http.post("/v1/chat/completions", json=payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"] or fragment == error.get("param")
    assert error["code"] == status


def test_malformed_json_bad_key_unknown_route_big_body(harness: Harness) -> None:
    with harness.http() as http:
        response = http.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and "error" in response.json()
        assert http.get("/v1/nothing-here").status_code == 404
        big = http.post("/v1/completions", content=b"x" * (2 * 1024 * 1024))
        assert big.status_code == 413 and big.json()["error"]["code"] == 413
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{harness.base_url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{harness.base_url}/health").status_code == 200  # open without a key
    assert httpx.get(f"{harness.base_url}/v1/models").status_code == 401


def test_models_version_tokenize_detokenize_load_metrics(harness: Harness) -> None:
    models = harness.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    with harness.http() as http:
        assert http.get("/version").json()["version"]
        tokens = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
        assert tokens["tokens"] == [9707, 1879] and tokens["count"] == 2
        assert http.post("/detokenize", json={"model": MODEL, "tokens": [9707, 1879]}).json()["prompt"] == "Hello world"
        assert http.get("/load").json() == {"server_load": 0}
        metrics = http.get("/metrics").text
        assert "vllm:time_to_first_token_seconds" in metrics
        assert "vllm:request_success_total" in metrics
        assert "pyfront:feh_memo_hits_total" in metrics
        assert http.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]


def test_client_disconnect_aborts_engine_request(harness: Harness) -> None:
    before = harness.mock_totals()
    with (
        harness.http() as http,
        http.stream(
            "POST",
            "/v1/completions",
            json={"model": MODEL, "prompt": "long", "max_tokens": 3000, "stream": True, "ignore_eos": True},
        ) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        totals = harness.mock_totals()
        if totals["aborts"] > before["aborts"] and totals["running"] == 0:
            break
        time.sleep(0.05)
    totals = harness.mock_totals()
    assert totals["aborts"] == before["aborts"] + 1
    assert totals["running"] == 0


def test_slow_reader_gets_every_frame_in_order() -> None:
    """A client that stops reading fills the socket: writes wait (flow control), nothing is lost or reordered."""
    tokens, per_step = 12000, 16  # 750 frames of 16 tokens x 20 logprobs: >10 MB, more than the socket buffers
    body = json.dumps(
        {"model": MODEL, "prompt": "slow reader", "max_tokens": tokens, "stream": True, "ignore_eos": True,
         "logprobs": 20, "stream_options": {"include_usage": True}}
    ).encode()  # fmt: skip
    with running_harness(tokens_per_step=per_step, output_len=None, max_model_len=32768) as harness:
        port = int(harness.base_url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            # Nobody reads until the engine has produced every token (>10 MB of frames): more than the
            # kernel's socket buffers hold, so the server's writes must have waited.
            _wait_for(lambda: harness.mock_totals()["running"] >= 1, 10)
            _wait_for(lambda: harness.mock_totals()["running"] == 0, 30)
            raw = bytearray()
            sock.settimeout(30)
            while not raw.endswith(b"0\r\n\r\n"):
                chunk = sock.recv(1 << 20)
                assert chunk, "connection closed before the end of the stream"
                raw += chunk
        with harness.http() as http:
            waits = _metric(http.get("/metrics").text, "pyfront:stream_write_waits_total")
    head, _, chunked = bytes(raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    parts, pos = [], 0
    while True:
        end = chunked.index(b"\r\n", pos)
        size = int(chunked[pos:end], 16)
        if size == 0:
            break
        parts.append(chunked[end + 2 : end + 2 + size])
        pos = end + 2 + size + 2
    events = [e[len("data: ") :] for e in b"".join(parts).decode().split("\n\n") if e]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = [c["choices"][0] for c in chunks if c["choices"]]
    assert sum(len(c["logprobs"]["tokens"]) for c in streamed) == tokens
    assert chunks[-1]["usage"]["completion_tokens"] == tokens
    offsets = [o for c in streamed for o in c["logprobs"]["text_offset"]]
    assert offsets == sorted(offsets), "frames arrived out of order"
    assert waits > 0, "the client never pushed back: the test did not exercise flow control"


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the mock engine"
        time.sleep(0.02)


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


# ---------------------------------------------------------------- FEH through the server


def test_multi_turn_chat_hashes_verified_and_memo_hits(harness: Harness) -> None:
    before = harness.mock_totals()
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 80}]
    for turn in range(5):
        messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more about it. " * 40})
        reply = harness.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    totals = harness.mock_totals()
    assert totals["hashes_used"] - before["hashes_used"] == 5
    assert totals["hashes_mismatched"] == 0 and totals["hashes_missing"] == 0
    with harness.http() as http:
        metrics = http.get("/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith("pyfront:feh_memo_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 4


def test_request_id_header_round_trips(harness: Harness) -> None:
    with harness.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "id"}], "max_tokens": 1},
            headers={"X-Request-Id": "my-id-123"},
        )
    assert response.status_code == 200
    assert response.json()["id"] == "chatcmpl-my-id-123"
    assert "x-request-id" not in response.headers  # only with --enable-request-id-headers, as in vLLM
    assert json.loads(response.text)["choices"][0]["finish_reason"] == "length"


def test_one_finish_per_choice_when_stop_strings_end_merged_streams(harness: Harness) -> None:
    """Several prompts x n: the per-choice pumps read ahead; outputs after a stop string must be dropped."""
    words = chat(harness, "probe", max_tokens=6).choices[0].message.content.split()
    with harness.http() as http:
        for _ in range(10):
            payload = {"model": MODEL, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 40, "stream": True,
                       "ignore_eos": True, "stop": [" the", " and", " of", f" {words[1]}"]}  # fmt: skip
            finishes: dict[int, int] = {}
            with http.stream("POST", "/v1/completions", json=payload) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            if choice.get("finish_reason"):
                                finishes[choice["index"]] = finishes.get(choice["index"], 0) + 1
            assert finishes == {i: 1 for i in range(6)}


@pytest.mark.parametrize("reason", [0, 1, 2, 4, 7])
def test_finish_reason_names_come_from_the_protocol(harness: Harness, reason: int) -> None:
    """One table of finish-reason names (protocol.finish_reason_name): the serving layer used to keep its own,
    which named an unknown reason from a newer engine "stop" where the protocol says "error"."""
    from unittest import mock

    from pyfront.engine_client.protocol import EngineCoreOutput, finish_reason_name
    from pyfront.server.generate import generation as serving
    from pyfront.server.text.stream import TextStream

    generation = object.__new__(serving.Generation)
    generation.state = mock.MagicMock()
    generation.engine = mock.MagicMock()
    generation.first_token_at = generation.started = generation.last_output_at = time.monotonic()
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
    choice = serving.Choice(0, "r", generation=generation)
    choice.text = TextStream(tokenizer.hf)
    generation.on_output(choice, EngineCoreOutput("r", [9707], finish_reason=reason))
    assert choice.finish_reason == finish_reason_name(reason)
    assert finish_reason_name(7) == "error"
