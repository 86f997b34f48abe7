"""A streamed Message's SSE events, one engine output at a time, in vLLM 0.32's order.

``message_start`` (and Anthropic's ``ping``) with the first output; then content blocks, each
``content_block_start``, its deltas, ``content_block_stop``: a ``thinking`` block (``thinking_delta``s, then
one ``signature_delta``), ``text`` blocks (``text_delta``), ``tool_use`` blocks (``input_json_delta``). Text
the parser lets through while a tool_use block is open is held and sent as a text block after it, as vLLM
does (vllm/entrypoints/anthropic/serving.py, ``message_stream_converter``). At the end ``message_delta``
(stop_reason, stop_sequence, usage) and ``message_stop``. The text goes through the chat route's parsers
(`api.chat.convert.split_delta`); a text or thinking delta is one template fill.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pyfront.engine_client.protocol import EngineCoreOutput
from pyfront.server.api.chat.convert import split_delta, tool_finish_reason
from pyfront.server.api.messages.convert import anthropic_stop_reason, anthropic_usage, thinking_signature
from pyfront.server.api.sse import DELTA_MARKER, ContentTemplate
from pyfront.server.chat.parsers.tool_calls import ToolCallDelta
from pyfront.server.errors import anthropic_sse_error_frame
from pyfront.server.generate.generation import Choice, Generation

_encode = msgspec.json.encode

PING_EVENT = b'event: ping\ndata: {"type":"ping"}\n\n'
"""Anthropic sends one right after message_start (vLLM sends none)."""


def event(name: str, body: dict[str, Any]) -> bytes:
    """One SSE event: Anthropic names each (`event:`) with its body's type."""
    return b"event: " + name.encode() + b"\ndata: " + _encode(body) + b"\n\n"


def _delta_template(index: int, kind: str, key: str) -> ContentTemplate:
    template = ContentTemplate(
        {"type": "content_block_delta", "index": index, "delta": {"type": kind, key: DELTA_MARKER}}
    )
    template.prefix = b"event: content_block_delta\n" + template.prefix
    return template


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class MessagesFrames:
    """Renders a streamed Message (one choice) as Anthropic's events; tracks the open content block."""

    __slots__ = ("finish_reason", "generation", "head", "next_index", "open_index", "open_type", "pending",
                 "signature", "started", "stop_sequence", "template", "tool_args", "tool_id", "tool_ids",
                 "tool_used")  # fmt: skip

    def __init__(self, generation: Generation, message_id: str, model: str) -> None:
        self.generation = generation
        self.head: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant", "content": [],
                                     "model": model, "stop_reason": None, "stop_sequence": None}  # fmt: skip
        self.started = False
        self.next_index = 0
        self.open_type: str | None = None
        self.open_index = 0
        self.template: ContentTemplate | None = None
        self.signature: str | None = None
        """The open thinking block's signature, sent as its last delta."""
        self.tool_id: str | None = None
        self.tool_ids: dict[int, str] = {}
        self.tool_args: list[str] = []
        """The latest tool_use block's argument fragments: a call cut short is not "complete"."""
        self.tool_used = False
        self.pending: list[str] = []
        """Text that came while a tool_use block was open: a text block of its own once that block closes."""
        self.finish_reason: str | None = None
        self.stop_sequence: int | str | None = None

    def _start(self) -> bytes:
        self.started = True
        usage = {"input_tokens": len(self.generation.prompt_ids), "output_tokens": 0}
        return event("message_start", {"type": "message_start", "message": {**self.head, "usage": usage}}) + PING_EVENT

    def _open(self, block: dict[str, Any]) -> bytes:
        index = self.open_index = self.next_index
        self.open_type = block["type"]
        self.tool_id = block.get("id")
        if self.open_type == "thinking":
            self.signature = thinking_signature()
            self.template = _delta_template(index, "thinking_delta", "thinking")
        elif self.open_type == "text":
            self.template = _delta_template(index, "text_delta", "text")
        return event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})

    def _close(self) -> bytes:
        if self.open_type is None:
            return b""
        out = b""
        if self.signature is not None:
            delta = {"type": "signature_delta", "signature": self.signature}
            out = event(
                "content_block_delta", {"type": "content_block_delta", "index": self.open_index, "delta": delta}
            )
        out += event("content_block_stop", {"type": "content_block_stop", "index": self.open_index})
        self.open_type = self.template = self.signature = self.tool_id = None
        self.next_index += 1
        return out

    def _close_and_flush(self) -> bytes:
        """Close the open block; then the held text, as a text block of its own."""
        held = "".join(self.pending)
        self.pending.clear()
        out = self._close()
        if held:
            out += self._open({"type": "text", "text": ""})
            assert self.template is not None
            out += self.template.render(held) + self._close()
        return out

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        if self.open_type != kind:
            block = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
            out = self._close_and_flush() + self._open(block)
        assert self.template is not None
        return out + self.template.render(text)

    def _arguments(self, text: str) -> bytes:
        self.tool_args.append(text)
        delta = {"type": "input_json_delta", "partial_json": text}
        return event("content_block_delta", {"type": "content_block_delta", "index": self.open_index, "delta": delta})

    def output(self, choice: Choice, output: EngineCoreOutput) -> bytes:
        """The events (possibly none) for one engine output."""
        parts = [] if self.started else [self._start()]
        generation = self.generation
        text = generation.on_output(choice, output)
        final = choice.finish_reason is not None
        calls: list[ToolCallDelta] = []
        if choice.parsed is None:
            reasoning, content = "", text
        else:
            reasoning, content, calls = split_delta(choice, generation.plan, text, final)
        if final:
            self.finish_reason = choice.finish_reason
            if generation.plan is not None and choice.parsed is not None:
                self.finish_reason = tool_finish_reason(
                    generation.plan, choice.finish_reason, bool(choice.parsed.calls)
                )
            self.stop_sequence = choice.stop_reason
        if reasoning:
            parts.append(self._text("thinking", reasoning))
        if content:
            if self.open_type == "tool_use":
                self.pending.append(content)
            else:
                parts.append(self._text("text", content))
        for call in calls:
            if call.id is not None:
                self.tool_ids[call.index] = call.id
                if self.tool_id != call.id and call.name is not None:
                    parts.append(self._close_and_flush())
                    self.tool_used = True
                    self.tool_args = []
                    parts.append(self._open({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
                if call.arguments and self.tool_id == call.id:
                    parts.append(self._arguments(call.arguments))
            elif call.arguments and self.tool_id is not None and self.tool_ids.get(call.index) == self.tool_id:
                parts.append(self._arguments(call.arguments))
        return b"".join(parts)

    def closing(self) -> bytes:
        """The open block's end, message_delta (stop_reason, stop_sequence, usage) and message_stop."""
        out = (b"" if self.started else self._start()) + self._close_and_flush()
        stop_reason, stop_sequence = anthropic_stop_reason(
            self.finish_reason or "stop",
            self.stop_sequence,
            tool_used=self.tool_used,
            tool_complete=self.tool_used and _is_json("".join(self.tool_args)),
        )
        usage = anthropic_usage(self.generation.usage(streamed=True))
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out += event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        return out + event("message_stop", {"type": "message_stop"})

    def error(self, status: int, message: str) -> bytes:
        """Anthropic's error event; the stream ends with it."""
        return anthropic_sse_error_frame(status, message)
