"""Model-output parsers: ``--reasoning-parser`` and ``--tool-call-parser``.

Text-level and independent of HTTP: each parser turns model output text into reasoning,
content and tool calls, whole (``parse``) or streamed (``stream().feed()`` /
``finish()``), with the same result for every chunking of the text.

* :mod:`pyfront.server.chat.parsers.reasoning`: reasoning parser base classes; ``<think>`` tags.
* :mod:`pyfront.server.chat.parsers.qwen3_reasoning`: ``qwen3``.
* :mod:`pyfront.server.chat.parsers.tool_calls`: tool-call shapes, base classes, tag-delimited formats.
* :mod:`pyfront.server.chat.parsers.hermes`: ``hermes``, ``<tool_call>{json}</tool_call>``.
* :mod:`pyfront.server.chat.parsers.qwen3_coder`: ``qwen3_coder``, ``<tool_call><function=...>`` XML calls.
* :mod:`pyfront.server.chat.parsers.json_stream`: incremental JSON reading for the above.
* :mod:`pyfront.server.chat.parsers.tool_choice`: ``required`` / named ``tool_choice``: constraints
  and their output.
* :mod:`pyfront.server.chat.parsers.pipeline`: reasoning then tool calls, together.

A new format is one file with one class (a ``TaggedToolCallParser`` with a ``CallBody``
for a tag-delimited tool-call format, with its ``structural_tag`` and ``matches_template``; a
``ThinkTagReasoningParser`` for ``<think>``-like reasoning) and one entry in the registry below:
the request path asks the configured class for everything format-specific.
"""

from __future__ import annotations

from pyfront.server.chat.parsers.hermes import HermesToolParser
from pyfront.server.chat.parsers.pipeline import OutputDelta, OutputParser, OutputStream, ParsedOutput
from pyfront.server.chat.parsers.qwen3_coder import Qwen3CoderToolParser
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
    "AUTO_TOOL_PARSER",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "TOOL_PARSER_CLASSES",
    "HermesToolParser",
    "OutputDelta",
    "OutputParser",
    "OutputStream",
    "ParsedOutput",
    "ParsedToolCalls",
    "Qwen3CoderToolParser",
    "Qwen3ReasoningParser",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStream",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallStream",
    "ToolStreamDelta",
    "detect_tool_parser",
    "get_reasoning_parser",
    "get_tool_parser",
    "make_tool_call_id",
]

TOOL_PARSER_CLASSES: tuple[type[ToolCallParser], ...] = (Qwen3CoderToolParser, HermesToolParser)
"""Every tool-call format, in the order ``--tool-call-parser auto`` tries them on a chat template."""

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {
    name: cls for cls in TOOL_PARSER_CLASSES for name in (cls.name, *cls.aliases)
}
"""``--tool-call-parser`` names (each format's name and aliases)."""

AUTO_TOOL_PARSER = "auto"
"""``--tool-call-parser auto``: the format the chat template writes (:func:`detect_tool_parser`)."""

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    Qwen3ReasoningParser.name: Qwen3ReasoningParser,
}
"""``--reasoning-parser`` names."""


def get_tool_parser(name: str) -> type[ToolCallParser]:
    """The ``--tool-call-parser`` class; ValueError naming the known ones for an unknown name.

    ``auto`` is resolved before this, with :func:`detect_tool_parser` on the loaded chat template.
    """
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted([*TOOL_PARSERS, AUTO_TOOL_PARSER]))
        raise ValueError(f"unknown tool call parser {name!r}; known: {known}") from None


def detect_tool_parser(template: str | None) -> type[ToolCallParser]:
    """The format a chat template writes tool calls in, for ``--tool-call-parser auto``.

    The first of :data:`TOOL_PARSER_CLASSES` whose :meth:`~ToolCallParser.matches_template`
    accepts the template's source. ValueError when none does (no template, or one that renders no
    tool calls in a known format): the server then refuses to start, since guessing would parse
    every call wrong.
    """
    if not template:
        raise ValueError("--tool-call-parser auto: the tokenizer has no chat template to pick a parser from")
    for cls in TOOL_PARSER_CLASSES:
        if cls.matches_template(template):
            return cls
    known = ", ".join(sorted(TOOL_PARSERS))
    raise ValueError(
        "--tool-call-parser auto: the chat template renders tool calls in no format pyfront knows; "
        f"name the parser instead (one of: {known})"
    )


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The ``--reasoning-parser`` class; ValueError naming the known ones for an unknown name."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}; known: {known}") from None
