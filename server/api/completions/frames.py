"""A streamed text completion's SSE frames, one engine output at a time."""

from __future__ import annotations

from typing import Any

from pyfront.engine_client.protocol import (
    EngineCoreOutput,
)
from pyfront.server.api.completions.convert import CompletionBatch, completion_choice_logprobs
from pyfront.server.api.sse import DELTA_MARKER, DONE_FRAME, ContentTemplate, error_frames, frame
from pyfront.server.generate.generation import Choice, choice_rows
from pyfront.server.openai.types import (
    CompletionRequest,
)
from pyfront.server.state import ServingState


class CompletionFrames:
    """Renders a streamed completion's SSE frames; a plain text delta is one template fill.

    With echo, a choice's first frame carries its prompt's text (and logprobs) before its first
    generated text, as vLLM's first chunk does; it waits for the first output that has tokens or
    a finish, since the prompt logprobs come with it.
    """

    __slots__ = (
        "batch",
        "continuous",
        "echo_pending",
        "head",
        "ids_pending",
        "include_usage",
        "request",
        "state",
        "templates",
    )

    def __init__(
        self, state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
    ) -> None:
        self.state = state
        self.request = request
        self.batch = batch
        self.head = {"id": response_id, "object": "text_completion", "created": int(batch.generations[0].arrival),
                     "model": model}  # fmt: skip
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.continuous = bool(options and options.continuous_usage_stats) and self.include_usage
        self.templates: dict[int, ContentTemplate] = {}
        self.echo_pending: set[int] = (
            {c.number for g in batch.generations for c in g.choices} if batch.echo_texts is not None else set()
        )
        self.ids_pending: set[int] = (
            {c.number for g in batch.generations for c in g.choices} if request.return_token_ids else set()
        )
        """return_token_ids: the choices whose first chunk (with the prompt's ids) has not gone out yet."""

    def _chunk(self, number: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return {
            **self.head,
            "choices": [{"index": number, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        }

    def output(self, choice: Choice, output: EngineCoreOutput) -> bytes:
        """The frame (possibly none) for one engine output of `choice`."""
        request = self.request
        batch = self.batch
        rows_before = choice.text.num_tokens
        delta = choice.generation.on_output(choice, output)
        has_rows = choice.text.num_tokens > rows_before
        echo = False
        if self.echo_pending and choice.number in self.echo_pending:
            if not has_rows and choice.finish_reason is None:
                return b""  # nothing generated yet (a prefill chunk): the echo waits for the first token
            self.echo_pending.discard(choice.number)
            echo = True
        if batch.echo_only:
            delta, has_rows = "", False
        logprobs = None
        if request.logprobs is not None and (has_rows or echo):
            rows = choice_rows(choice, rows_before) if has_rows else []
            logprobs = completion_choice_logprobs(self.state, choice, request, rows, echo=echo)
        token_ids = request.return_token_ids
        new_ids = choice.text.token_ids[rows_before:] if token_ids else []
        if echo and not token_ids:  # vLLM 0.32: with return_token_ids an echo adds the prompt's ids, not its text
            assert batch.echo_texts is not None
            delta = batch.echo_texts[choice.number // batch.n] + delta
        quiet = not new_ids  # with return_token_ids every output that adds ids gets its chunk
        if choice.finish_reason is None and logprobs is None and not self.continuous and not echo and quiet:
            if not delta:
                return b""
            template = self.templates.get(choice.number)
            if template is None:
                template = self.templates[choice.number] = ContentTemplate(
                    self._chunk(choice.number, DELTA_MARKER, None, None)
                )
            return template.render(delta)
        body = self._chunk(choice.number, delta, logprobs, choice.finish_reason)
        body["choices"][0]["stop_reason"] = choice.stop_reason
        if echo or choice.number in self.ids_pending:
            # vLLM's echo chunk carries the prompt's ids, asked for or not (they share its echo branch)
            body["choices"][0]["prompt_token_ids"] = choice.generation.prompt_ids
            self.ids_pending.discard(choice.number)
        if token_ids:
            body["choices"][0]["token_ids"] = new_ids
        if self.continuous:
            prompt, completion = len(choice.generation.prompt_ids), choice.text.num_tokens
            body["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
            body["usage"]["completion_tokens"] = completion
        return frame(body)

    def closing(self) -> bytes:
        if self.include_usage:
            return frame({**self.head, "choices": [], "usage": self.batch.usage(streamed=True)}) + DONE_FRAME
        return DONE_FRAME

    def error(self, status: int, message: str) -> bytes:
        return error_frames(status, message)
