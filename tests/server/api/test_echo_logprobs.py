"""Echo, prompt logprobs and usage details of the completion routes, as vLLM 0.32's OpenAI layer gives them.

lm-evaluation-harness scores loglikelihoods with `echo: true, logprobs: 1, max_tokens: 1` and perplexity with
`max_tokens: 0`: a front end that drops the prompt's positions reports every loglikelihood as 0 without any
error. The expected numbers here follow from the mock engine's fixed logprob rules (prompt position i scores
-1.0 - 0.001 i with rank 1 + i % 4; sampled token at position j scores -0.25 - 0.01 (j % 10)); the same
answers are compared field by field with vLLM's own front end in the real-engine tier
(tests/tiers/test_real_engine.py::test_echo_prompt_logprobs_and_usage_match_vllm_frontend).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pyfront.server.chat.parsers.qwen3_reasoning import Qwen3ReasoningParser
from tests.harness import MODEL, Harness, running_harness

PROMPT = "Hello world"  # [9707, 1879] in the Qwen3 vocabulary


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with running_harness({"enable_prompt_tokens_details": True, "reasoning_parser": "qwen3"}) as harness:
        yield harness


def complete(harness: Harness, **body) -> dict:
    with harness.http() as client:
        r = client.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(harness: Harness, path: str, **body) -> list[dict]:
    with harness.http() as client, client.stream("POST", path, json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_loglikelihood_request_reports_the_prompt_positions(harness: Harness) -> None:
    """echo + logprobs 1 + max_tokens 1: the prompt's tokens then the generated one, the first unscored."""
    answer = complete(harness, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice = answer["choices"][0]
    lp = choice["logprobs"]
    generated = lp["tokens"][2]
    assert lp["tokens"][:2] == ["Hello", " world"]
    assert choice["text"] == PROMPT + generated
    assert lp["token_logprobs"][:2] == [None, -1.0]
    assert lp["token_logprobs"][2] == pytest.approx(-0.25)
    assert lp["text_offset"] == [0, 5, 11]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1][" world"] == -1.0 and len(lp["top_logprobs"][1]) == 2  # the token and top-1
    # The engine was asked for prompt logprobs, so the answer's own field carries them as vLLM dumps them.
    assert choice["prompt_logprobs"][0] is None
    entry = choice["prompt_logprobs"][1]
    assert entry["1879"] == {"logprob": -1.0, "rank": 1, "decoded_token": " world"}
    assert len(entry) == 2 and all(v["rank"] == 1 for v in entry.values())
    assert answer["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 3,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None},
        "completion_tokens_details": None,
    }


def test_echo_with_max_tokens_0_returns_the_prompt_alone(harness: Harness) -> None:
    """vLLM asks the engine for one token and drops it from text and logprobs (but counts it in usage)."""
    answer = complete(harness, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0)
    choice = answer["choices"][0]
    assert choice["text"] == PROMPT
    assert choice["logprobs"]["tokens"] == ["Hello", " world"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.0]
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 1
    plain = complete(harness, prompt=PROMPT, echo=True, max_tokens=0)["choices"][0]
    assert plain["text"] == PROMPT and plain["logprobs"] is None and plain["prompt_logprobs"] is None


def test_prompt_logprobs_without_echo(harness: Harness) -> None:
    choice = complete(harness, prompt="one two three", prompt_logprobs=2, max_tokens=2)["choices"][0]
    rows = choice["prompt_logprobs"]
    assert len(rows) == 3 and rows[0] is None
    assert [len(r) for r in rows[1:]] == [3, 3]  # the prompt token and the top 2
    assert [next(iter(r.values()))["rank"] for r in rows[1:]] == [1, 2]  # 1 + i % 4
    assert choice["logprobs"] is None


def test_token_prompt_echoes_its_decoded_text(harness: Harness) -> None:
    ids = [9707, 1879, 0]
    choice = complete(harness, prompt=ids, echo=True, max_tokens=0)["choices"][0]
    assert choice["text"] == "Hello world!"


@pytest.mark.parametrize("max_tokens", [0, 1, 5])
def test_streamed_echo_equals_the_non_streamed_answer(harness: Harness, max_tokens: int) -> None:
    """The first chunk carries the prompt (and its logprobs) before the first generated text, as vLLM's does."""
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0}
    full = complete(harness, **body)["choices"][0]
    events = stream(harness, "/v1/completions", **body)
    first = events[0]["choices"][0]
    assert first["text"].startswith(PROMPT) and first["prompt_token_ids"] == [9707, 1879]
    assert first["logprobs"]["token_logprobs"][:2] == [None, -1.0]
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    tokens = [
        t for e in events if e["choices"] and e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]
    ]
    offsets = [
        t
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for t in e["choices"][0]["logprobs"]["text_offset"]
    ]
    assert text == full["text"]
    assert tokens == full["logprobs"]["tokens"]
    assert offsets == full["logprobs"]["text_offset"]


def test_streamed_usage_details(harness: Harness) -> None:
    events = stream(harness, "/v1/completions", prompt=PROMPT, max_tokens=2, stream_options={"include_usage": True})
    assert events[-1]["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 4,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_chat_prompt_logprobs_and_reasoning_tokens(harness: Harness) -> None:
    """With a reasoning parser vLLM reports usage.completion_tokens_details.reasoning_tokens (langchain reads it)."""
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
    output = "<think>\nabc def ghi\n</think>\n\nhello world"
    ids = tokenizer.encode(output, add_special_tokens=False)
    harness.mock.script(ids, ids)
    with harness.http() as client:
        r = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1},
        )
    answer = r.json()
    assert answer["choices"][0]["message"]["reasoning"] == "\nabc def ghi\n"
    usage = answer["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 6}  # vLLM's qwen3 count for this output
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": 0, "multimodal_tokens": None}
    rows = answer["prompt_logprobs"]
    assert rows[0] is None and len(rows) == usage["prompt_tokens"]
    events = stream(harness, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}],
                    stream_options={"include_usage": True})  # fmt: skip
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}


# vLLM 0.32's qwen3 parser (`count_reasoning_tokens`) on these outputs, Qwen3 vocabulary, computed in its venv.
VLLM_QWEN3_REASONING_COUNTS = [
    ("<think>\nabc def ghi\n</think>\n\nhello world", True, 6),
    ("abc def</think>\n\nhi there", True, 2),
    ("no think at all here", True, 5),
    ("<think>\nreason only unfinished", True, 4),
    ("a</think>b</think>c", True, 1),
    ("<think>x<think>y</think>z", True, 2),
    ("a</think>b<think>c</think>d", True, 1),
    ("<think>\nabc def ghi\n</think>\n\nhello world", False, 0),
    ("no think at all here", False, 0),
]


@pytest.mark.parametrize(("output", "thinking", "expected"), VLLM_QWEN3_REASONING_COUNTS)
def test_reasoning_token_count_matches_vllm(harness: Harness, output: str, thinking: bool, expected: int) -> None:
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
    parser = Qwen3ReasoningParser(starts_in_reasoning=thinking)
    ids = tokenizer.encode(output, add_special_tokens=False)
    assert parser.count_reasoning_tokens(ids, tokenizer.token_id) == expected


def test_usage_without_details_flag_has_null_details() -> None:
    """Without the flags vLLM dumps both details as null (non-streamed) and leaves them out of usage chunks."""
    with running_harness() as harness, harness.http() as client:
        answer = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2}).json()
        assert answer["usage"]["prompt_tokens_details"] is None
        assert answer["usage"]["completion_tokens_details"] is None
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert r.json()["usage"]["completion_tokens_details"] is None
