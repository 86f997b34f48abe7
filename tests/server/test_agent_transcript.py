"""A 20-turn agent transcript through the openai client: what an agent loop does to pyfront, turn by turn.

The agent sends its whole history every turn (system prompt, user messages, its own earlier tool calls with
their reasoning, tool results), as agent SDKs do; the mock engine writes each assistant turn token by token
(reasoning, then tool calls in the model's own format, or an answer). Every turn checks the three things that
make a long agentic chat cheap and right:

* the prompt the engine received is ``apply_chat_template`` of the conversation as vLLM hands it to the
  template (tool-call arguments parsed into objects), tokenized in one piece: the fast chat render and the
  segment-memoized tokenization change nothing, and the segment cache did serve most of the prompt;
* the answer's reasoning, content and tool calls (names, JSON arguments) are the scripted ones;
* the prompt's block hashes are the recipe's (the mock recomputes them), the leading blocks shared with the
  previous turn's prompt have the previous turn's hashes, and the hash memo resumed from the previous turn
  instead of hashing the history again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pyfront.hashing import block_hashes, unpack_block_hashes
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, QWEN36_TOKENIZER_NAME
from tests.conftest import transformers_tokenizer
from tests.harness import MODEL, Harness, running_harness

TURNS = 20

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Search the repository for text.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer"},
                    "regex": {"type": "boolean"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "lines": {"type": "array", "items": {"type": "integer"}}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "options": {"type": "object"},
                },
                "required": ["path", "content"],
            },
        },
    },
]


def hermes_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(
        "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"
        for name, args in calls
    )


def xml_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Qwen3.5 / Qwen3.6 XML calls: strings verbatim, other values as JSON (what the chat template renders)."""

    def value(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    return "\n".join(
        "<tool_call>\n<function=" + name + ">\n"
        + "".join(f"<parameter={key}>\n{value(v)}\n</parameter>\n" for key, v in args.items())
        + "</function>\n</tool_call>"
        for name, args in calls
    )  # fmt: skip


@dataclass(frozen=True)
class Format:
    """A model family: its tokenizer, its tool-call parser and how its model writes a turn."""

    tokenizer: str
    tool_parser: str
    opens_think_in_prompt: bool
    """The template's generation prompt ends with ``<think>\\n`` (Qwen3.5/3.6), so the model starts inside it."""

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return xml_calls(calls) if self.tool_parser == "qwen3_coder" else hermes_calls(calls)

    def assistant_text(self, reasoning: str, calls: list[tuple[str, dict[str, Any]]], answer: str | None) -> str:
        body = self.write_calls(calls) if calls else (answer or "")
        head = "" if self.opens_think_in_prompt else "<think>\n"
        return f"{head}{reasoning}\n</think>\n\n{body}"


FORMATS = {
    "qwen3-hermes": Format(BUNDLED_TOKENIZER_NAME, "hermes", opens_think_in_prompt=False),
    "qwen3.6-xml": Format(QWEN36_TOKENIZER_NAME, "qwen3_coder", opens_think_in_prompt=True),
}


@dataclass
class Turn:
    user: str | None
    reasoning: str
    calls: list[tuple[str, dict[str, Any]]]
    answer: str | None = None


def agent_turns() -> Iterator[Turn]:
    """Twenty assistant turns: mostly tool calls (one or two per turn), with answers and new user asks between."""
    values = [
        "Paris",
        "line one\nline two\n",
        "a < b && c > d </parameter",
        "naïve café 東京 🎉",
        '{"looks": "like json"}',
        "tag-like <b>text</b> &amp; <function=x>",
    ]
    for i in range(TURNS):
        if i % 5 == 4:
            yield Turn(None, f"Turn {i}: I have what I need.", [], answer=f"Summary {i}: done with step {i // 5}.")
            continue
        user = f"Step {i}: look for item {i} and fix it." if i % 5 == 0 else None
        calls: list[tuple[str, dict[str, Any]]] = [
            ("search_files", {"query": values[i % len(values)], "max_results": i + 1, "regex": i % 2 == 0})
        ]
        if i % 3 == 1:
            calls.append(("read_file", {"path": f"src/module_{i}.py", "lines": [i, i + 10]}))
        if i % 4 == 2:
            calls = [("write_file", {"path": f"out/{i}.txt", "content": values[(i + 1) % len(values)],
                                     "options": {"mode": "w", "depth": {"level": i}}})]  # fmt: skip
        yield Turn(user, f"Turn {i}: thinking about step {i} of the plan.", calls)


def tool_result(name: str, args: dict[str, Any], turn: int) -> str:
    return f"result of {name} at turn {turn}: " + ("ok " * (20 + turn)) + json.dumps(args, ensure_ascii=False)


def as_template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM 0.32 hands it to the chat template: assistant tool-call arguments parsed into objects."""
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
            for call in out["tool_calls"]
        ]
    return out


def run_transcript(harness: Harness, fmt: Format) -> None:
    serving = harness.app.state.serving  # type: ignore[attr-defined]
    tokenizer = serving.tokenizer
    hf = tokenizer.hf
    rank = harness.mock.ranks[0]
    hash_config = rank.hash_config
    memo = serving.engine.hasher.memo
    client = harness.client()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    previous: tuple[list[int], list[bytes]] | None = None
    for number, turn in enumerate(agent_turns()):
        if turn.user is not None or number == 0:
            messages.append({"role": "user", "content": turn.user or "Start."})
        text = fmt.assistant_text(turn.reasoning, turn.calls, turn.answer)
        ids = hf.encode(text, add_special_tokens=False)
        assert hf.decode(ids) == text
        harness.mock.script(ids)  # the mock ends a script with EOS (finish "stop")
        memo_before = memo.stats
        segments_before = tokenizer.segments.stats
        response = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            max_tokens=len(ids) + 8,
            temperature=0,  # type: ignore[arg-type]
        )
        choice = response.choices[0]
        message = choice.message
        sent = rank.recent[-1]

        # The prompt: the template's rendering of this conversation, tokenized whole.
        expected_text = transformers_tokenizer(tokenizer.name).apply_chat_template(
            [as_template_message(m) for m in messages], tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        expected_ids = hf.encode(expected_text, add_special_tokens=False)
        assert list(sent.prompt_token_ids) == expected_ids, f"turn {number}: prompt differs from apply_chat_template"
        assert response.usage is not None and response.usage.prompt_tokens == len(expected_ids)
        segments = tokenizer.segments.stats
        if number > 0:
            served = segments.tokens_from_cache - segments_before.tokens_from_cache
            encoded = segments.tokens_encoded - segments_before.tokens_encoded
            assert served > encoded, f"turn {number}: the segment cache served {served} tokens, encoded {encoded}"

        # The answer: exactly what the model wrote, split by the parsers.
        reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
        assert reasoning == (f"{turn.reasoning}\n" if fmt.opens_think_in_prompt else f"\n{turn.reasoning}\n")
        got_calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        assert got_calls == turn.calls, f"turn {number}"
        if turn.calls:
            assert choice.finish_reason == "tool_calls" and not (message.content or "").strip()
        else:
            assert choice.finish_reason == "stop" and message.content == f"\n\n{turn.answer}"

        # The block hashes: the recipe's, the shared prefix's equal to the last turn's, the memo resumed.
        prompt = list(sent.prompt_token_ids)
        hashes = unpack_block_hashes(sent.prompt_block_hashes, hash_config.block_size, len(prompt))
        assert hashes == block_hashes(prompt, hash_config, None)
        if previous is not None:
            prev_prompt, prev_hashes = previous
            common = next((i for i, (a, b) in enumerate(zip(prev_prompt, prompt, strict=False)) if a != b),
                          min(len(prev_prompt), len(prompt)))  # fmt: skip
            shared_blocks = common // hash_config.block_size
            assert shared_blocks > 0 and hashes[:shared_blocks] == prev_hashes[:shared_blocks]
            stats = memo.stats
            assert stats.hits == memo_before.hits + 1, f"turn {number}: the memo did not reuse the last turn"
            hashed = stats.blocks_hashed - memo_before.blocks_hashed
            assert hashed < len(hashes) - shared_blocks // 2, f"turn {number}: hashed {hashed} of {len(hashes)}"
        previous = (prompt, hashes)

        # The agent's next message(s): its own turn as the SDK returned it, then the tool results.
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if number % 2 == 0 and reasoning:
            assistant["reasoning_content"] = reasoning  # some agents send the reasoning back, some do not
        if message.tool_calls:
            assistant["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in message.tool_calls
            ]
        messages.append(assistant)
        for call in message.tool_calls or []:
            args = json.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": tool_result(call.function.name, args, number)}
            )
    totals = harness.mock_totals()
    assert totals["hashes_used"] == TURNS and totals["hashes_mismatched"] == 0
    assert len(messages) > 40


@pytest.mark.parametrize("name", list(FORMATS))
def test_agent_transcript(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_NATIVE_FEH", "1")
    fmt = FORMATS[name]
    overrides = {
        "model": fmt.tokenizer,
        "tool_call_parser": fmt.tool_parser,
        "enable_auto_tool_choice": True,
        "reasoning_parser": "qwen3",
        "max_model_len": 32768,
    }
    with running_harness(overrides, max_model_len=32768, output_len=None) as harness:
        run_transcript(harness, fmt)
