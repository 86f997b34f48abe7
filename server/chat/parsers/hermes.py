"""``--tool-call-parser hermes``: Qwen's and Hermes' ``<tool_call>{json}</tool_call>`` calls.

The model writes each call as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each block's JSON is read by :class:`~pyfront.server.chat.parsers.json_stream.CallObjectReader`: the
call starts when ``"name"`` is read, and the ``"arguments"`` object streams in canonical
form (``json.dumps(arguments, ensure_ascii=False)``, what vLLM's non-streaming Hermes
parser returns), so the streamed fragments always concatenate to the final arguments.
The rules for text around and between blocks are :class:`TaggedToolCallStream`'s.

``qwen3_json`` is another name for it, as in vLLM 0.32 (Qwen2.5 / QwQ / Qwen3 write their
calls this way). Forced tool choices are constrained with vLLM's ``hermes`` structural tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfront.server.chat.parsers.json_stream import CallObjectReader
from pyfront.server.chat.parsers.tool_calls import CallBody, TaggedToolCallParser
from pyfront.server.chat.parsers.tool_choice import hermes_structural_tag

__all__ = ["HermesToolParser"]


class HermesToolParser(TaggedToolCallParser):
    name = "hermes"
    aliases = ("qwen3_json",)
    structural_tag_model = "hermes"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    @classmethod
    def structural_tag(
        cls,
        tools: Sequence[Any] | None,
        tool_choice: Any,
        parallel_tool_calls: bool | None = None,
        strict_level: str = "auto",
    ) -> dict[str, Any] | None:
        return hermes_structural_tag(tools, tool_choice, parallel_tool_calls, strict_level)

    @classmethod
    def matches_template(cls, template: str) -> bool:
        """A ``<tool_call>`` block holding a JSON object with a ``"name"`` key (Qwen2.5 / Qwen3 / Hermes)."""
        return "<tool_call>" in template and '"name"' in template

    def new_body(self) -> CallBody:
        return CallObjectReader()
