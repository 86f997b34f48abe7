"""The Messages API side by side with vLLM 0.32's own front end (vllm/entrypoints/anthropic/).

vLLM's `vllm serve` and `pyfront serve`, each with `--tool-call-parser <hermes | qwen3_coder>
--enable-auto-tool-choice --reasoning-parser qwen3`, each against pyfront's mock engine scripted with the
same outputs, answer the same `POST /v1/messages` requests (text, thinking on and off, tool calls, a tool_use
-> tool_result round trip, stop sequences, max_tokens, system blocks, count_tokens; with qwen3_coder also
tool_choice any and a named tool, forced by the format's structural tag, and disable_parallel_tool_use),
streamed and not. What must be equal: the content blocks (thinking, text, tool_use name and input),
stop_reason, usage, and the streamed event sequence (block starts and stops, delta kinds, the text of each
block, message_delta), with ids and signatures (random by design) left out and consecutive deltas of one
block joined (how tokens fall into engine outputs is timing).

The deliberate differences, each asserted below with its reason:
- `id`: vLLM reuses its chat id (`chatcmpl-...`); pyfront's is `msg_...`, as Anthropic's.
- `stop_sequence`: vLLM's non-streamed body leaves it out when null (`exclude_none`); pyfront always sends it,
  as Anthropic's API does (the SDK's Message has the field).
- `ping`: pyfront sends Anthropic's `event: ping` after message_start; vLLM sends none.
- vLLM's hermes stream sends the "\n\n" between the reasoning and a tool call as content (its chat stream's
  quirk: tests/tiers/test_real_engine.py, VLLM_STREAM_WHITESPACE_BEFORE_CALLS), which becomes a text block of
  whitespace before the tool_use block; its own non-streamed answer has none, nor has pyfront's stream.
- Errors: vLLM answers bad requests in its OpenAI shape (FastAPI's validation handler) or puts OpenAI type
  names (`BadRequestError`, `NotFoundError`) in Anthropic's envelope; pyfront gives Anthropic's error types.
  The statuses are the same.

Run with tools/real_engine/run_tier.sh (it runs this file by default).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.tiers.test_real_engine import (
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    _model_id,
    _parser_flags,
    _ports,
    _start_mock_engine,
    _start_pyfront_server,
    managed_processes,
    tiny_model,  # noqa: F401 - a fixture, used by name
    tokenizer,  # noqa: F401 - a fixture, used by name
    vllm_venv,  # noqa: F401 - a fixture, used by name
)
from tools.real_engine import engine as real_engine

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
    {"name": "get_time", "description": "The current time.", "input_schema": {"properties": {}}},
]


def _hermes_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


ROUND_TRIP_MESSAGES = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I need the weather.", "signature": "abc"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C, sunny"}]},
            {"type": "text", "text": "Thanks. Summarise it."},
        ],
    },
]

# name: (scripted model output, request fields beyond model/max_tokens/messages). Each output is followed by
# the EOS unless max_tokens or a stop sequence ends it first.
CASES: dict[str, tuple[str, dict]] = {
    "thinking_then_text": (
        "<think>\nThe user says hello.\n</think>\n\nHello! I am a tiny test model.",
        {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2000},
    ),
    "thinking_disabled": ("Paris is the capital of France.", {"thinking": {"type": "disabled"}}),
    "tool_use": (
        "<think>\nI need the weather in Paris.\n</think>\n\n" + _hermes_call("get_weather", {"city": "Paris"}),
        {"tools": TOOLS},
    ),
    "two_tool_uses_tool_choice_auto": (
        "<think>\nWeather and time.\n</think>\n\n"
        + _hermes_call("get_weather", {"city": "Berlin", "unit": "celsius"})
        + "\n"
        + _hermes_call("get_time", {}),
        {"tools": TOOLS, "tool_choice": {"type": "auto"}},
    ),
    "tool_result_round_trip": (
        "<think>\nThe tool said 18 C.\n</think>\n\nIt is 18 C and sunny in Paris.",
        {"tools": TOOLS, "messages": ROUND_TRIP_MESSAGES},
    ),
    "stop_sequence": (
        "<think>\nCount.\n</think>\n\nOne two three STOP four five",
        {"stop_sequences": ["STOP", "never"]},
    ),
    "max_tokens": ("<think>\nA long thought that is cut short here.\n</think>\n\nNever reached.", {"max_tokens": 5}),
    "system_blocks_and_inline_system": (
        "Yes.",
        {
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cch=123;"},
                {"type": "text", "text": "You are terse. "},
                {"type": "text", "text": "Answer in one word."},
            ],
            "messages": [
                {"role": "user", "content": "Is it on?"},
                {"role": "system", "content": "Reminder: be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Well?"}]},
            ],
            "thinking": {"type": "disabled"},
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "metadata": {"user_id": "u-1"},
        },
    ),
}

VLLM_STREAM_WHITESPACE_BEFORE_TOOL_USE = {"tool_use", "two_tool_uses_tool_choice_auto"}
"""Cases whose vLLM stream has a whitespace-only text block before the first tool_use (see the module docstring)."""


def _xml_call(name: str, arguments: dict[str, str]) -> str:
    """A Qwen3-Coder XML call (--tool-call-parser qwen3_coder)."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


