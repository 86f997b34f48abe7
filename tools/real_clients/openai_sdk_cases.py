"""The openai Python SDK against an OpenAI-compatible server: a fixed sequence of requests, results as JSON.

Runs under the clients venv's python (tools/real_clients/setup_venv.sh). Usage:

    python openai_sdk_cases.py BASE_URL MODEL OUT.json

The cases run in the order of CASES, one request each, so that a mock engine scripted with one output per
request (in arrival order: tests/tiers/test_real_clients.py's SCRIPTED) gives every case its output; the cases
after the scripted ones get the mock's own deterministic tokens. Each result keeps what a client reads
(text, tool calls, parsed objects, finish reasons, usage, logprobs) and nothing random (ids, timestamps).
A case that raises is recorded as {"error": TYPE, "message": ...} and the others still run: the test
reports every difference at once.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import openai
from pydantic import BaseModel

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

ECHO_PROMPT = "The quick brown fox jumps over the lazy dog"


class Weather(BaseModel):
    """The response format of the `parse` case (client.chat.completions.parse turns it into a JSON schema)."""

    city: str
    temperature_c: float
    conditions: list[str]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    return {k: getattr(usage, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _calls(tool_calls: Any) -> list[dict[str, Any]]:
    """Tool calls as (type, name, arguments as JSON); the ids are random on every server, only their presence counts."""
    out = []
    for call in tool_calls or []:
        out.append(
            {
                "type": call.type,
                "name": call.function.name,
                "arguments": json.loads(call.function.arguments),
                "has_id": bool(call.id),
            }
        )
    return out


def _completion_choice(choice: Any) -> dict[str, Any]:
    logprobs = choice.logprobs
    extra = choice.model_extra or {}
    return {
        "index": choice.index,
        "text": choice.text,
        "finish_reason": choice.finish_reason,
        "logprobs": None
        if logprobs is None
        else {
            "tokens": logprobs.tokens,
            "token_logprobs": logprobs.token_logprobs,
            "top_logprobs": logprobs.top_logprobs,
            "text_offset": logprobs.text_offset,
        },
        "prompt_logprobs": extra.get("prompt_logprobs"),
    }


def chat(client: openai.OpenAI, model: str) -> dict[str, Any]:
    r = client.chat.completions.create(
        model=model, messages=_user("What is the capital of France?"), temperature=0, max_tokens=64
    )
    message = r.choices[0].message
    return {
        "role": message.role,
        "content": message.content,
        "tool_calls": _calls(message.tool_calls),
        "finish_reason": r.choices[0].finish_reason,
        "usage": _usage(r.usage),
        "object": r.object,
    }


def chat_stream(client: openai.OpenAI, model: str) -> dict[str, Any]:
    stream = client.chat.completions.create(
        model=model,
        messages=_user("Tell me about streaming."),
        temperature=0,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, roles, finishes, usage, objects = "", [], [], None, set()
    for chunk in stream:
        objects.add(chunk.object)
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            content += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
        if chunk.usage is not None:
            assert not chunk.choices, "usage came on a chunk with choices"
            usage = _usage(chunk.usage)
    return {"content": content, "roles": roles, "finish_reasons": finishes, "usage": usage, "objects": sorted(objects)}


def tools(client: openai.OpenAI, model: str) -> dict[str, Any]:
    r = client.chat.completions.create(
        model=model,
        messages=_user("What is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        temperature=0,
    )
    message = r.choices[0].message
    return {
        "content": message.content,
        "tool_calls": _calls(message.tool_calls),
        "finish_reason": r.choices[0].finish_reason,
        "usage": _usage(r.usage),
    }


def tools_stream(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """The SDK's own stream helper: it accumulates the deltas (and rejects inconsistent ones) into a completion."""
    with client.chat.completions.stream(
        model=model,
        messages=_user("What is the weather in Berlin?"),
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        temperature=0,
    ) as stream:
        done_events = [e.name for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    return {
        "content": message.content or None,
        "tool_calls": _calls(message.tool_calls),
        "finish_reason": final.choices[0].finish_reason,
        "arguments_done_events": done_events,
    }


def parse(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """Structured output with a pydantic model, as documented for the SDK (`chat.completions.parse`)."""
    r = client.chat.completions.parse(
        model=model, messages=_user("The weather in Paris as JSON."), response_format=Weather, temperature=0
    )
    message = r.choices[0].message
    return {
        "parsed": None if message.parsed is None else message.parsed.model_dump(),
        "refusal": message.refusal,
        "finish_reason": r.choices[0].finish_reason,
        "usage": _usage(r.usage),
    }


def completions_echo_logprobs(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """What lm-eval's loglikelihood sends, with a text prompt: the prompt's logprobs come back with the answer's."""
    r = client.completions.create(model=model, prompt=ECHO_PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    return {"choices": [_completion_choice(c) for c in r.choices], "usage": _usage(r.usage)}


def completions_echo_max_tokens_0(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """echo with max_tokens 0: the prompt alone, scored, nothing generated."""
    r = client.completions.create(model=model, prompt=ECHO_PROMPT, echo=True, logprobs=1, max_tokens=0, temperature=0)
    return {"choices": [_completion_choice(c) for c in r.choices], "usage": _usage(r.usage)}


def completions_prompt_logprobs(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """vLLM's `prompt_logprobs` extension, sent as the SDK sends any extension (extra_body)."""
    r = client.completions.create(
        model=model, prompt=ECHO_PROMPT, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    return {"choices": [_completion_choice(c) for c in r.choices], "usage": _usage(r.usage)}


def completions_token_ids_batch_echo(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """Two token-id prompts in one request, echoed with logprobs: lm-eval's batched loglikelihood request."""
    prompts = [[785, 3974, 13876, 38835], [9707, 11, 1879, 0, 4710]]
    r = client.completions.create(model=model, prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0)
    return {"choices": [_completion_choice(c) for c in r.choices], "usage": _usage(r.usage)}


CASES: dict[str, Callable[[openai.OpenAI, str], dict[str, Any]]] = {
    # Scripted outputs (one request each, in this order).
    "chat": chat,
    "chat_stream": chat_stream,
    "tools": tools,
    "tools_stream": tools_stream,
    "parse": parse,
    # The mock's own tokens.
    "completions_echo_logprobs": completions_echo_logprobs,
    "completions_echo_max_tokens_0": completions_echo_max_tokens_0,
    "completions_prompt_logprobs": completions_prompt_logprobs,
    "completions_token_ids_batch_echo": completions_token_ids_batch_echo,
}


def main() -> None:
    base_url, model, out_path = sys.argv[1:4]
    client = openai.OpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="unused", max_retries=0, timeout=120)
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        try:
            results[name] = case(client, model)
        except Exception as exc:  # recorded: the test shows it next to the other server's answer
            results[name] = {
                "error": type(exc).__name__,
                "message": str(exc)[:2000],
                "traceback": traceback.format_exc(),
            }
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
