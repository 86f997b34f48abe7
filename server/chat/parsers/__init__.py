"""Model-output parsers: ``--reasoning-parser`` and ``--tool-call-parser``.

Text-level and independent of HTTP: each parser turns model output text into reasoning,
content and tool calls, whole (``parse``) or streamed (``stream().feed()`` /
``finish()``), with the same result for every chunking of the text.

* :mod:`pyfront.server.chat.parsers.reasoning`: reasoning parser base classes; ``<think>`` tags.
* :mod:`pyfront.server.chat.parsers.qwen3_reasoning`: ``qwen3``.
* :mod:`pyfront.server.chat.parsers.tool_calls`: tool-call shapes, base classes, tag-delimited formats.
* :mod:`pyfront.server.chat.parsers.hermes`: ``hermes``, ``<tool_call>{json}</tool_call>``.
* :mod:`pyfront.server.chat.parsers.json_stream`: incremental JSON reading for the above.
* :mod:`pyfront.server.chat.parsers.tool_choice`: ``required`` / named ``tool_choice``: constraints
  and their output.
* :mod:`pyfront.server.chat.parsers.pipeline`: reasoning then tool calls, together.

A new format is one file with one class (a ``TaggedToolCallParser`` with a ``CallBody``
for a tag-delimited tool-call format, a ``ThinkTagReasoningParser`` for ``<think>``-like
reasoning) and one line in the registry below.
"""

from __future__ import annotations

from pyfront.server.chat.parsers.hermes import HermesToolParser
from pyfront.server.chat.parsers.pipeline import OutputDelta, OutputParser, OutputStream, ParsedOutput
from pyfront.server.chat.parsers.qwen3_reasoning import Qwen3ReasoningParser
from pyfront.server.chat.parsers.reasoning import ReasoningDelta, ReasoningParser, ReasoningStream
from pyfront.server.chat.parsers.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolCallStream,
    ToolStreamDelta,
    make_tool_call_id,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "HermesToolParser",
    "OutputDelta",
    "OutputParser",
    "OutputStream",
    "ParsedOutput",
    "ParsedToolCalls",
    "Qwen3ReasoningParser",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStream",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "ToolStreamDelta",
    "get_reasoning_parser",
    "get_tool_parser",
    "make_tool_call_id",
]

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {
    HermesToolParser.name: HermesToolParser,
}
"""``--tool-call-parser`` names."""

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    Qwen3ReasoningParser.name: Qwen3ReasoningParser,
}
"""``--reasoning-parser`` names."""


def get_tool_parser(name: str) -> type[ToolCallParser]:
    """The ``--tool-call-parser`` class; ValueError naming the known ones for an unknown name."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool call parser {name!r}; known: {known}") from None


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The ``--reasoning-parser`` class; ValueError naming the known ones for an unknown name."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}; known: {known}") from None