XML_CASES: dict[str, tuple[str, dict]] = {
    "xml_tool_use": (
        "<think>\nI need the weather in Paris.\n</think>\n\n" + _xml_call("get_weather", {"city": "Paris"}),
        {"tools": TOOLS},
    ),
    "xml_tool_choice_any": (
        "<think>\nAny tool.\n</think>\n\n" + _xml_call("get_time", {}),
        {"tools": TOOLS, "tool_choice": {"type": "any"}},
    ),
    "xml_tool_choice_tool": (
        "<think>\nForced.\n</think>\n\n" + _xml_call("get_weather", {"city": "Rome", "unit": "celsius"}),
        {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}},
    ),
    "xml_two_calls_one_allowed": (
        "<think>\nBoth.\n</think>\n\n" + _xml_call("get_weather", {"city": "Oslo"}) + "\n" + _xml_call("get_time", {}),
        {"tools": TOOLS, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
    ),
    "xml_thinking_disabled_call": (
        _xml_call("get_weather", {"city": "Lima"}),
        {"tools": TOOLS, "thinking": {"type": "disabled"}},
    ),
}
"""For --tool-call-parser qwen3_coder: forced tool choices (any, a named tool: the format's structural tag) too."""

PARSER_SUITES: dict[str, tuple[dict[str, tuple[str, dict]], set[str]]] = {
    "hermes": (CASES, VLLM_STREAM_WHITESPACE_BEFORE_TOOL_USE),
    "qwen3_coder": (XML_CASES, set()),
}

COUNT_TOKENS_CASES = {
    "plain": {"messages": [{"role": "user", "content": "Count me."}]},
    "tools_round_trip": {"messages": ROUND_TRIP_MESSAGES, "tools": TOOLS, "system": "Be helpful."},
    "thinking_disabled": {"messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "disabled"}},
}

ERROR_CASES: dict[str, object] = {
    "missing_max_tokens": {"messages": [{"role": "user", "content": "x"}]},
    "budget_below_1024": {
        "max_tokens": 2000,
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "messages": [{"role": "user", "content": "x"}],
    },
    "budget_not_below_max_tokens": {
        "max_tokens": 1500,
        "thinking": {"type": "enabled", "budget_tokens": 1500},
        "messages": [{"role": "user", "content": "x"}],
    },
    "tool_choice_tool_without_name": {
        "max_tokens": 4,
        "tools": TOOLS,
        "tool_choice": {"type": "tool"},
        "messages": [{"role": "user", "content": "x"}],
    },
    "unknown_model": {"model": "no-such-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
    "not_json": b"{not json",
}

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def _events(response: httpx.Response) -> list[tuple[str, dict]]:
    """An SSE body as (event name, data) pairs; every event must be named as its data's type says."""
    out: list[tuple[str, dict]] = []
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])
            assert name == data["type"], (name, data)
            out.append((name, data))
            name = None
    return out


def _full_comparable(body: dict) -> dict:
    """A non-streamed Message without what is random by design: the id, signatures, tool_use ids."""
    body = copy.deepcopy(body)
    assert body.pop("id")
    for block in body["content"]:
        if block["type"] == "thinking":
            assert isinstance(block.pop("signature"), str)
        if block["type"] == "tool_use":
            assert isinstance(block.pop("id"), str)
    return body


