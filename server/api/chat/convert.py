"""Engine outputs -> the chat completion body: messages, logprobs, parsed deltas and finish reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyfront.server.chat.parsers.tool_calls import ToolCallDelta
from pyfront.server.chat.plan import OutputPlan
from pyfront.server.generate.generation import (
    Choice,
    Generation,
    LogprobRow,
    choice_rows,
    prompt_logprobs,
)
from pyfront.server.openai.types import (
    ChatCompletionRequest,
)
from pyfront.server.state import ServingState
from pyfront.server.text.logprobs import (
    chat_logprobs_content,
)


def chat_logprobs(
    state: ServingState, choice: Choice, rows: Sequence[LogprobRow], request: ChatCompletionRequest
) -> dict[str, Any] | None:
    if not request.logprobs:
        return None
    return {
        "content": chat_logprobs_content(
            state.tokenizer.hf,
            rows,
            top_logprobs=request.top_logprobs or 0,
            return_tokens_as_token_ids=bool(getattr(request, "return_tokens_as_token_ids", False)),
            context=choice.logprob_context,
        )
    }


async def chat_full(
    state: ServingState, request: ChatCompletionRequest, generation: Generation, response_id: str, model: str
) -> dict[str, Any]:
    try:
        await generation.fold()
    except BaseException:
        await generation.abort()
        raise
    generation.finish_metrics()
    choices = []
    for choice in generation.choices:
        message, finish_reason = chat_message(choice, generation.plan)
        body = {
            "index": choice.index,
            "message": message,
            "logprobs": chat_logprobs(state, choice, choice_rows(choice), request),
            "finish_reason": finish_reason,
            "stop_reason": choice.stop_reason,
        }
        if request.return_token_ids:
            body["token_ids"] = choice.text.token_ids
        choices.append(body)
    response = {
        "id": response_id,
        "object": "chat.completion",
        "created": int(generation.arrival),
        "model": model,
        "choices": choices,
        "usage": generation.usage(streamed=False),
        "prompt_logprobs": prompt_logprobs(state, generation.choices[0]),
    }
    if request.return_token_ids:
        response["prompt_token_ids"] = generation.prompt_ids
    return response


def split_delta(
    choice: Choice, plan: OutputPlan | None, text: str, final: bool
) -> tuple[str, str, list[ToolCallDelta]]:
    """A streamed text delta split by the request's parsers: (reasoning, content, tool-call fragments).

    Content is "" under a forced tool choice and the fragments keep to the first call without parallel tool
    calls, as vLLM streams them (the Messages route's frames use this split too).
    """
    stream = choice.parsed
    step = stream.feed(text) if text else None
    parts = [step] if step else []
    if final:
        parts.append(stream.finish())
    reasoning = "".join(p.reasoning for p in parts)
    content = "".join(p.content for p in parts)
    calls = [call for p in parts for call in p.tool_calls]
    if plan is not None and not plan.parallel_tool_calls:
        calls = [call for call in calls if call.index == 0]
    if plan is not None and plan.forced:
        content = ""
    return reasoning, content, calls


def parsed_delta(choice: Choice, plan: OutputPlan | None, text: str, final: bool) -> dict[str, Any]:
    """A streamed delta split by the request's parsers: reasoning, content and tool-call fragments."""
    reasoning, content, calls = split_delta(choice, plan, text, final)
    body: dict[str, Any] = {}
    if reasoning:
        body["reasoning_content"] = reasoning
        body["reasoning"] = reasoning
    if content:
        body["content"] = content
    if calls:
        body["tool_calls"] = [call.to_openai() for call in calls]
    return body


def tool_finish_reason(plan: OutputPlan, finish_reason: str | None, called: bool) -> str | None:
    """vLLM: "tool_calls" when calls were made and the model stopped by itself, unless a function was named."""
    if called and not plan.named_tool and finish_reason == "stop":
        return "tool_calls"
    return finish_reason


def chat_message(choice: Choice, plan: OutputPlan | None) -> tuple[dict[str, Any], str | None]:
    """The non-streamed assistant message and finish reason: text split by the request's parsers."""
    message: dict[str, Any]
    if plan is None or plan.parser is None:
        message = {"role": "assistant", "content": choice.text.text, "reasoning_content": None, "tool_calls": []}
        return message, choice.finish_reason
    parsed = plan.parser.parse(choice.text.text)
    calls = parsed.calls if plan.parallel_tool_calls else parsed.calls[:1]
    content = parsed.content
    if plan.named_tool or (plan.forced and calls):
        content = ""  # vLLM 0.32: a named function's message has content "", called or not
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": parsed.reasoning,
        "reasoning": parsed.reasoning,
        "tool_calls": [call.to_openai() for call in calls],
    }
    return message, tool_finish_reason(plan, choice.finish_reason, bool(calls))
