"""Long chats re-sent whole over HTTP (server/chat/render.py's REUSE_MIN_BYTES, server/text/prompts.py): bodies past
the large-body bound are decoded on the render pool, each turn is tokenized and hashed only after the prefix it
shares with the previous one, and the engine receives exactly transformers' ids of the rendered prompt and the
recipe's block hashes; a second conversation is not confused with the first."""

from __future__ import annotations

import random

import pytest

from pyfront.hashing import block_hashes, unpack_block_hashes
from pyfront.server.api.request import LARGE_BODY_BYTES
from pyfront.server.chat.render import REUSE_MIN_BYTES
from tests.conftest import transformers_tokenizer
from tests.harness import MODEL, running_harness

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


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def test_long_conversations_reuse_their_previous_turn_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_NATIVE_FEH", "1")  # block hashes shipped (the mock advertises them)
    rng = random.Random(7)
    with running_harness({"max_request_body_bytes": 4 * 1024 * 1024}, max_model_len=262144) as harness:
        serving = harness.app.state.serving  # type: ignore[attr-defined]
        tokenizer = serving.tokenizer
        reference = transformers_tokenizer(tokenizer.name)
        rank = harness.mock.ranks[0]
        client = harness.client()
        system = {"role": "system", "content": _prose(rng, 50_000)}  # ~300 KB: past both bounds from turn one
        conversations = [[system], [system]]
        for turn in range(6):
            messages = conversations[turn % 2]
            messages.append({"role": "user", "content": _prose(rng, rng.randint(5, 400))})
            before = tokenizer.segments.stats.reused_prefix_tokens
            response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
            sent = rank.recent[-1]
            expected_text = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            assert len(expected_text) > max(LARGE_BODY_BYTES, REUSE_MIN_BYTES)
            expected = reference.encode(expected_text, add_special_tokens=False)
            prompt = list(sent.prompt_token_ids)
            assert prompt == expected, turn
            assert response.usage is not None and response.usage.prompt_tokens == len(expected)
            hash_config = rank.hash_config
            assert unpack_block_hashes(sent.prompt_block_hashes, hash_config.block_size, len(prompt)) == block_hashes(
                prompt, hash_config, None
            )
            reused = tokenizer.segments.stats.reused_prefix_tokens - before
            # turn 0: nothing kept yet; turn 1: the other conversation's system prompt; later: this one's history
            assert reused == 0 if turn == 0 else reused > 50_000, (turn, reused)
            messages.append({"role": "assistant", "content": response.choices[0].message.content or ""})
        assert len(serving.recent_prompts) == 2
