"""A streamed response's events, one engine output at a time (vLLM 0.32's `SimpleStreamingEventProcessor`).

Each event is `event: <type>` plus its JSON, numbered by `sequence_number` from 0. The stream opens with
`response.created` and `response.in_progress`; each parsed delta goes to the output item of its kind
(reasoning, message, or one function call per call index), and a change of kind closes the open item
(`...done`, `response.content_part.done`, `response.output_item.done`) before the next one is added; the
stream ends with `response.completed` carrying the whole response. vLLM sends no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from pyfront.engine_client.protocol import EngineCoreOutput
from pyfront.server.api.responses_api.convert import (
    function_call_item,
    message_item,
    output_logprobs,
    output_text,
    random_id,
    reasoning_item,
    response_object,
    status_of,
    usage,
)
from pyfront.server.errors import error_body
from pyfront.server.generate.generation import Choice, Generation
from pyfront.server.openai.responses_types import ResponsesRequest
from pyfront.server.openai.types import ChatCompletionRequest
from pyfront.server.state import ServingState

_encode = msgspec.json.encode

_Delta = tuple[str, str, int | None, Any]
"""One atomic delta: kind ("reasoning", "content", "call"), text, call index, the call's first fragment."""


class ResponsesFrames:
    """Renders a streamed response's events (the Frames protocol of `api.sse`)."""

    def __init__(
        self,
        state: ServingState,
        body: ResponsesRequest,
        chat: ChatCompletionRequest,
        generation: Generation,
        response_id: str,
        model: str,
        on_complete: Callable[[dict[str, Any]], None],
    ) -> None:
        self.state = state
        self.body = body
        self.chat = chat
        self.generation = generation
        self.response_id = response_id
        self.model = model
        self.created = int(generation.arrival)
        self.on_complete = on_complete
        """Called with the final response object (the handler stores it)."""
        self.sequence = 0
        self.opened = False
        self.kind: str | None = None
        self.output_index = 0
        self.item_id = ""
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []
        self.call: tuple[str, str, int | None] = ("", "", None)
        """The open function call's call_id, name and index."""
        self.items: list[dict[str, Any]] = []

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        fields["sequence_number"] = self.sequence
        fields["type"] = kind
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(fields) + b"\n\n"

    def _response(self, output: list[dict[str, Any]], status: str, usage_body: dict[str, Any] | None) -> dict[str, Any]:
        return response_object(self.body, self.generation, self.response_id, self.model, self.created,
                               output=output, status=status, usage_body=usage_body)  # fmt: skip

    def _open_response(self) -> bytes:
        self.opened = True
        initial = self._response([], "in_progress", None)
        return self._event("response.created", {"response": initial}) + self._event(
            "response.in_progress", {"response": initial}
        )

    def output(self, choice: Choice, output: EngineCoreOutput) -> bytes:
        out = b"" if self.opened else self._open_response()
        rows_before = choice.text.num_tokens
        delta = self.generation.on_output(choice, output)
        final = choice.finish_reason is not None
        logprobs = None
        if choice.text.num_tokens > rows_before and (choice.parsed is None or self.body.include_reasoning):
            logprobs = output_logprobs(self.state, self.body, self.chat, choice, rows_before)
        stream_logprobs = [_stream_logprob(entry) for entry in logprobs or ()]
        parts = []
        for kind, text, index, first in self._deltas(choice, delta, final):
            if self.kind != kind or (kind == "call" and index != self.call[2]):
                parts.append(self._close_item())
                parts.append(self._open_item(kind, index, first))
            parts.append(self._item_delta(text, stream_logprobs, logprobs))
        return out + b"".join(parts)

    def _deltas(self, choice: Choice, delta: str, final: bool) -> list[_Delta]:
        """The output's text split by the parsers into atomic deltas: reasoning, content, calls by index."""
        if choice.parsed is None:
            return [("content", delta, None, None)] if delta else []
        stream = choice.parsed
        steps = [stream.feed(delta)] if delta else []
        if final:
            steps.append(stream.finish())
        plan = self.generation.plan
        assert plan is not None, "choices are parsed only under a plan"
        out: list[_Delta] = []
        reasoning = "".join(s.reasoning for s in steps)
        if reasoning and self.body.include_reasoning:
            out.append(("reasoning", reasoning, None, None))
        content = "".join(s.content for s in steps)
        if content and not plan.forced:
            out.append(("content", content, None, None))
        for call in (c for s in steps for c in s.tool_calls):
            if not plan.parallel_tool_calls and call.index != 0:
                continue
            out.append(("call", call.arguments or "", call.index, call))
        return out

    def _open_item(self, kind: str, index: int | None, first: Any) -> bytes:
        self.kind = kind
        self.text = ""
        self.logprobs = []
        at = {"output_index": self.output_index}
        if kind == "call":
            self.item_id = random_id("fc")
            self.call = (first.id or random_id("call"), first.name or "", index)
            item = function_call_item(self.item_id, self.call[0], self.call[1], "", "in_progress")
            return self._event("response.output_item.added", {"item": item, **at})
        if kind == "reasoning":
            self.item_id = random_id("rs")
            item = {"id": self.item_id, "summary": [], "type": "reasoning", "content": None,
                    "encrypted_content": None, "status": "in_progress"}  # fmt: skip
            part: dict[str, Any] = {"text": "", "type": "reasoning_text"}
        else:
            self.item_id = random_id("msg")
            item = message_item(self.item_id, [], "in_progress")
            part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        return self._event("response.output_item.added", {"item": item, **at}) + self._event(
            "response.content_part.added", {"content_index": 0, "item_id": self.item_id, "part": part, **at}
        )

    def _item_delta(
        self, text: str, stream_logprobs: list[dict[str, Any]], logprobs: list[dict[str, Any]] | None
    ) -> bytes:
        if not text:
            return b""
        self.text += text
        at = {"item_id": self.item_id, "output_index": self.output_index}
        if self.kind == "call":
            return self._event("response.function_call_arguments.delta", {"delta": text, **at})
        if self.kind == "reasoning":
            return self._event("response.reasoning_text.delta", {"content_index": 0, "delta": text, **at})
        self.logprobs += logprobs or ()
        return self._event("response.output_text.delta",
                           {"content_index": 0, "delta": text, "logprobs": stream_logprobs, **at})  # fmt: skip

    def _close_item(self) -> bytes:
        kind = self.kind
        if kind is None:
            return b""
        self.kind = None
        at = {"item_id": self.item_id, "output_index": self.output_index}
        if kind == "call":
            call_id, name, _ = self.call
            item = function_call_item(self.item_id, call_id, name, self.text, "completed")
            done = self._event("response.function_call_arguments.done", {"arguments": self.text, "name": name, **at})
        elif kind == "reasoning":
            item = reasoning_item(self.item_id, self.text, "completed")
            part: dict[str, Any] = {"text": self.text, "type": "reasoning_text"}
            done = self._event("response.reasoning_text.done", {"content_index": 0, "text": self.text, **at})
            done += self._event("response.content_part.done", {"content_index": 0, "part": part, **at})
        else:
            part = output_text(self.text, self.logprobs or None)
            item = message_item(self.item_id, [part] if self.text else [], "completed")
            done = self._event("response.output_text.done",
                               {"content_index": 0, "logprobs": [], "text": self.text, **at})  # fmt: skip
            done += self._event("response.content_part.done", {"content_index": 0, "part": part, **at})
        self.items.append(item)
        done += self._event("response.output_item.done", {"item": item, "output_index": self.output_index})
        self.output_index += 1
        return done

    def closing(self) -> bytes:
        """The open item's done events, then `response.completed` with the whole response."""
        out = b"" if self.opened else self._open_response()
        out += self._close_item()
        choice = self.generation.choices[0]
        final = self._response(self.items, status_of(choice), usage(self.generation))
        self.on_complete(final)
        return out + self._event("response.completed", {"response": final})

    def error(self, status: int, message: str) -> bytes:
        """An `error` event (OpenAI's ResponseErrorEvent), the stream's last."""
        kind = error_body(status, message)["error"]["type"]
        return self._event("error", {"code": kind, "message": message, "param": None})


def _stream_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A delta event's logprob: the entry without its bytes (vLLM's `_to_stream_logprobs`)."""
    tops = [{"token": t["token"], "logprob": t["logprob"]} for t in entry.get("top_logprobs") or ()]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": tops}
