"""Tool calls (hermes) and reasoning (qwen3) end to end: scripted mock output through the openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from pyfront.engine_client.mock_engine import MockConfig, MockEngine
from pyfront.server.cli import build_parser, config_from_args
from pyfront.server.config import ServerConfig
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port, transformers_tokenizer
from tests.harness import API_KEY, MODEL, start_server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[openai.OpenAI, MockEngine, object]]:
    rpc_port, http_port = free_port(), free_port()
    mock = MockEngine(
        MockConfig(handshake_address=f"tcp://127.0.0.1:{rpc_port}", ranks=[0], step_interval_s=0.001)
    ).start()
    config = ServerConfig(
        model=BUNDLED_TOKENIZER_NAME,
        served_model_name=[MODEL],
        port=http_port,
        api_key=[API_KEY],
        data_parallel_rpc_port=rpc_port,
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        reasoning_parser="qwen3",
    )
    server, thread = start_server(config)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key=API_KEY, max_retries=0)
    try:
        yield client, mock, server.config.app.state.serving.tokenizer
    finally:
        server.should_exit = True
        thread.join(10)
        mock.stop()


def ask(env, output: str, *, stream: bool, **kwargs):
    """Script the engine to emit exactly `output`, then ask; returns (message-like dict, finish_reason)."""
    client, mock, tokenizer = env
    mock.script(tokenizer.encode(output, add_special_tokens=False))
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=200, stream=stream, **kwargs
    )
    if not stream:
        message = response.choices[0].message
        extra = message.model_extra or {}
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []
        ]
        return {"content": message.content, "reasoning": extra.get("reasoning_content"), "calls": calls}, (
            response.choices[0].finish_reason
        )
    content, reasoning, finish = "", "", None
    calls: dict[int, dict] = {}
    for chunk in response:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            if call.id:
                assert entry["id"] is None, "the id comes once, on the first delta of a call"
                entry["id"] = call.id
                assert call.function.name, "the first delta carries the name"
                entry["name"] = call.function.name
            entry["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    ordered = [calls[i] for i in sorted(calls)]
    return {"content": content or None, "reasoning": reasoning or None, "calls": ordered}, finish


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_from_content(env, stream) -> None:
    result, finish = ask(env, "<think>\nThe user says hi. Greet back.\n</think>\n\nHello there!", stream=stream)
    assert result["reasoning"].strip() == "The user says hi. Greet back."
    assert result["content"].strip() == "Hello there!"
    assert "think" not in result["content"]
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_enable_thinking_false_is_all_content(env, stream) -> None:
    result, _ = ask(
        env, "Just an answer.", stream=stream, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert result["content"] == "Just an answer."
    assert not result["reasoning"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_auto(env, stream) -> None:
    output = (
        "<think>\nI need the weather and the time.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"FR\\" {x}"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time"}\n</tool_call>'
    )
    result, finish = ask(env, output, stream=stream, tools=TOOLS)
    assert finish == "tool_calls"
    assert [c["name"] for c in result["calls"]] == ["get_weather", "get_time"]
    assert json.loads(result["calls"][0]["arguments"]) == {"city": 'Paris "FR" {x}'}
    assert json.loads(result["calls"][1]["arguments"]) == {}  # parameterless: "{}", never dropped
    assert all(c["id"].startswith("call_") for c in result["calls"])
    assert not (result["content"] or "").strip()
    assert "weather and the time" in result["reasoning"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_inside_reasoning_ends_it_and_is_a_call(env, stream) -> None:
    # Qwen3.5-family models open a call while thinking and never close the thinking: vLLM 0.32 ends the
    # reasoning at <tool_call> and parses the call; so does pyfront (a lost call breaks an agent).
    output = '<think>\nI need the time.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    result, finish = ask(env, output, stream=stream, tools=TOOLS)
    assert [(c["name"], json.loads(c["arguments"])) for c in result["calls"]] == [("get_time", {})]
    assert result["reasoning"] == "\nI need the time.\n"
    assert not (result["content"] or "").strip()
    assert finish == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_call_stays_content(env, stream) -> None:
    result, finish = ask(
        env, "<think>\nx\n</think>\n\n<tool_call>\nnot json at all\n</tool_call>", stream=stream, tools=TOOLS
    )
    assert result["calls"] == []
    assert "not json at all" in result["content"]
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice(env, stream) -> None:
    output = '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    result, finish = ask(
        env, output, stream=stream, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert [c["name"] for c in result["calls"]] == ["get_weather"]
    assert json.loads(result["calls"][0]["arguments"]) == {"city": "Oslo"}
    assert finish == "stop"  # a named function keeps "stop", as vLLM


def test_auto_tool_choice_needs_the_flags() -> None:
    with pytest.raises(SystemExit, match="unknown tool call parser 'nope'; known: auto, hermes"):
        config_from_args(build_parser().parse_args(["serve", "--tool-call-parser", "nope"]))
    with pytest.raises(SystemExit, match="known: qwen3"):
        config_from_args(build_parser().parse_args(["serve", "--reasoning-parser", "nope"]))
    with pytest.raises(SystemExit, match="needs --tool-call-parser"):
        config_from_args(build_parser().parse_args(["serve", "--enable-auto-tool-choice"]))


@pytest.mark.parametrize("strict", [None, True])
def test_tools_render_as_vllm_renders_them(env, strict) -> None:
    """The chat template sees each tool as vLLM 0.32 passes it: `strict` only when the request set it (found by
    the openai SDK in the real-client tier: pyfront rendered `"strict": null`, 4 prompt tokens more per tool)."""
    client, _, tokenizer = env
    tool = json.loads(json.dumps(TOOLS[0]))
    if strict is not None:
        tool["function"]["strict"] = strict
    messages = [{"role": "user", "content": "hi"}]
    server_root = str(client.base_url).removesuffix("/").removesuffix("/v1")
    response = httpx.post(
        f"{server_root}/tokenize",
        json={"model": MODEL, "messages": messages, "tools": [tool]},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=30,
    ).json()
    expected = transformers_tokenizer(BUNDLED_TOKENIZER_NAME).apply_chat_template(
        messages, tools=[tool], add_generation_prompt=True, tokenize=False
    )
    assert response["tokens"] == tokenizer.encode(expected, add_special_tokens=False)
    assert ('"strict": true' in expected) is (strict is True) and '"strict": null' not in expected


@pytest.mark.parametrize(
    ("template_kwargs", "reasoning_ended"),
    [(None, False), ({"enable_thinking": True}, False), ({"enable_thinking": False}, True)],
)
def test_engine_request_says_where_the_reasoning_ends(env, template_kwargs, reasoning_ended) -> None:
    # What vLLM 0.32's chat serving sends (resolve_reasoning_ended + reasoning_parser_kwargs): an engine
    # started with --reasoning-parser then applies a forced tool choice's constraint only after </think>.
    client, mock, _ = env
    extra = {"chat_template_kwargs": template_kwargs} if template_kwargs is not None else {}
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=3,
        extra_body=extra,
    )
    sent = mock.ranks[0].recent[-1]
    assert sent.reasoning_ended is reasoning_ended
    assert sent.reasoning_parser_kwargs == {"chat_template_kwargs": template_kwargs or {}}
    assert sent.sampling_params.structured_outputs is not None
    assert sent.sampling_params.structured_outputs.structural_tag is not None
