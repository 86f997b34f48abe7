"""truncate_prompt_tokens and return_token_ids on the chat and completions routes, in process.

vLLM 0.32 keeps the last N prompt tokens (its tokenizers truncate on the left for generation; ``truncation_side:
"right"`` keeps the first N; ``-1`` keeps the context length less one), so usage, the engine's prompt and the
block hashes are the truncated prompt's. ``return_token_ids`` adds the prompt's ids and each choice's generated
ids (streamed: per chunk). The real-engine tier compares both with vLLM's own front end
(tests/tiers/test_real_engine.py, LOGPROB_*_CASES and CHAT_STREAM_CASES).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pyfront.hashing import block_hashes, pack_block_hashes
from pyfront.server.generate.generation import prompt_truncation
from pyfront.server.state import ServingState
from tests.server.api.test_responses_api import MODEL, PARSERS, TextEngine, make_app

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello there how are you doing today, my friend?"}]


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    yield make_app(**PARSERS)


@pytest.fixture
def engine(app: FastAPI) -> Iterator[TextEngine]:
    state: ServingState = app.state.serving
    state.engine = engine = TextEngine(state)
    yield engine
    state.engine = None


def test_the_slice_is_vllm_s() -> None:
    assert prompt_truncation(None, None, 100, 10) is None
    assert prompt_truncation(10, None, 100, 10) is None and prompt_truncation(20, "right", 100, 10) is None
    assert prompt_truncation(3, None, 100, 10) == slice(-3, None)
    assert prompt_truncation(3, "left", 100, 10) == slice(-3, None)
    assert prompt_truncation(3, "right", 100, 10) == slice(0, 3)
    assert prompt_truncation(0, None, 100, 10) == slice(0, 0)
    assert prompt_truncation(-1, None, 8, 10) == slice(-7, None)  # the context less one token for the output
    assert prompt_truncation(-1, None, 100, 10) is None


async def _post(app: FastAPI, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.post(path, json={"model": MODEL, **body})


def _full_ids(app: FastAPI) -> list[int]:
    _, ids = app.state.serving.tokenizer.tokenize_chat(MESSAGES, add_generation_prompt=True)
    return list(ids)


@pytest.mark.parametrize(("truncate", "side", "keep"), [(5, None, slice(-5, None)), (5, "right", slice(0, 5))])
async def test_chat_truncation_reaches_the_engine(
    app: FastAPI, engine: TextEngine, truncate: int, side: str | None, keep: slice
) -> None:
    engine.texts.append("ok")
    body: dict[str, Any] = {"messages": MESSAGES, "truncate_prompt_tokens": truncate, "return_token_ids": True}
    if side is not None:
        body["truncation_side"] = side
    r = await _post(app, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    expected = _full_ids(app)[keep]
    sent = engine.added[-1]
    assert list(sent.prompt_token_ids or ()) == expected == r.json()["prompt_token_ids"]
    assert r.json()["usage"]["prompt_tokens"] == 5
    tokenizer = app.state.serving.tokenizer
    generated = [*tokenizer.encode("ok", add_special_tokens=False), tokenizer.eos_token_id]  # EOS too, as vLLM
    assert r.json()["choices"][0]["token_ids"] == generated
    if app.state.serving.engine.hasher is not None and sent.prompt_block_hashes is not None:
        block = app.state.serving.engine.hasher.config.block_size
        assert sent.prompt_block_hashes == pack_block_hashes(
            block_hashes(expected, app.state.serving.engine.hasher.config), block
        )


async def test_without_return_token_ids_there_are_none(app: FastAPI, engine: TextEngine) -> None:
    engine.texts.append("ok")
    r = await _post(app, "/v1/chat/completions", {"messages": MESSAGES})
    assert "prompt_token_ids" not in r.json() and "token_ids" not in r.json()["choices"][0]


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


async def test_streamed_token_ids_add_up(app: FastAPI, engine: TextEngine) -> None:
    text = "one two three four"
    engine.texts.append(text)
    r = await _post(app, "/v1/chat/completions", {"messages": MESSAGES, "stream": True, "return_token_ids": True})
    events = _events(r)
    assert events[0]["prompt_token_ids"] == _full_ids(app)
    ids = [i for e in events for c in e["choices"] for i in c.get("token_ids") or ()]
    tokenizer = app.state.serving.tokenizer
    assert ids == [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    engine.texts.append(text)
    r = await _post(app, "/v1/completions", {"prompt": "Say:", "stream": True, "return_token_ids": True,
                                             "echo": True})  # fmt: skip
    events = _events(r)
    first = events[0]["choices"][0]
    assert first["prompt_token_ids"] == app.state.serving.tokenizer.encode("Say:") and "Say" not in first["text"]
    ids = [i for e in events for c in e["choices"] for i in c.get("token_ids") or ()]
    tokenizer = app.state.serving.tokenizer
    assert ids == [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert "".join(c["text"] for e in events for c in e["choices"]) == text  # no echoed text with the ids
