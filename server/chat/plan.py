"""Which parsers split a chat's generated text into reasoning, content and tool calls (the output plan).

Everything format-specific comes from the configured parser classes (the registry in
:mod:`pyfront.server.chat.parsers`): the tool-call format's structural tag for forced tool choices
(or vLLM's JSON-schema constraint, for a format without one) and the reasoning parser's rule for
whether the output starts inside the reasoning. Nothing here names a format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from pyfront.engine_client.protocol import StructuredOutputsParams
from pyfront.server.chat.parsers import OutputParser, ToolCallParser
from pyfront.server.chat.parsers.tool_choice import constrained_tool_call_parser, tool_choice_json_schema
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
    """tool_choice is required or named: the output is constrained to calls (no content)."""
    constraint: StructuredOutputsParams | None = None
    """The tool-call constraint for the engine: the format's structural tag, or vLLM's JSON schema."""
    parallel_tool_calls: bool = True
    reasoning_ended: bool | None = None
    """``EngineCoreRequest.reasoning_ended``, as vLLM's ``resolve_reasoning_ended``: with a reasoning parser,
    whether the prompt already closed the reasoning; an engine started with ``--reasoning-parser`` then
    applies a constraint only after the output's ``</think>`` (False) or from the first token (True)."""
    reasoning_parser_kwargs: dict[str, Any] | None = None
    """``EngineCoreRequest.reasoning_parser_kwargs``: ``{"chat_template_kwargs": ...}`` with a reasoning parser,
    so the engine's own reasoning parser (the constraint's gate) knows whether thinking is on."""


def plan_output_parsing(state: ServingState, request: ChatCompletionRequest, prompt_text: str) -> OutputPlan:
    """Decide the parsers for this request; 400 where vLLM refuses (auto tool choice without a parser)."""
    plan = OutputPlan(parallel_tool_calls=request.parallel_tool_calls is not False)
    reasoning = None
    if state.reasoning_parser is not None:
        kwargs = request.chat_template_kwargs or {}
        enable_thinking = kwargs.get("enable_thinking", True) is not False
        starts = state.reasoning_parser.starts_in_reasoning_for_prompt(prompt_text, enable_thinking=enable_thinking)
        reasoning = state.reasoning_parser(starts_in_reasoning=starts)
        plan.reasoning_ended = not starts
        plan.reasoning_parser_kwargs = {"chat_template_kwargs": dict(kwargs)}
    tools: ToolCallParser | None = None
    choice = request.tool_choice
    if request.tools and choice != "none":
        parser_cls: type[ToolCallParser] | None = state.tool_parser
        if parser_cls is None:
            raise APIError(400, f'"{choice if isinstance(choice, str) else "named"}" tool choice requires '
                           "--tool-call-parser to be set", param="tool_choice")  # fmt: skip
        if choice == "auto" and not state.enable_auto_tool_choice:
            raise APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                param="tool_choice",
            )
        tool_list = tool_dicts(request.tools)
        choice_json = msgspec.to_builtins(choice)
        plan.named_tool = not isinstance(choice, str)
        forced = choice == "required" or plan.named_tool
        tools = parser_cls(tools=tool_list)
        if parser_cls.structural_tag_model is not None:
            tag = parser_cls.structural_tag(tool_list, choice_json, request.parallel_tool_calls)
            if tag is not None:
                plan.constraint = StructuredOutputsParams(structural_tag=json.dumps(tag))
                plan.forced = forced
        elif forced:
            # vLLM for a parser without a structural tag: the calls as JSON, read back by the JSON readers.
            schema = tool_choice_json_schema(tool_list, choice_json, request.parallel_tool_calls)
            plan.constraint = StructuredOutputsParams(json=schema)
            plan.forced = True
            tools = constrained_tool_call_parser(choice_json)
    if reasoning is not None or tools is not None:
        plan.parser = OutputParser(reasoning=reasoning, tools=tools)
    return plan
