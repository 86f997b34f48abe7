"""Chat prompts rendered exactly as vLLM 0.32 renders them, tools and message fields included.

tests/data/chat_render_cases.json holds tricky chat requests (tools with and without description,
parameters or strict, tool round trips, explicit nulls, names, content parts, reasoning in the history,
continue_final_message, thinking off); tests/data/vllm_chat_render_tokens.json holds the token ids vLLM
0.32's own front end returns for each from POST /tokenize on the Qwen3 vocabulary and template that
pyfront bundles (recorded from the real-engine tier's vLLM front end; that tier checks them live again:
tests/tiers/test_real_engine.py::test_chat_rendering_matches_vllm_frontend). A different prompt is a different
request to the model: every token must match.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pyfront.server.openai.types import FunctionDefinition, Tool, tool_dicts
from tests.conftest import DATA_DIR
from tests.harness import MODEL, Harness, running_harness

CASES: dict[str, dict] = json.loads((DATA_DIR / "chat_render_cases.json").read_text())
VLLM_TOKENS: dict[str, list[int]] = json.loads((DATA_DIR / "vllm_chat_render_tokens.json").read_text())


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with running_harness({"tool_call_parser": "hermes", "enable_auto_tool_choice": True}) as harness:
        yield harness


def tokenize_body(case: dict) -> dict:
    """The case as a /tokenize body (vLLM's tokenize request has no tool_choice; chat keeps the tools with "none")."""
    return {"model": MODEL, **{k: v for k, v in case.items() if k != "tool_choice"}}


def test_every_case_has_a_vllm_vector() -> None:
    assert set(CASES) == set(VLLM_TOKENS) and len(CASES) >= 13


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_prompt_equals_vllm(harness: Harness, name: str) -> None:
    with harness.http() as client:
        r = client.post("/tokenize", json=tokenize_body(CASES[name]))
    assert r.status_code == 200, r.text
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]
    ours, theirs = r.json()["tokens"], VLLM_TOKENS[name]
    assert ours == theirs, f"\npyfront: {tokenizer.decode(ours)!r}\nvLLM:    {tokenizer.decode(theirs)!r}"


@pytest.mark.parametrize("name", ["tools_full", "tool_round_trip", "tool_choice_none_keeps_tools"])
def test_chat_completion_prompt_tokens_equal_vllm(harness: Harness, name: str) -> None:
    """The chat route renders what /tokenize renders: usage.prompt_tokens is vLLM's count."""
    case = CASES[name]
    body = {"model": MODEL, "max_tokens": 1, **case}
    with harness.http() as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(VLLM_TOKENS[name])


def test_tool_dicts_follow_vllm_serializers() -> None:
    plain = Tool(function=FunctionDefinition(name="f"))
    assert tool_dicts([plain]) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
    ]
    strict = Tool(function=FunctionDefinition(name="g", parameters={}, strict=False), defer_loading=True)
    assert tool_dicts([strict]) == [
        {
            "type": "function",
            "function": {"name": "g", "description": None, "parameters": {}, "strict": False, "defer_loading": True},
            "defer_loading": True,
        }
    ]


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", "42", ""])
def test_malformed_tool_call_arguments_render_as_an_empty_object(harness: Harness, arguments: str) -> None:
    """vLLM 0.32 coerces them to {} (a refused history would fail every later turn), so the prompt is the
    one a well-formed empty call gives, and the request is served."""
    tokenizer = harness.app.state.serving.tokenizer  # type: ignore[attr-defined]

    def messages(args: str) -> list[dict]:
        call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": args}}
        return [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]  # fmt: skip

    with harness.http() as client:
        ours = client.post("/tokenize", json={"model": MODEL, "messages": messages(arguments)})
        empty = client.post("/tokenize", json={"model": MODEL, "messages": messages("{}")})
    assert ours.status_code == 200, ours.text
    assert ours.json()["tokens"] == empty.json()["tokens"], tokenizer.decode(ours.json()["tokens"])


def test_empty_tool_calls_list_is_dropped(harness: Harness) -> None:
    with_empty = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": []}]
    without = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with harness.http() as client:
        a = client.post("/tokenize", json={"model": MODEL, "messages": with_empty}).json()["tokens"]
        b = client.post("/tokenize", json={"model": MODEL, "messages": without}).json()["tokens"]
    assert a == b