def _stream_comparable(events: list[tuple[str, dict]], *, drop_whitespace_text: bool = False) -> list:
    """A stream as its event sequence: deltas of one block joined (JSON input compared as a value), ids and
    signatures out, pings out (counted by the caller); with `drop_whitespace_text`, whitespace-only text blocks
    removed and the blocks renumbered."""
    blocks: dict[int, dict] = {}
    order: list = []
    for name, data in events:
        if name == "ping":
            continue
        if name == "message_start":
            message = dict(data["message"])
            assert message.pop("id")
            order.append(("message_start", message))
        elif name == "content_block_start":
            block = dict(data["content_block"])
            if block["type"] == "tool_use":
                assert block.pop("id")
            entry = {"start": block, "deltas": {}, "stopped": False}
            blocks[data["index"]] = entry
            order.append(("block", data["index"]))
        elif name == "content_block_delta":
            entry = blocks[data["index"]]
            assert not entry["stopped"], data
            delta = data["delta"]
            kind = delta["type"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json",
                   "signature_delta": "signature"}[kind]  # fmt: skip
            entry["deltas"][kind] = entry["deltas"].get(kind, "") + delta[key]
        elif name == "content_block_stop":
            blocks[data["index"]]["stopped"] = True
        else:
            order.append((name, data))
    out: list = []
    index = 0
    for item in order:
        if item[0] != "block":
            out.append(item)
            continue
        entry = blocks[item[1]]
        assert entry["stopped"], entry
        deltas = entry["deltas"]
        if drop_whitespace_text and entry["start"]["type"] == "text" and not deltas.get("text_delta", "").strip():
            continue
        if "signature_delta" in deltas:
            assert entry["start"]["type"] == "thinking" and deltas.pop("signature_delta")
        if "input_json_delta" in deltas:
            deltas["input_json_delta"] = json.loads(deltas["input_json_delta"])
        out.append(("block", index, entry["start"], deltas))
        index += 1
    return out


def _folded_stream(comparable: list) -> dict:
    """A comparable stream as the non-streamed Message it stands for (content blocks, stop_reason, usage)."""
    content = []
    stop_reason = stop_sequence = usage = None
    for item in comparable:
        if item[0] == "block":
            _, _, start, deltas = item
            if start["type"] == "text":
                content.append({"type": "text", "text": deltas.get("text_delta", "")})
            elif start["type"] == "thinking":
                content.append({"type": "thinking", "thinking": deltas.get("thinking_delta", "")})
            else:
                content.append({"type": "tool_use", "name": start["name"], "input": deltas.get("input_json_delta", {})})
        elif item[0] == "message_delta":
            stop_reason = item[1]["delta"]["stop_reason"]
            stop_sequence = item[1]["delta"]["stop_sequence"]
            usage = item[1]["usage"]
    return {"content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}


@pytest.mark.real_engine
@pytest.mark.parametrize("tool_parser", list(PARSER_SUITES))
def test_messages_match_vllm_frontend(
    tool_parser: str,
    tiny_model: Path,  # noqa: F811
    vllm_venv: Path,  # noqa: F811
    tokenizer,  # noqa: F811
    tmp_path: Path,
) -> None:
    t_test = time.monotonic()
    cases, whitespace_quirk = PARSER_SUITES[tool_parser]
    script: list[list[int]] = []
    for text, _ in cases.values():
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        script += [ids, ids]  # one non-streamed request, then one streamed, per case
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    mock_args = ("--script-file", str(script_file), "--step-interval", "0.002")
    flags = _parser_flags(tool_parser)
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)

    full: dict[str, dict[str, dict]] = {"vllm": {}, "pyfront": {}}
    streams: dict[str, dict[str, list]] = {"vllm": {}, "pyfront": {}}
    counts: dict[str, dict[str, object]] = {"vllm": {}, "pyfront": {}}
    errors: dict[str, dict[str, tuple[int, object]]] = {"vllm": {}, "pyfront": {}}
    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv, extra_args=flags
            )
        )
        vllm_mock = procs.add(_start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args))
        pyfront = procs.add(
            _start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log", *flags)
        )
        pyfront_mock = procs.add(_start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args))
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[vllm_mock])

        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            raw: dict[str, object] = {}
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                for name, (_, fields) in cases.items():
                    body = {
                        "model": model,
                        "max_tokens": 200,
                        "messages": [{"role": "user", "content": f"Case {name}."}],
                        "temperature": 0,
                        **fields,
                    }
                    r = client.post("/v1/messages", json=body)
                    assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.text}\n{server.log_tail()}"
                    raw[f"{name}/full"] = full[side][name] = r.json()
                    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
                        assert r.status_code == 200, f"{side} {name} (stream): HTTP {r.status_code} {r.read()!r}"
                        assert r.headers["content-type"].startswith("text/event-stream")
                        raw[f"{name}/stream"] = streams[side][name] = _events(r)
                for name, fields in COUNT_TOKENS_CASES.items():
                    r = client.post("/v1/messages/count_tokens", json={"model": model, **fields})
                    counts[side][name] = (r.status_code, r.json())
                for name, case in ERROR_CASES.items():
                    if isinstance(case, bytes):
                        r = client.post("/v1/messages", content=case, headers={"content-type": "application/json"})
                    else:
                        r = client.post("/v1/messages", json={"model": model, **case})
                    errors[side][name] = (r.status_code, r.json())
            raw["count_tokens"], raw["errors"] = counts[side], errors[side]
            (tmp_path / f"answers-{side}.json").write_text(json.dumps(raw, indent=1, ensure_ascii=False))
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))

    print(f"\nmessages comparison took {time.monotonic() - t_test:.1f} s; answers in {tmp_path}")
    vllm, ours = full["vllm"], full["pyfront"]
    for name in cases:
        # ids: vLLM's chat id, pyfront's msg_ id.
        assert vllm[name]["id"].startswith("chatcmpl-") and ours[name]["id"].startswith("msg_"), name
        # stop_sequence: vLLM drops a null one from its non-streamed body; pyfront sends it, as Anthropic does.
        expected = _full_comparable(vllm[name])
        expected.setdefault("stop_sequence", None)
        assert _full_comparable(ours[name]) == expected, name

        vllm_events, our_events = streams["vllm"][name], streams["pyfront"][name]
        assert [n for n, _ in vllm_events].count("ping") == 0
        assert [n for n, _ in our_events][:2] == ["message_start", "ping"] and [n for n, _ in our_events].count(
            "ping"
        ) == 1, name
        quirk = name in whitespace_quirk
        vllm_stream = _stream_comparable(vllm_events, drop_whitespace_text=quirk)
        our_stream = _stream_comparable(our_events)
        if quirk:
            assert len(_stream_comparable(vllm_events)) == len(vllm_stream) + 1, name  # the one whitespace block
        assert our_stream == vllm_stream, name
        # pyfront's stream says what its non-streamed answer says (vLLM's too, the quirk aside).
        folded = _folded_stream(our_stream)
        answer = _full_comparable(ours[name])
        for block in answer["content"]:
            block.pop("id", None)
        assert folded == {k: answer[k] for k in ("content", "stop_reason", "stop_sequence", "usage")}, name

    # The cases say what they test.
    if tool_parser == "qwen3_coder":
        for name in XML_CASES:
            assert ours[name]["stop_reason"] == "tool_use", name
        assert [b["name"] for b in ours["xml_two_calls_one_allowed"]["content"] if b["type"] == "tool_use"] == [
            "get_weather"
        ]
        assert [b["input"] for b in ours["xml_tool_choice_tool"]["content"] if b["type"] == "tool_use"] == [
            {"city": "Rome", "unit": "celsius"}
        ]
    else:
        _check_hermes_cases(ours)
    _check_counts_and_errors(counts, errors)


