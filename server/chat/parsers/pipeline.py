"""Reasoning and tool-call parsing together, as vLLM composes them.

The reasoning parser runs first, on the whole output; the tool-call parser runs on its
content only (a reasoning parser whose format ends the reasoning at a tool call, as ``qwen3``
does at ``<tool_call>``, hands the call over as content). Either parser may be absent. :meth:`OutputParser.parse`
and :meth:`OutputParser.stream` agree for every chunking of the output, as each parser does on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyfront.server.chat.parsers.reasoning import ReasoningParser, ReasoningStream
from pyfront.server.chat.parsers.tool_calls import ToolCall, ToolCallDelta, ToolCallParser, ToolCallStream

__all__ = ["OutputDelta", "OutputParser", "OutputStream", "ParsedOutput"]


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole output: each part None when empty."""

    reasoning: str | None
    content: str | None
    calls: list[ToolCall]


@dataclass(slots=True)
class OutputDelta:
    """One step of a stream: ``""`` / ``[]`` for nothing."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class OutputStream:
    def __init__(self, reasoning: ReasoningStream | None, tools: ToolCallStream | None) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._reasoning_parts: list[str] = []
        self._content_parts: list[str] = []

    def _step(self, reasoning: str, content: str, final: bool) -> OutputDelta:
        tool_deltas: list[ToolCallDelta] = []
        if self._tools is not None:
            step = self._tools.feed(content) if content else None
            content = step.content if step is not None else ""
            if step is not None:
                tool_deltas.extend(step.tool_calls)
            if final:
                end = self._tools.finish()
                content += end.content
                tool_deltas.extend(end.tool_calls)
        if reasoning:
            self._reasoning_parts.append(reasoning)
        if content:
            self._content_parts.append(content)
        return OutputDelta(reasoning, content, tool_deltas)

    def feed(self, text: str) -> OutputDelta:
        if self._reasoning is None:
            return self._step("", text, final=False)
        reasoning, content = self._reasoning.feed(text)
        return self._step(reasoning, content, final=False)

    def finish(self) -> OutputDelta:
        if self._reasoning is None:
            return self._step("", "", final=True)
        reasoning, content = self._reasoning.finish()
        return self._step(reasoning, content, final=True)

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning is not None and self._reasoning.in_reasoning

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools is not None else []

    def result(self) -> ParsedOutput:
        """The whole parse, after :meth:`finish`."""
        return ParsedOutput(
            reasoning="".join(self._reasoning_parts) or None,
            content="".join(self._content_parts) or None,
            calls=self.calls,
        )


class OutputParser:
    """A reasoning parser and/or a tool-call parser, applied in that order."""

    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolCallParser | None = None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    def stream(self) -> OutputStream:
        return OutputStream(
            self.reasoning.stream() if self.reasoning is not None else None,
            self.tools.stream() if self.tools is not None else None,
        )

    def parse(self, text: str) -> ParsedOutput:
        """Parse a whole output: the reasoning parser's content handed to the tool-call parser."""
        if self.reasoning is not None:
            reasoning, content = self.reasoning.parse(text)
        else:
            reasoning, content = None, text or None
        if self.tools is None:
            return ParsedOutput(reasoning, content, [])
        parsed = self.tools.parse(content or "")
        return ParsedOutput(reasoning, parsed.content, parsed.calls)
