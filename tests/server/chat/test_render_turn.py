"""render_turn (the previous_response_id path, and long chats re-sent whole through the process's recent prompts):
a turn rendered after an earlier one tokenizes only the text after the shared prefix and hashes only the blocks after
the shared ids, and its ids and block hashes are exactly those of a full render, tokenize and hash.

Checked over random agent conversations on both bundled tokenizers (Qwen3 and Qwen3.6, whose templates drop the
reasoning of turns before the last user query, so a new user message rewrites earlier text): reasoning, parallel
tool calls, tool results, markers inside contents, long messages, a salt that changes, thinking switched off, the
hash config changing between turns (a renegotiation), and branches continued from an older turn.
"""

from __future__ import annotations

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest

from pyfront.hashing import PromptHasher, block_hashes, pack_block_hashes
from pyfront.server.chat.render import _template_args, message_dicts, render_turn
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    Tool,
    ToolCall,
)
from pyfront.server.text.prompts import RecentPrompts, TurnPrompt
from pyfront.server.text.tokenizer import Tokenizer
from tests.hashing.test_hashing import config

TOKENIZERS = ("pyfront/qwen3-tokenizer", "pyfront/qwen3.6-tokenizer")
MARKERS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_response>", "<|im_", " \n"]
WORDS = [
    "the",
    "agent",
    "reads",
    "files",
    "runs",
    "tests",
    "and",
    "edits",
    "code",
    "until",
    "every",
    "check",
    "passes",
    "again",
]
TOOLS = [
    Tool(function=FunctionDefinition(name="read_file", description="Read a file",
                                     parameters={"type": "object", "properties": {"path": {"type": "string"}}})),
    Tool(function=FunctionDefinition(name="run", description="Run a command", parameters={"type": "object"})),
]  # fmt: skip


@cache
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer(name)


def _text(rng: random.Random) -> str:
    size = rng.choice([0, 1, 3, 8, 20, 400]) if rng.random() < 0.97 else 3000
    words = [rng.choice(WORDS) for _ in range(size)]
    for _ in range(rng.randint(0, 2)):
        words.insert(rng.randint(0, len(words)), rng.choice([*MARKERS, "日本語", "é", "\n\n", "  ", "👍🏽"]))
    return " ".join(words)


def _turn_input(rng: random.Random, pending_calls: list[str]) -> list[ChatMessage]:
    """What a turn adds: the results of the previous turn's calls, or a user message (often both)."""
    added = [ChatMessage(role="tool", content=_text(rng), tool_call_id=call) for call in pending_calls]
    if not added or rng.random() < 0.3:
        added.append(ChatMessage(role="user", content=_text(rng) or "go"))
    return added


def _assistant(rng: random.Random, turn: int) -> tuple[ChatMessage, list[str]]:
    """A reply: reasoning, maybe text, maybe parallel tool calls (their ids come back as tool results)."""
    calls = []
    for i in range(rng.choice([0, 0, 1, 1, 2, 3])):
        args = json.dumps({"path": f"src/{rng.choice(WORDS)}.py", "n": rng.randint(0, 9)})
        calls.append(ToolCall(id=f"call_{turn}_{i}", function=FunctionCall(name=rng.choice(["read_file", "run"]),
                                                                           arguments=args)))  # fmt: skip
    message = ChatMessage(
        role="assistant",
        content=_text(rng) if not calls or rng.random() < 0.3 else None,
        reasoning=_text(rng) if rng.random() < 0.8 else None,
        tool_calls=calls or None,
    )
    return message, [call.id for call in calls]


def _request(messages: list[ChatMessage], salt: str | None, thinking: bool) -> ChatCompletionRequest:
    kwargs = None if thinking else {"enable_thinking": False}
    return ChatCompletionRequest(messages=[m for m in messages], model="m", tools=TOOLS, cache_salt=salt,
                                 chat_template_kwargs=kwargs)  # fmt: skip


def _state(tok: Tokenizer, hasher: PromptHasher | None, pool: ThreadPoolExecutor) -> Any:
    engine = SimpleNamespace(hasher=hasher) if hasher is not None else None
    return SimpleNamespace(
        tokenizer=tok,
        engine=engine,
        allow_request_chat_template=False,
        render_pool=pool,
        recent_prompts=RecentPrompts(),
    )


def _full(
    tok: Tokenizer, request: ChatCompletionRequest, block_size: int | None
) -> tuple[str, list[int], bytes | None]:
    """transformers' own render and encode, and the recipe's block hashes: no pyfront fast path involved."""
    from pyfront.server.chat.render import _template_args, message_dicts

    text = tok.hf.apply_chat_template(message_dicts(request), tokenize=False, **{
        k: v for k, v in _template_args(request).items() if k != "chat_template_kwargs"
    }, **(request.chat_template_kwargs or {}))  # fmt: skip
    ids = tok.hf.encode(text, add_special_tokens=False)
    if block_size is None:
        return text, ids, None
    return text, ids, pack_block_hashes(block_hashes(ids, config(block_size), request.cache_salt), block_size)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("seed", range(6))
