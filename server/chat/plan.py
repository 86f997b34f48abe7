"""Which parsers split a chat's generated text into reasoning, content and tool calls (the output plan)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import msgspec

from pyfront.server.chat.parsers import OutputParser
from pyfront.server.chat.parsers.tool_choice import hermes_structural_tag
from pyfront.server.errors import APIError
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    tool_dicts,
)
from pyfront.server.state import ServingState


@dataclass(slots=True)
class OutputPlan:
    """How a chat's generated text is split into reasoning, content and tool calls (issue: tools/reasoning)."""

    parser: OutputParser | None = None
    named_tool: bool = False
    """tool_choice names a function: finish_reason stays "stop" and content is "" (as vLLM)."""
    forced: bool = False
    """tool_choice is required or named: the output is constrained with the parser's structural tag."""
    structural_tag: str | None = None
    parallel_tool_calls: bool = True


def plan_output_parsing(state: ServingState, request: ChatCompletionRequest, prompt_text: str) -> OutputPlan:
    """Decide the parsers for this request; 400 where vLLM refuses (auto tool choice without a parser)."""
    plan = OutputPlan(parallel_tool_calls=request.parallel_tool_calls is not False)
    reasoning = None
    if state.reasoning_parser is not None:
        kwargs = request.chat_template_kwargs or {}
        enable_thinking = kwargs.get("enable_thinking", True) is not False
        starts = state.reasoning_parser.starts_in_reasoning_for_prompt(prompt_text, enable_thinking=enable_thinking)
        reasoning = state.reasoning_parser(starts_in_reasoning=starts)
    tools = None
    choice = request.tool_choice
    if request.tools and choice != "none":
        if state.tool_parser is None:
            raise APIError(400, f'"{choice if isinstance(choice, str) else "named"}" tool choice requires '
                           "--tool-call-parser to be set", param="tool_choice")  # fmt: skip
        if choice == "auto" and not state.enable_auto_tool_choice:
            raise APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                param="tool_choice",
            )
        tools = state.tool_parser()
        plan.named_tool = not isinstance(choice, str)
        tag = hermes_structural_tag(tool_dicts(request.tools), msgspec.to_builtins(choice), request.parallel_tool_calls)
        if tag is not None:
            plan.structural_tag = json.dumps(tag)
            plan.forced = choice == "required" or plan.named_tool
    if reasoning is not None or tools is not None:
        plan.parser = OutputParser(reasoning=reasoning, tools=tools)
    return plan
