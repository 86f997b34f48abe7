"""``--reasoning-parser qwen3``: Qwen3's ``<think>...</think>``, as vLLM 0.32's ``qwen3`` parser.

Qwen3 thinks first: ``<think>\\n...\\n</think>\\n\\n`` then the answer. Whether the output
starts inside the reasoning is ``starts_in_reasoning``, which the caller decides with
:meth:`Qwen3ReasoningParser.starts_in_reasoning_for_prompt` from the rendered prompt and
``chat_template_kwargs.enable_thinking``:

* thinking on (the default): the output starts in the reasoning whether the chat template
  opened the ``<think>`` (Qwen3-2507 templates end the prompt with ``<think>\\n``) or the
  model writes it (Qwen3's own template): a ``<think>`` inside the reasoning is dropped,
  the first ``</think>`` ends it, and an output without ``</think>`` is all reasoning;
* thinking off (``enable_thinking: false``, for which the template closes an empty
  ``<think>\\n\\n</think>\\n\\n`` block in the prompt): the output is all content, as is.

In the content after ``</think>`` a further ``</think>`` is dropped (vLLM's non-streaming
result; its streaming one keeps it). Text is never trimmed: reasoning keeps the newlines
around it and content the ``\\n\\n`` after ``</think>``, as vLLM returns them.

A ``<tool_call>`` inside the reasoning ends it and starts the content, as in vLLM 0.32 (whose
``qwen3`` reasoning parser is its ``Qwen3Parser`` grammar: REASONING + TOOL_START ->
REASONING_END). Qwen3.5-family models often open a call while thinking and never write
``</think>``; keeping the call in the reasoning would lose it silently and break the agent,
while ending the reasoning early at most misfiles a paragraph. Tool calls are parsed from the
content only, so the call reaches the tool parser whole, tag included.
"""

from __future__ import annotations

from pyfront.server.chat.parsers.reasoning import ThinkTagReasoningParser

__all__ = ["Qwen3ReasoningParser"]

_TURN_START = "<|im_start|>"


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    name = "qwen3"
    start_tag = "<think>"
    end_tag = "</think>"
    implicit_end_tags = ("<tool_call>",)

    @classmethod
    def starts_in_reasoning_for_prompt(cls, prompt: str, *, enable_thinking: bool = True) -> bool:
        """vLLM's rule (``is_reasoning_end`` over the prompt), on the rendered prompt text.

        In the last turn (after the last ``<|im_start|>``): a ``</think>`` after any
        ``<think>`` means the prompt closed the reasoning (False); a ``<think>`` still open
        means it opened it (True); neither leaves it to ``enable_thinking``.
        """
        boundary = prompt.rfind(_TURN_START)
        turn = prompt[boundary + len(_TURN_START) :] if boundary >= 0 else prompt
        last_end = turn.rfind(cls.end_tag)
        last_start = turn.rfind(cls.start_tag)
        if last_end >= 0 and last_end > last_start:
            return False
        if last_start >= 0:
            return True
        return enable_thinking
