"""A Responses request -> the chat request the chat steps run; outputs -> output items and the response object.

The request side is vLLM 0.32's (`vllm/entrypoints/openai/responses/utils.py` `construct_input_messages`,
`protocol.py` `ResponsesRequest.build_chat_params` / `to_sampling_params` / `extract_structured_outputs`):
`instructions` become a system message, items become chat messages (a function call, a reasoning item or
an output message that follows an assistant message joins it), `text.format` becomes structured outputs,
`reasoning.effort` goes to the chat template. The output side is `build_response_output_items` and
`ResponsesResponse.from_request`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from pyfront.server.api.chat.convert import chat_logprobs
from pyfront.server.api.responses_api.store import StoredResponse
from pyfront.server.chat.parsers import ToolCall
from pyfront.server.chat.plan import OutputPlan
from pyfront.server.generate.generation import Choice, Generation, choice_rows
from pyfront.server.openai.responses_types import (
    LOGPROBS_INCLUDE,
    InputItem,
    ItemContent,
    NamedResponsesToolChoice,
    ResponsesRequest,
    ResponsesTool,
)
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    StructuredOutputsRequest,
    Tool,
)
from pyfront.server.openai.types import (
    ToolCall as ChatToolCall,
)
from pyfront.server.state import ServingState

_PARTIAL = ("in_progress", "incomplete")


def random_id(prefix: str) -> str:
    """An output item's id, as vLLM makes them (`f"{prefix}_{random_uuid()}"`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def wants_logprobs(body: ResponsesRequest) -> bool:
    return LOGPROBS_INCLUDE in (body.include or ())


# ----------------------------------------------------------------------------------------------- request


def _text(content: str | list[ItemContent] | None) -> str | None:
    """An item's text: a string as it is, a part list's first part (vLLM reads `content[0].text`)."""
    if content is None or isinstance(content, str):
        return content
    return content[0].text if content else None


def _parts(content: str | list[ItemContent] | None) -> str | list[ContentPart] | None:
    if content is None or isinstance(content, str):
        return content
    return [ContentPart(type=part.type, text=part.text) for part in content]


def _last_assistant(messages: list[ChatMessage]) -> ChatMessage | None:
    return messages[-1] if messages and messages[-1].role == "assistant" else None


