"""A streamed chat completion's SSE frames, one engine output at a time."""

from __future__ import annotations

from typing import Any

from pyfront.engine_client.protocol import (
    EngineCoreOutput,
)
from pyfront.server.api.chat.convert import chat_logprobs, parsed_delta, tool_finish_reason
from pyfront.server.api.sse import DELTA_MARKER, DONE_FRAME, ContentTemplate, error_frames, frame
from pyfront.server.generate.generation import Choice, Generation, choice_rows
from pyfront.server.openai.types import (
    ChatCompletionRequest,
)
from pyfront.server.state import ServingState


class ChatFrames:
    """Renders a streamed chat's SSE frames; a plain text delta is one template fill, no dict building."""

    __slots__ = (
        "continuous",
        "generation",
        "head",
        "include_usage",
        "request",
        "role_pending",
        "state",
        "templates",
        "token_ids",
    )

    def __init__(
        self, state: ServingState, request: ChatCompletionRequest, generation: Generation, response_id: str, model: str
    ) -> None:
        self.state = state
        self.request = request
        self.generation = generation
        self.head = {"id": response_id, "object": "chat.completion.chunk", "created": int(generation.arrival),
                     "model": model}  # fmt: skip
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous = bool(options and options.continuous_usage_stats) and self.include_usage
        self.templates = {
            c.index: ContentTemplate(self._chunk(c.index, {"content": DELTA_MARKER}, None, None))
            for c in generation.choices
        }
        # As vLLM, a choice's role chunk goes out with its first engine output, not before: clients time
        # the first token from the first chunk that has choices.
        self.role_pending = {c.index for c in generation.choices}
        self.token_ids = bool(request.return_token_ids)
        """vLLM's return_token_ids: the role chunks carry the prompt's ids, every output a chunk with its own."""

    def _chunk(self, index: int, delta: dict[str, Any], logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return {
            **self.head,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }

    def output(self, choice: Choice, output: EngineCoreOutput) -> bytes:
        """The frames (possibly none) for one engine output of `choice`."""
        generation = self.generation
        prefix = b""
        if choice.index in self.role_pending:
            self.role_pending.discard(choice.index)
            role = self._chunk(choice.index, {"role": "assistant", "content": ""}, None, None)
            if self.token_ids:
                role["prompt_token_ids"] = generation.prompt_ids
            prefix = frame(role)
        request = self.request
        rows_before = choice.text.num_tokens
        delta = generation.on_output(choice, output)
        logprobs = None
        if request.logprobs and choice.text.num_tokens > rows_before:
            logprobs = chat_logprobs(self.state, choice, choice_rows(choice, rows_before), request)
        finish_reason = choice.finish_reason
        if choice.parsed is None:
            if finish_reason is None and logprobs is None and not self.continuous and not self.token_ids:
                return prefix + self.templates[choice.index].render(delta) if delta else prefix
            delta_body: dict[str, Any] = {"content": delta} if delta else {}
        else:
            delta_body = parsed_delta(choice, generation.plan, delta, finish_reason is not None)
            if finish_reason is not None:
                assert generation.plan is not None, "choices are parsed only under a plan"
                finish_reason = tool_finish_reason(generation.plan, finish_reason, bool(choice.parsed.calls))
        if finish_reason is not None:
            body = self._chunk(choice.index, delta_body, logprobs, finish_reason)
            body["choices"][0]["stop_reason"] = choice.stop_reason
        elif delta_body or logprobs is not None or self.token_ids:
            body = self._chunk(choice.index, delta_body, logprobs, None)
        else:
            return prefix
        if self.token_ids:
            body["choices"][0]["token_ids"] = choice.text.token_ids[rows_before:]
        if self.continuous:
            body["usage"] = generation.choice_usage(choice)
        return prefix + frame(body)

    def closing(self) -> bytes:
        """The usage chunk (when asked for) and [DONE]."""
        if self.include_usage:
            return frame({**self.head, "choices": [], "usage": self.generation.usage(streamed=True)}) + DONE_FRAME
        return DONE_FRAME

    def error(self, status: int, message: str) -> bytes:
        return error_frames(status, message)