def test_each_turn_equals_a_full_render_tokenize_and_hash(name: str, seed: int) -> None:
    rng = random.Random(seed)
    tok = tokenizer(name)
    block_size = rng.choice([4, 16, 128])
    hasher: PromptHasher | None = PromptHasher(config(block_size))
    salt = rng.choice([None, "tenant-a"])
    thinking = True
    messages = [ChatMessage(role="system", content="You are a coding agent.")]
    pending: list[str] = []
    stored: list[tuple[list[ChatMessage], TurnPrompt, list[str]]] = []
    previous: TurnPrompt | None = None
    reused = 0
    with ThreadPoolExecutor(1) as pool:
        for turn in range(14):
            if stored and rng.random() < 0.15:  # a branch: continue an older turn instead of the newest
                base, previous, pending = rng.choice(stored)
                messages = list(base)
            if rng.random() < 0.1:
                salt = rng.choice([None, "tenant-a", "tenant-b"])
            if rng.random() < 0.1:
                thinking = not thinking
            if rng.random() < 0.1:  # the engines renegotiated: another block size, or FEH off
                block_size = rng.choice([4, 16, 128])
                hasher = PromptHasher(config(block_size)) if rng.random() < 0.8 else None
            messages = [*messages, *_turn_input(rng, pending)]
            request = _request(messages, salt, thinking)
            prompt = asyncio.run(render_turn(_state(tok, hasher, pool), request, previous))
            expected_text, expected_ids, expected_blob = _full(
                tok, request, hasher.config.block_size if hasher else None
            )
            assert prompt.tokens.text == expected_text, turn
            assert prompt.tokens.ids == expected_ids, turn
            assert prompt.blob == expected_blob, turn
            reused += prompt.tokens.shared
            assistant, pending = _assistant(rng, turn)
            messages = [*messages, assistant]
            stored.append((messages, prompt, pending))
            previous = prompt
    assert reused > 0  # the path under test was taken


def test_a_continued_turn_encodes_only_its_tail() -> None:
    """The segment tokenizer sees only the text after the shared prefix: its counters say so."""
    tok = tokenizer(TOKENIZERS[0])
    history = [ChatMessage(role="user", content=" ".join(WORDS * 200))]
    with ThreadPoolExecutor(1) as pool:
        state = _state(tok, PromptHasher(config(16)), pool)
        first = asyncio.run(render_turn(state, _request(history, None, True), None))
        history += [ChatMessage(role="assistant", content="ok"), ChatMessage(role="user", content="more")]
        before = tok.segments.stats
        second = asyncio.run(render_turn(state, _request(history, None, True), first))
        after = tok.segments.stats
    assert second.tokens.shared >= len(first.tokens.ids) - 8  # all but the generation prompt's few ids
    assert after.reused_prefix_tokens - before.reused_prefix_tokens == second.tokens.shared
    assert after.segments - before.segments <= 8  # the tail's pieces, not the history's
    assert second.blob is not None and second.blob.startswith(first.blob[: 4 + 4 + 32 * (second.tokens.shared // 16)])


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("seed", range(4))
def test_conversations_re_sent_whole_start_from_their_recent_prompt(name: str, seed: int) -> None:
    """Several conversations interleaved, each re-sent whole every turn (chat completions), all opening with the same
    long system prompt: every turn equals a full render, tokenize and hash; each continues from its own previous
    turn, found among the recent prompts."""
    rng = random.Random(100 + seed)
    tok = tokenizer(name)
    hasher = PromptHasher(config(16))
    system = ChatMessage(role="system", content=" ".join(rng.choice(WORDS) for _ in range(1500)))
    conversations: list[tuple[list[ChatMessage], list[str], TurnPrompt | None]] = [([system], [], None)] * 4
    continued = 0
    with ThreadPoolExecutor(1) as pool:
        state = _state(tok, hasher, pool)
        for step in range(24):
            index = rng.randrange(len(conversations))
            messages, pending, last = conversations[index]
            messages = [*messages, *_turn_input(rng, pending)]
            request = _request(messages, None, True)
            if last is not None:  # the recent prompt it starts from is this conversation's own previous one
                text = tok.render_chat(message_dicts(request), **_template_args(request))
                assert state.recent_prompts.closest(text)[0] is last, step
            prompt = asyncio.run(render_turn(state, request, None))
            expected_text, expected_ids, expected_blob = _full(tok, request, 16)
            assert (prompt.tokens.text, prompt.tokens.ids, prompt.blob) == (
                expected_text,
                expected_ids,
                expected_blob,
            ), step
            if last is not None:
                assert prompt.tokens.shared > len(system.content) // 8, step  # the system prompt at least
                continued += 1
            assistant, pending = _assistant(rng, step)
            conversations[index] = ([*messages, assistant], pending, prompt)
    assert continued > 10


def test_recent_prompts_are_bounded_and_replaced_only_by_their_continuation() -> None:
    tok = tokenizer(TOKENIZERS[0])

    def turn(text: str) -> TurnPrompt:
        return TurnPrompt(tok.tokenize_prompt(text, None), None, None, None)

    recent = RecentPrompts()
    assert recent.closest("anything") == (None, False)
    a = turn("system prompt. conversation A, turn 1")
    recent.add(a, None)
    b_text = "system prompt. conversation B, turn 1"
    before, continues = recent.closest(b_text)
    assert before is a and not continues  # shares only the system prompt: kept beside it
    b = turn(b_text)
    recent.add(b, before if continues else None)
    a2_text = a.tokens.text + " and turn 2"
    before, continues = recent.closest(a2_text)
    assert before is a and continues
    recent.add(turn(a2_text), before)
    assert len(recent) == 2
    for i in range(RecentPrompts.MAX_PROMPTS + 3):
        recent.add(turn(f"conversation {i}"), None)
    assert len(recent) == RecentPrompts.MAX_PROMPTS
    big = turn("x" * 1000)
    original = RecentPrompts.MAX_BYTES
    try:
        RecentPrompts.MAX_BYTES = big.nbytes * 3
        for _ in range(5):
            recent.add(turn("x" * 1000), None)
        assert sum(kept.nbytes for kept in recent._turns) <= RecentPrompts.MAX_BYTES
    finally:
        RecentPrompts.MAX_BYTES = original