def append_items(messages: list[ChatMessage], items: Sequence[InputItem]) -> None:
    """Items as chat messages, appended to `messages` (vLLM's `construct_chat_messages_with_tool_call`).

    A function call, a reasoning item or an assistant message right after an assistant message fills that
    message's empty field instead of starting a new one, so reasoning + calls + text render as one turn.
    """
    for item in items:
        kind = item.type or "message"
        prev = _last_assistant(messages)
        if kind == "function_call":
            assert item.call_id is not None and item.name is not None and item.arguments is not None  # checked
            name = f"{item.namespace}__{item.name}" if item.namespace else item.name  # vLLM's flat namespaced name
            call = ChatToolCall(id=item.call_id, function=FunctionCall(name=name, arguments=item.arguments))
            if prev is not None:
                prev.tool_calls = [*(prev.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif kind == "reasoning":
            reasoning = _text(item.content) or _text(item.summary) or ""
            if prev is not None and prev.reasoning is None:
                prev.reasoning = reasoning
            else:
                messages.append(ChatMessage(role="assistant", reasoning=reasoning))
        elif kind == "function_call_output":
            messages.append(ChatMessage(role="tool", content=_parts(item.output), tool_call_id=item.call_id))
        elif item.role == "assistant":
            text = _text(item.content)
            if prev is not None and prev.content is None:
                prev.content = text
            else:
                messages.append(ChatMessage(role="assistant", content=text))
        else:
            assert item.role is not None  # checked
            messages.append(ChatMessage(role=item.role, content=_parts(item.content), name=item.name))


def output_as_items(output: list[dict[str, Any]]) -> list[InputItem]:
    """A stored response's output items as input items (reasoning, messages and calls: the whole turn)."""
    return msgspec.convert(output, list[InputItem], strict=False)


def turn_messages(body: ResponsesRequest, previous: StoredResponse | None) -> list[ChatMessage]:
    """The chat messages of this turn: instructions, the previous turn (its messages without their system
    message, then its output items), then this request's input."""
    messages: list[ChatMessage] = []
    if body.instructions:
        messages.append(ChatMessage(role="system", content=body.instructions))
    if previous is not None:
        messages += [msgspec.structs.replace(m) for m in previous.messages if m.role != "system"]
        append_items(messages, output_as_items(previous.body["output"]))
    if isinstance(body.input, str):
        messages.append(ChatMessage(role="user", content=body.input))
    else:
        append_items(messages, body.input)
    return messages


def _continues_final(body: ResponsesRequest) -> bool:
    """vLLM's `should_continue_final_message`: the last item is a message or reasoning still in progress."""
    if isinstance(body.input, str) or not body.input:
        return False
    last = body.input[-1]
    return (last.type or "message") in ("message", "reasoning") and last.status in _PARTIAL


def chat_request(body: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request the chat steps (render, plan, prepare) run for `body`."""
    continue_final = _continues_final(body)
    effort = body.reasoning.effort if body.reasoning is not None else None
    kwargs: dict[str, Any] = dict(body.chat_template_kwargs or {})
    if effort is not None:
        if "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = effort != "none"
        kwargs["reasoning_effort"] = effort
    tools = [
        Tool(function=FunctionDefinition(name=t.name or "", description=t.description, parameters=t.parameters,
                                         strict=t.strict))
        for t in body.tools or ()
    ]  # fmt: skip
    choice = body.tool_choice
    tool_choice: Any = choice
    if isinstance(choice, NamedResponsesToolChoice):
        tool_choice = NamedToolChoice(function=NamedFunction(name=choice.name or ""))
    structured = body.structured_outputs
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        structured = StructuredOutputsRequest(json_object=True)
    elif fmt is not None and fmt.type == "json_schema":
        structured = StructuredOutputsRequest(json=fmt.schema)
    logprobs = wants_logprobs(body)
    return ChatCompletionRequest(
        messages=messages,
        model=body.model,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        stop=body.stop,
        stop_token_ids=body.stop_token_ids,
        ignore_eos=body.ignore_eos,
        logit_bias=body.logit_bias,
        logprobs=logprobs,
        top_logprobs=body.top_logprobs if logprobs else 0,
        skip_special_tokens=body.skip_special_tokens,
        include_stop_str_in_output=body.include_stop_str_in_output,
        structured_outputs=structured,
        vllm_xargs=body.vllm_xargs,
        priority=body.priority,
        request_id=body.request_id,
        cache_salt=body.cache_salt,
        session_id=body.session_id,
        user=body.user,
        stream=body.stream,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        # vLLM 0.32: truncation "auto" truncates the prompt to the context less one token (truncate_prompt_tokens -1)
        truncate_prompt_tokens=-1 if body.truncation == "auto" else None,
        add_generation_prompt=not continue_final,
        continue_final_message=continue_final,
        chat_template_kwargs=kwargs or None,
    )


# ------------------------------------------------------------------------------------------------ output


def reasoning_item(item_id: str, text: str, status: str | None) -> dict[str, Any]:
    return {"id": item_id, "summary": [], "type": "reasoning",
            "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": None,
            "status": status}  # fmt: skip


def output_text(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


# The null fields below (phase, async, caller, allowed_callers, output_schema, ...) are those of the openai
# package vLLM 0.32 dumps its items with: its pydantic models write every field.


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "content": parts, "role": "assistant", "status": status, "type": "message", "phase": None}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"arguments": arguments, "call_id": call_id, "name": name, "type": "function_call", "id": item_id,
            "async": None, "caller": None, "namespace": None, "status": status}  # fmt: skip


def tool_object(tool: ResponsesTool) -> dict[str, Any]:
    """A request tool as the response echoes it."""
    return {"name": tool.name, "parameters": tool.parameters, "strict": tool.strict, "type": tool.type,
            "allowed_callers": None, "async": None, "defer_loading": None, "description": tool.description,
            "output_schema": None}  # fmt: skip


def output_logprobs(state: ServingState, body: ResponsesRequest, chat: ChatCompletionRequest,
                    choice: Choice, start: int = 0) -> list[dict[str, Any]] | None:  # fmt: skip
    """The output text's logprobs in the Responses shape (the chat entries: token, logprob, bytes, top)."""
    if not wants_logprobs(body):
        return None
    logprobs = chat_logprobs(state, choice, choice_rows(choice, start), chat)
    return logprobs["content"] if logprobs is not None else None


def output_items(
    state: ServingState, body: ResponsesRequest, chat: ChatCompletionRequest, choice: Choice, plan: OutputPlan
) -> list[dict[str, Any]]:
    """The non-streamed output: reasoning, then the message, then the function calls (vLLM's order)."""
    logprobs = output_logprobs(state, body, chat, choice)
    text = choice.text.text
    if plan.parser is None:
        parts = [output_text(text, logprobs)] if text else []
        return [message_item(random_id("msg"), parts, "completed")]
    parsed = plan.parser.parse(text)
    calls: list[ToolCall] = parsed.calls if plan.parallel_tool_calls else parsed.calls[:1]
    reasoning = parsed.reasoning if body.include_reasoning else None
    if not body.include_reasoning:
        logprobs = None
    items: list[dict[str, Any]] = []
    if reasoning:
        items.append(reasoning_item(random_id("rs"), reasoning, None))
    content = parsed.content
    if content and not (plan.forced and calls):
        items.append(message_item(random_id("msg"), [output_text(content, logprobs)], "completed"))
    items += [function_call_item(random_id("fc"), c.id, c.name, c.arguments_json, "completed") for c in calls]
    return items


def usage(generation: Generation) -> dict[str, Any]:
    """vLLM's ResponseUsage for a one-turn response (the per-turn lists are empty, as vLLM's simple path)."""
    choice = generation.choices[0]
    prompt = len(generation.prompt_ids)
    completion = choice.text.num_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": choice.cached_tokens or 0,
            "cache_write_tokens": choice.cache_creation_tokens or 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": generation.reasoning_tokens(choice) or 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + completion,
    }


def status_of(choice: Choice) -> str:
    return "incomplete" if choice.finish_reason == "length" else "completed"


def response_object(
    body: ResponsesRequest,
    generation: Generation,
    response_id: str,
    model: str,
    created: int,
    *,
    output: list[dict[str, Any]],
    status: str,
    usage_body: dict[str, Any] | None,
) -> dict[str, Any]:
    """The response object, field for field as vLLM's `ResponsesResponse.from_request` dumps it."""
    params = generation.params
    choice = body.tool_choice
    return {
        "id": response_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "metadata": body.metadata,
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "temperature": params.temperature,
        "tool_choice": {"name": choice.name, "type": choice.type} if not isinstance(choice, str) else choice,
        "tools": [tool_object(tool) for tool in body.tools or ()],
        "top_p": params.top_p,
        "background": bool(body.background),
        "max_output_tokens": params.max_tokens,
        "max_tool_calls": body.max_tool_calls,
        "previous_response_id": body.previous_response_id,
        "prompt": None,
        "reasoning": msgspec.to_builtins(body.reasoning) if body.reasoning is not None else None,
        "service_tier": body.service_tier,
        "status": status,
        "text": _text_config(body),
        "top_logprobs": params.logprobs,
        "truncation": body.truncation or "disabled",
        "usage": usage_body,
        "user": body.user,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _text_config(body: ResponsesRequest) -> dict[str, Any] | None:
    if body.text is None:
        return None
    fmt = body.text.format
    out: dict[str, Any] = {"format": None, "verbosity": body.text.verbosity}
    if fmt is not None:
        out["format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            out["format"] = {"name": fmt.name, "schema": fmt.schema, "type": fmt.type,
                             "description": fmt.description, "strict": fmt.strict}  # fmt: skip
    return out
