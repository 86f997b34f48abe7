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
"""

from __future__ import annotations

from pyfront.server.chat.parsers.json_stream import CallObjectReader
from pyfront.server.chat.parsers.tool_calls import CallBody, TaggedToolCallParser

__all__ = ["HermesToolParser"]


class HermesToolParser(TaggedToolCallParser):
    name = "hermes"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def new_body(self) -> CallBody:
        return CallObjectReader()
