"""The inline render bound (chat.render.INLINE_RENDER_MAX_BYTES): small bodies are rendered, tokenized and hashed
on the event loop, larger ones and requests with their own template on the render pool, with the same result.

The pool here refuses work while a test says it must not be used, so the test sees which path ran.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest

from pyfront.hashing import PromptHasher
from pyfront.server.api.completions.convert import tokenize_completion_prompts
from pyfront.server.chat.render import INLINE_RENDER_MAX_BYTES, render_chat, renders_inline
from pyfront.server.openai.decode import decode_chat_request, decode_completion_request
from pyfront.server.text.tokenizer import Tokenizer
from tests.hashing.test_hashing import config


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer("pyfront/qwen3-tokenizer")


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def _state(pool: ThreadPoolExecutor, template_ok: bool = False) -> Any:
    hasher = PromptHasher(config(block_size=4))
    return SimpleNamespace(
        tokenizer=tokenizer(),
        engine=SimpleNamespace(hasher=hasher),
        allow_request_chat_template=template_ok,
        render_pool=pool,
    )


def _chat_body(content: str, **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], **extra}).encode()


def _sized(size: int, **extra: Any) -> bytes:
    """A chat body of exactly `size` bytes."""
    base = len(_chat_body("", **extra))
    raw = _chat_body("x" * (size - base), **extra)
    assert len(raw) == size
    return raw


@pytest.mark.parametrize(
    ("size", "inline"),
    [(100, True), (INLINE_RENDER_MAX_BYTES, True), (INLINE_RENDER_MAX_BYTES + 1, False), (4000, False)],
)
def test_the_bound_decides_where_a_chat_renders(size: int, inline: bool) -> None:
    raw = _sized(size)
    request = decode_chat_request(raw)
    assert renders_inline(request, len(raw)) is inline
    pool = CountingPool()
    text, ids, blob = asyncio.run(render_chat(_state(pool), request, hash_prompt=True, body_bytes=len(raw)))
    assert pool.submitted == (0 if inline else 1)
    # The same prompt, ids and block hashes whichever path ran.
    other = CountingPool()
    ref = asyncio.run(render_chat(_state(other), request, hash_prompt=True, body_bytes=None))
    assert other.submitted == 1
    assert (text, ids, blob) == ref
    assert blob is not None and len(ids) >= 4


def test_unknown_size_and_request_templates_go_to_the_pool() -> None:
    raw = _chat_body("hi", chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    request = decode_chat_request(raw, allow_request_chat_template=True)
    assert len(raw) <= INLINE_RENDER_MAX_BYTES
    assert not renders_inline(request, len(raw))
    pool = CountingPool()
    text, _, _ = asyncio.run(render_chat(_state(pool, template_ok=True), request, body_bytes=len(raw)))
    assert pool.submitted == 1 and text == "hi"
    small = decode_chat_request(_chat_body("hi"))
    assert not renders_inline(small, None)


def test_inline_render_errors_are_the_same_400() -> None:
    from pyfront.server.errors import APIError
    from pyfront.server.text.tokenizer import TokenizerError

    class Failing:
        def tokenize_chat(self, messages: Any, **kwargs: Any) -> Any:
            raise TokenizerError("the template refused these messages")

    raw = _chat_body("hi")
    request = decode_chat_request(raw)
    for body_bytes in (len(raw), None):
        state = _state(CountingPool())
        state.tokenizer = Failing()
        with pytest.raises(APIError) as info:
            asyncio.run(render_chat(state, request, body_bytes=body_bytes))
        assert info.value.status == 400 and "refused" in info.value.message


@pytest.mark.parametrize("size", [200, INLINE_RENDER_MAX_BYTES + 50])
def test_completion_prompts_follow_the_same_bound(size: int) -> None:
    base = len(json.dumps({"model": "m", "prompt": ""}).encode())
    raw = json.dumps({"model": "m", "prompt": "word " * ((size - base) // 5)}).encode()
    request = decode_completion_request(raw)
    pool = CountingPool()
    state = SimpleNamespace(tokenizer=tokenizer(), render_pool=pool)
    got = asyncio.run(tokenize_completion_prompts(state, request, len(raw)))  # type: ignore[arg-type]
    assert pool.submitted == (0 if len(raw) <= INLINE_RENDER_MAX_BYTES else 1)
    assert got == [(None, tokenizer().encode(request.prompt, add_special_tokens=True))]