def _check_hermes_cases(ours: dict[str, dict]) -> None:
    assert ours["tool_use"]["stop_reason"] == "tool_use"
    assert [b["type"] for b in ours["two_tool_uses_tool_choice_auto"]["content"]] == [
        "thinking",
        "tool_use",
        "tool_use",
    ]
    assert ours["stop_sequence"]["stop_reason"] == "stop_sequence" and ours["stop_sequence"]["stop_sequence"] == "STOP"
    assert ours["max_tokens"]["stop_reason"] == "max_tokens"
    assert ours["thinking_disabled"]["content"] == [{"type": "text", "text": "Paris is the capital of France."}]
    assert ours["thinking_then_text"]["content"][0]["type"] == "thinking"
    assert ours["tool_result_round_trip"]["content"][-1]["text"].strip() == "It is 18 C and sunny in Paris."


def _check_counts_and_errors(
    counts: dict[str, dict[str, object]], errors: dict[str, dict[str, tuple[int, object]]]
) -> None:
    assert counts["pyfront"] == counts["vllm"]
    for name in ERROR_CASES:
        (vllm_status, _), (status, body) = errors["vllm"][name], errors["pyfront"][name]
        assert status == vllm_status, (name, errors["vllm"][name], errors["pyfront"][name])
        # vLLM: FastAPI's validation errors in its OpenAI shape, its own in Anthropic's envelope with OpenAI types.
        vllm_body = errors["vllm"][name][1]
        assert set(vllm_body) == {"error"} or vllm_body["error"]["type"] in ("BadRequestError", "NotFoundError"), name
        assert body["type"] == "error" and body["error"]["type"] == ANTHROPIC_ERROR_TYPES[status], (name, body)
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], (name, body)
