"""A finished request is freed by reference counting, on every route: it leaves no reference cycle behind.

Why it matters: an object in a cycle waits for CPython's garbage collector. Each request that left one (the HTTP
cycle through its scope's disconnect extension, a Generation through its choices, a detokenizer through its own
bound method) kept its prompt ids, text streams and engine stream alive until the next collection, and counted
towards triggering it: a busy server walked its live requests in collection after collection (~18 us a request at
the peers.py rps row), and a long chat's previous prompt was still held when the next turn arrived.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import MODEL, running_harness

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, "n": 2, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "tools": TOOLS}),
    (
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 4, "skip_special_tokens": False, "spaces_between_special_tokens": False},
    ),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": ["a b", "c d"], "n": 2, "max_tokens": 4, "logprobs": 1, "echo": True},
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 4, "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True}),
    ("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    (
        "/v1/messages",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
    ),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}),  # a 400
]


@pytest.fixture
def saved_garbage() -> Iterator[list[Any]]:
    """What the collector finds unreachable while the test runs (kept, not freed: gc.DEBUG_SAVEALL)."""
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _send_all(http: Any) -> None:
    for path, body in REQUESTS:
        response = http.post(path, json=body)
        assert response.status_code == (400 if not body.get("messages", True) else 200), (path, response.text)


def test_finished_requests_leave_no_reference_cycles(saved_garbage: list[Any]) -> None:
    parsers = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
    with running_harness(parsers, as_pyfront_serve=True) as harness, harness.http() as http:
        _send_all(http)  # first requests build what lives as long as the process (caches, compiled templates)
        gc.collect()
        del saved_garbage[:]
        for _ in range(3):
            _send_all(http)
        gc.collect()
        ours = sorted({type(o).__qualname__ for o in saved_garbage if type(o).__module__.startswith("pyfront.")})
    assert ours == [], f"request objects freed only by the garbage collector: {ours}"
