"""Chat and text completions: request -> render/tokenize -> sampling params -> engine -> text -> response.

Each step lives in one place: parsing and validation in `openai_types`, sampling parameters in
`sampling`, prompt rendering and tokenization in `tokenizer` (on a worker thread), hashing and routing in
the engine client, detokenization and stop strings in `text`, SSE framing in `sse`. This module wires them
for one HTTP request and owns the request's lifetime: whatever happens (stop string, client disconnect,
error), every engine request it started is finished or aborted before it returns.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from engine_client.client import (
    EngineClient,
    EngineDeadError,
    EngineError,
    EngineUnavailableError,
    RequestAbortedError,
    RequestStream,
)
from engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
    SamplingParams,
    StructuredOutputsParams,
)
from server.errors import APIError, sse_error_frame
from server.metrics import Metrics
from server.openai_types import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestValidationError,
    message_text,
)
from server.parsers import OutputParser
from server.parsers.tool_choice import hermes_structural_tag
from server.sampling import build_sampling_params, child_params, resolve_structured_outputs
from server.sse import DELTA_MARKER, DONE_FRAME, ContentTemplate, frame
from server.text import (
    PROMPT_TAIL_TOKENS,
    TextStream,
    chat_logprobs_content,
    completion_logprobs,
    get_factory,
    next_text_offset,
)
from server.tokenizer import Tokenizer, TokenizerError

_FINISH_NAMES = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.ERROR: "error",
    FinishReason.REPETITION: "repetition",
}


@dataclass(slots=True)
class ServingState:
    """What every request handler needs; one per process, built at start-up."""

    tokenizer: Tokenizer
    metrics: Metrics
    model_names: list[str]
    max_model_len_override: int | None
    allow_request_chat_template: bool = False
    api_server_index: int = 0
    tool_parser: Any = None
    """The --tool-call-parser class, or None."""
    reasoning_parser: Any = None
    """The --reasoning-parser class, or None."""
    enable_auto_tool_choice: bool = False
    max_in_flight: int | None = None
    """Engine requests (choices) this process admits at once; beyond it, 503 + Retry-After."""
    request_timeout_s: float | None = None
    sse_keepalive_s: float | None = 15.0
    active: int = 0
    engine: EngineClient | None = None
    engine_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_model_len(self) -> int:
        engine_len = self.engine.max_model_len if self.engine is not None else 0
        if self.max_model_len_override:
            return min(self.max_model_len_override, engine_len) if engine_len else self.max_model_len_override
        return engine_len

    def require_engine(self) -> EngineClient:
        engine = self.engine
        if engine is None:
            reason = self.engine_error or "the engines are still starting"
            raise APIError(503, f"no engine is available: {reason}", headers={"Retry-After": "5"})
        if not engine.healthy:
            raise APIError(503, "no healthy engine is available", headers={"Retry-After": "5"})
        return engine

    def admit(self, count: int) -> Admission:
        """Reserve room for `count` engine requests, or refuse with 503 (never queue without bound)."""
        if self.max_in_flight is not None and self.active + count > self.max_in_flight:
            self.metrics.rejected.labels(self.metrics.model_name, "overload").inc()
            raise APIError(
                503,
                f"the server is at capacity ({self.max_in_flight} requests in flight); retry later",
                headers={"Retry-After": "1"},
            )
        self.active += count
        return Admission(self, count)

    def deadline(self, header: str | None) -> float | None:
        """The request's deadline: X-Request-Timeout (seconds) capped by --request-timeout."""
        timeout = self.request_timeout_s
        if header is not None:
            try:
                asked = float(header)
            except ValueError:
                raise APIError(
                    400, "X-Request-Timeout must be a number of seconds", param="X-Request-Timeout"
                ) from None
            if not asked > 0:
                raise APIError(400, "X-Request-Timeout must be positive", param="X-Request-Timeout")
            timeout = asked if timeout is None else min(asked, timeout)
        return None if timeout is None else time.monotonic() + timeout

    def check_model(self, model: str | None) -> str:
        if model is None or model == "":
            return self.model_names[0]
        if model not in self.model_names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model")
        return model


class Admission:
    """A reservation of in-flight capacity; `release()` is idempotent."""

    __slots__ = ("count", "state")

    def __init__(self, state: ServingState, count: int) -> None:
        self.state = state
        self.count = count

    def release(self) -> None:
        if self.count:
            self.state.active -= self.count
            self.count = 0

    async def guard(self, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Hold the reservation for as long as a streamed response runs."""
        try:
            async for chunk in frames:
                yield chunk
        finally:
            self.release()
            aclose = getattr(frames, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def base_request_id(header_id: str | None, body_id: str | None) -> str:
    return header_id or body_id or uuid.uuid4().hex


def engine_request_id(base: str) -> str:
    """Unique among in-flight requests even when a client reuses its id (a duplicate kills the engine)."""
    return f"{base}-{secrets.token_hex(4)}"


@dataclass(slots=True)
class Choice:
    """One choice of a response: its engine request and the text assembled from its outputs."""

    index: int
    request_id: str
    text: TextStream
    stream: RequestStream | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs_rows: list = field(default_factory=list)
    prompt_logprobs: list | None = None
    cached_tokens: int | None = None
    done: bool = False
    parsed: Any = None
    """The choice's OutputStream (reasoning / tool calls) when the request uses parsers."""
    logprob_context: list[int] = field(default_factory=list)
    """The last sampled ids, so a character split over streamed chunks shows as vLLM shows it."""
    text_offset: int = 0


class DeadlineExceeded(Exception):
    """The request's deadline (--request-timeout or the X-Request-Timeout header) passed."""


KEEPALIVE_FRAME = b": keep-alive\n\n"


class Generation:
    """The engine requests behind one HTTP request (n choices), and their clean-up."""

    def __init__(
        self,
        state: ServingState,
        prompt_ids: list[int],
        params: SamplingParams,
        base_id: str,
        *,
        cache_salt: str | None,
        priority: int,
        n: int,
        text_factory,
        external_id: str,
        deadline: float | None = None,
        keepalive: float | None = None,
    ) -> None:
        self.state = state
        self.deadline = deadline
        """time.monotonic() after which the request is aborted and answered with an error."""
        self.keepalive = keepalive
        """Seconds without output after which the stream gets a keep-alive tick (None in the events)."""
        self.engine = state.require_engine()
        self.prompt_ids = prompt_ids
        self.params = params
        self.cache_salt = cache_salt
        self.priority = priority
        self.external_id = external_id
        internal = engine_request_id(base_id)
        ids = [internal] if n == 1 else [f"{i}_{internal}" for i in range(n)]
        tail = prompt_ids[-PROMPT_TAIL_TOKENS:]
        self.choices = [Choice(i, rid, text_factory(tail)) for i, rid in enumerate(ids)]
        self.arrival = time.time()
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.last_output_at = self.started
        self.plan: OutputPlan | None = None

    async def start(self) -> None:
        """Send every choice's engine request; n > 1 children share one set of block hashes."""
        engine = self.engine
        hashes: bytes | None = None
        shared = len(self.choices) > 1 and engine.hasher is not None
        if shared:
            hashes = await engine.hasher.hash_prompt(self.prompt_ids, self.cache_salt)  # type: ignore[union-attr]
        try:
            for choice in self.choices:
                params = self.params if len(self.choices) == 1 else child_params(self.params, choice.index)
                request = EngineCoreRequest(
                    choice.request_id,
                    self.prompt_ids,
                    None,
                    params,
                    None,
                    self.arrival,
                    None,
                    self.cache_salt,
                    None,
                    priority=self.priority,
                    external_req_id=self.external_id,
                )
                choice.stream = await engine.add_request(
                    request, prompt_block_hashes=hashes if shared else None, trusted=True
                )
                hashed = choice.stream is not None and request.prompt_block_hashes is not None
                self.state.metrics.feh_requests.labels(self.state.metrics.model_name, str(hashed).lower()).inc()
        except BaseException:
            await self.abort()
            raise
        self.state.metrics.prompt_tokens.inc(len(self.prompt_ids))
        self.state.metrics.publish_memo()

    async def abort(self) -> None:
        """Abort every unfinished engine request (shielded: runs inside cancelled scopes too)."""
        pending = [c.request_id for c in self.choices if not c.done and c.stream is not None]
        for choice in self.choices:
            choice.done = True
        if pending:
            with anyio.CancelScope(shield=True):
                await self.engine.abort(pending)

    def on_output(self, choice: Choice, output: EngineCoreOutput) -> str:
        """Fold one engine output into the choice; returns the text delta to send."""
        metrics = self.state.metrics
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
            metrics.ttft.observe(now - self.started)
        else:
            metrics.itl.observe(now - self.last_output_at)
        self.last_output_at = now
        if output.prefill_stats is not None:
            choice.cached_tokens = output.prefill_stats.num_cached_tokens
        if output.new_logprobs is not None:
            choice.logprobs_rows.append(output.new_logprobs.to_plain())
        if output.new_prompt_logprobs_tensors is not None:
            choice.prompt_logprobs = (choice.prompt_logprobs or []) + [output.new_prompt_logprobs_tensors.to_plain()]
        finish = output.finish_reason
        stop_token = finish == FinishReason.STOP
        delta = choice.text.add(
            output.new_token_ids, finished_by_engine=finish is not None, stop_token_finished=stop_token
        )
        if choice.text.stopped:
            choice.finish_reason = "stop"
            choice.stop_reason = choice.text.stop_reason
        elif finish is not None:
            if finish == FinishReason.ERROR:
                raise APIError(500, "the engine reported an error for this request")
            choice.finish_reason = _FINISH_NAMES.get(finish, "stop")
            choice.stop_reason = output.stop_reason
        if choice.finish_reason is not None and not choice.done:
            choice.done = True
            metrics.finished(choice.finish_reason)
            metrics.generation_tokens.inc(choice.text.num_tokens)
            if finish is None:  # a stop string ended it here: the engine is still generating
                asyncio.get_running_loop().create_task(self.engine.abort([choice.request_id]))
        return delta

    def finish_metrics(self) -> None:
        self.state.metrics.e2e.observe(time.monotonic() - self.started)

    def usage(self) -> dict[str, Any]:
        completion = sum(c.text.num_tokens for c in self.choices)
        usage: dict[str, Any] = {
            "prompt_tokens": len(self.prompt_ids),
            "total_tokens": len(self.prompt_ids) + completion,
            "completion_tokens": completion,
        }
        cached = [c.cached_tokens for c in self.choices if c.cached_tokens is not None]
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": max(cached)}
        return usage

    async def choice_outputs(self, choice: Choice) -> AsyncIterator[EngineCoreOutput | None]:
        """One choice's engine outputs until its final one, or until the choice is done here.

        Yields None when `keepalive` seconds pass without output; raises DeadlineExceeded at the deadline.
        """
        stream = choice.stream
        assert stream is not None
        keepalive, deadline = self.keepalive, self.deadline
        while not choice.done:
            timeout = keepalive
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded("the request deadline passed before the engine finished")
                timeout = remaining if timeout is None else min(timeout, remaining)
            try:
                outputs = await stream.drain(timeout)
            except RequestAbortedError:
                return  # aborted here (a stop string matched): nothing more to read
            if not outputs:
                if keepalive is not None:
                    yield None
                continue
            for output in outputs:
                yield output
                if output.finish_reason is not None or choice.done:
                    return

    async def events(self) -> AsyncIterator[tuple[Choice, EngineCoreOutput | None]]:
        """Every engine output of every choice, as it arrives; ends when all choices are done."""
        choices = [c for c in self.choices if c.stream is not None]
        if len(choices) == 1:
            choice = choices[0]
            async for output in self.choice_outputs(choice):
                yield choice, output
            return
        async for choice, output in merge([(c, self.choice_outputs(c)) for c in choices]):
            # The pumps read ahead: an output queued before its choice finished here (a stop string) is stale.
            if output is not None and choice.done:
                continue
            yield choice, output


async def merge(sources: list[tuple[Any, AsyncIterator[Any]]]) -> AsyncIterator[tuple[Any, Any]]:
    """Interleave several async iterators as items arrive, tagging each item with its source's key.

    Errors from any source are raised to the consumer; the pumps are cancelled when it stops.
    """
    queue: asyncio.Queue[tuple[Any, Any] | BaseException | None] = asyncio.Queue()

    async def pump(key: Any, source: AsyncIterator[Any]) -> None:
        try:
            async for item in source:
                await queue.put((key, item))
        except BaseException as exc:  # handed to the consumer
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(key, source)) for key, source in sources]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def engine_error_to_api(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, DeadlineExceeded):
        return APIError(504, f"request timed out: {exc}")
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, EngineDeadError):
        return APIError(500, f"EngineCore encountered an issue: {exc}")
    if isinstance(exc, EngineError):
        return APIError(500, str(exc))
    if isinstance(exc, RequestValidationError):
        return APIError(400, str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, ValueError):
        return APIError(400, str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}")


# ---------------------------------------------------------------------- chat


def _message_dicts(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text parts joined, tool call arguments as objects."""
    messages = msgspec.to_builtins(request.messages)
    for message, original in zip(messages, request.messages, strict=True):
        if isinstance(message.get("content"), list):
            message["content"] = message_text(original)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments) if arguments else {}
                except ValueError:
                    raise RequestValidationError("tool call arguments must be JSON", "messages") from None
    return messages


async def render_chat(state: ServingState, request: ChatCompletionRequest) -> tuple[str, list[int]]:
    if request.chat_template is not None and not state.allow_request_chat_template:
        raise APIError(400, "per-request chat templates are disabled on this server", param="chat_template")

    def render() -> tuple[str, list[int]]:
        # Everything proportional to the history runs here, on a worker thread.
        return state.tokenizer.tokenize_chat(
            _message_dicts(request),
            tools=msgspec.to_builtins(request.tools) if request.tools else None,
            documents=msgspec.to_builtins(request.documents) if getattr(request, "documents", None) else None,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template=request.chat_template,
            chat_template_kwargs=request.chat_template_kwargs,
        )

    try:
        text, ids = await anyio.to_thread.run_sync(render)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="messages") from None
    return text, ids


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
        tool_dicts = msgspec.to_builtins(request.tools)
        tag = hermes_structural_tag(tool_dicts, msgspec.to_builtins(choice), request.parallel_tool_calls)
        if tag is not None:
            plan.structural_tag = json.dumps(tag)
            plan.forced = choice == "required" or plan.named_tool
    if reasoning is not None or tools is not None:
        plan.parser = OutputParser(reasoning=reasoning, tools=tools)
    return plan


def check_prompt_len(state: ServingState, prompt_len: int) -> None:
    limit = state.max_model_len
    if limit and prompt_len >= limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )


def make_text_factory(state: ServingState, params: SamplingParams):
    stop = params.stop if isinstance(params.stop, list) else ([params.stop] if params.stop else [])
    factory = get_factory(state.tokenizer.hf)

    def make(prompt_tail: Sequence[int]) -> TextStream:
        return TextStream(
            factory,
            stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            min_tokens=params.min_tokens,
            prompt_tail=prompt_tail,
        )

    return make


async def prepare(
    state: ServingState,
    request: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    *,
    base_id: str,
    streaming: bool,
    deadline: float | None = None,
    plan: OutputPlan | None = None,
) -> Generation:
    check_prompt_len(state, len(prompt_ids))
    tok = state.tokenizer
    params = build_sampling_params(
        request,
        prompt_len=len(prompt_ids),
        max_model_len=state.max_model_len,
        eos_token_id=tok.eos_token_id,
        extra_eos_token_ids=tok.extra_eos_token_ids,
        vocab_size=tok.vocab_size,
        generation_defaults=tok.generation_defaults,
        streaming=streaming,
        tokenize=lambda text: tok.encode(text, add_special_tokens=False),
    )
    if plan is not None and plan.structural_tag is not None:
        if params.structured_outputs is not None:
            raise APIError(400, "structured outputs cannot be combined with a forced tool choice", param="tool_choice")
        params.structured_outputs = resolve_structured_outputs(
            StructuredOutputsParams(structural_tag=plan.structural_tag)
        )
    generation = Generation(
        state,
        prompt_ids,
        params,
        base_id,
        cache_salt=request.cache_salt,
        priority=request.priority or 0,
        n=request.n or 1,
        text_factory=make_text_factory(state, params),
        external_id=base_id,
        deadline=deadline,
        keepalive=state.sse_keepalive_s if streaming else None,
    )
    if plan is not None and plan.parser is not None:
        for choice in generation.choices:
            choice.parsed = plan.parser.stream()
        generation.plan = plan
    await generation.start()
    return generation


def _chat_logprobs(state: ServingState, choice: Choice, rows: Sequence, request: ChatCompletionRequest) -> dict | None:
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
) -> dict:
    try:
        async for choice, output in generation.events():
            if output is not None:
                generation.on_output(choice, output)
    except BaseException:
        await generation.abort()
        raise
    generation.finish_metrics()
    choices = []
    for choice in generation.choices:
        message, finish_reason = _chat_message(choice, generation.plan)
        choices.append(
            {
                "index": choice.index,
                "message": message,
                "logprobs": _chat_logprobs(state, choice, _rows(choice), request),
                "finish_reason": finish_reason,
                "stop_reason": choice.stop_reason,
            }
        )
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(generation.arrival),
        "model": model,
        "choices": choices,
        "usage": generation.usage(),
    }


def _parsed_delta(choice: Choice, plan: OutputPlan | None, text: str, final: bool) -> dict[str, Any]:
    """A streamed delta split by the request's parsers: reasoning, content and tool-call fragments."""
    stream = choice.parsed
    step = stream.feed(text) if text else None
    parts = [step] if step else []
    if final:
        parts.append(stream.finish())
    body: dict[str, Any] = {}
    reasoning = "".join(p.reasoning for p in parts)
    content = "".join(p.content for p in parts)
    calls = [call for p in parts for call in p.tool_calls]
    if plan is not None and not plan.parallel_tool_calls:
        calls = [call for call in calls if call.index == 0]
    if reasoning:
        body["reasoning_content"] = reasoning
        body["reasoning"] = reasoning
    if content and not (plan is not None and plan.forced):
        body["content"] = content
    if calls:
        body["tool_calls"] = [call.to_openai() for call in calls]
    return body


def _tool_finish_reason(plan: OutputPlan, finish_reason: str | None, called: bool) -> str | None:
    """vLLM: "tool_calls" when calls were made and the model stopped by itself, unless a function was named."""
    if called and not plan.named_tool and finish_reason == "stop":
        return "tool_calls"
    return finish_reason


def _chat_message(choice: Choice, plan: OutputPlan | None) -> tuple[dict[str, Any], str | None]:
    """The non-streamed assistant message and finish reason: text split by the request's parsers."""
    if plan is None or plan.parser is None:
        message = {"role": "assistant", "content": choice.text.text, "reasoning_content": None, "tool_calls": []}
        return message, choice.finish_reason
    parsed = plan.parser.parse(choice.text.text)
    calls = parsed.calls if plan.parallel_tool_calls else parsed.calls[:1]
    content = parsed.content
    if plan.forced and calls:
        content = ""
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": parsed.reasoning,
        "reasoning": parsed.reasoning,
        "tool_calls": [call.to_openai() for call in calls],
    }
    return message, _tool_finish_reason(plan, choice.finish_reason, bool(calls))


def _rows(choice: Choice) -> list:
    """Logprob rows of the tokens kept (stop strings may have dropped trailing tokens)."""
    rows: list = []
    for plain in choice.logprobs_rows:
        rows.extend(zip(plain.token_ids, plain.logprobs, plain.ranks, strict=True))
    return rows[: choice.text.num_tokens]


async def chat_stream(
    state: ServingState, request: ChatCompletionRequest, generation: Generation, response_id: str, model: str
) -> AsyncIterator[bytes]:
    created = int(generation.arrival)
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    continuous = bool(options and options.continuous_usage_stats) and include_usage
    templates = {
        c.index: ContentTemplate(
            {
                **head,
                "choices": [
                    {"index": c.index, "delta": {"content": DELTA_MARKER}, "logprobs": None, "finish_reason": None}
                ],
            }
        )
        for c in generation.choices
    }
    # As vLLM, a choice's role chunk goes out with its first engine output, not before: clients time
    # the first token from the first chunk that has choices.
    role_pending = {c.index for c in generation.choices}
    try:
        async for choice, output in generation.events():
            if output is None:
                yield KEEPALIVE_FRAME
                continue
            if choice.index in role_pending:
                role_pending.discard(choice.index)
                yield frame(
                    {
                        **head,
                        "choices": [
                            {
                                "index": choice.index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            rows_before = choice.text.num_tokens
            delta = generation.on_output(choice, output)
            logprobs = None
            if request.logprobs and choice.text.num_tokens > rows_before:
                new_rows = _rows(choice)[rows_before : choice.text.num_tokens]
                logprobs = _chat_logprobs(state, choice, new_rows, request)
            finish_reason = choice.finish_reason
            if choice.parsed is None:
                delta_body: dict[str, Any] = {"content": delta} if delta else {}
            else:
                delta_body = _parsed_delta(choice, generation.plan, delta, finish_reason is not None)
                if finish_reason is not None:
                    finish_reason = _tool_finish_reason(generation.plan, finish_reason, bool(choice.parsed.calls))
            if finish_reason is not None:
                body: dict[str, Any] = {
                    **head,
                    "choices": [
                        {
                            "index": choice.index,
                            "delta": delta_body,
                            "logprobs": logprobs,
                            "finish_reason": finish_reason,
                            "stop_reason": choice.stop_reason,
                        }
                    ],
                }
                if continuous:
                    body["usage"] = generation.usage()
                yield frame(body)
            elif delta_body or logprobs is not None:
                if choice.parsed is None and logprobs is None and not continuous:
                    yield templates[choice.index].render(delta)
                else:
                    body = {
                        **head,
                        "choices": [
                            {
                                "index": choice.index,
                                "delta": delta_body,
                                "logprobs": logprobs,
                                "finish_reason": None,
                            }
                        ],
                    }
                    if continuous:
                        body["usage"] = generation.usage()
                    yield frame(body)
        generation.finish_metrics()
        if include_usage:
            yield frame({**head, "choices": [], "usage": generation.usage()})
        yield DONE_FRAME
    except (asyncio.CancelledError, GeneratorExit):
        await generation.abort()
        raise
    except BaseException as exc:
        await generation.abort()
        error = engine_error_to_api(exc)
        state.metrics.error(error.status)
        yield sse_error_frame(error.status, error.message)
        yield DONE_FRAME
    finally:
        await generation.abort()


# ---------------------------------------------------------------------- completions


async def tokenize_completion_prompts(state: ServingState, request: CompletionRequest) -> list[list[int]]:
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]  # one prompt of token ids
    elif isinstance(prompt, list) and prompt:
        prompts = list(prompt)
    else:
        raise APIError(400, "prompt must be a non-empty string, list of strings or list of token ids", param="prompt")
    vocab = state.tokenizer.vocab_size

    def run() -> list[list[int]]:
        out = []
        for p in prompts:
            if isinstance(p, str):
                out.append(state.tokenizer.encode(p, add_special_tokens=True))
            else:
                if not p or not all(type(t) is int and 0 <= t < vocab for t in p):
                    raise APIError(400, f"token ids in prompt must be ints in [0, {vocab})", param="prompt")
                out.append(list(p))
        return out

    return await anyio.to_thread.run_sync(run)


def _completion_choice_logprobs(
    state: ServingState, choice: Choice, request: CompletionRequest, rows: Sequence
) -> dict | None:
    """Completions logprobs for `rows`, continuing the choice's text offset and decoding context."""
    if request.logprobs is None:
        return None
    result = completion_logprobs(
        state.tokenizer.hf,
        rows,
        top_logprobs=request.logprobs,
        initial_text_offset=choice.text_offset,
        return_tokens_as_token_ids=bool(getattr(request, "return_tokens_as_token_ids", False)),
        context=choice.logprob_context,
    )
    choice.text_offset = next_text_offset(result, choice.text_offset)
    return result


def _with_offset(choice: Choice, offset: int) -> Choice:
    choice.text_offset = offset
    return choice


class CompletionBatch:
    """A completions request may carry several prompts: one Generation each, choices numbered across."""

    def __init__(self, generations: list[Generation], echo_texts: list[str], n: int) -> None:
        self.generations = generations
        self.echo_texts = echo_texts
        self.n = n

    def index(self, prompt_index: int, choice: Choice) -> int:
        return prompt_index * self.n + choice.index

    async def abort(self) -> None:
        for generation in self.generations:
            await generation.abort()

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(g.prompt_ids) for g in self.generations)
        completion = sum(c.text.num_tokens for g in self.generations for c in g.choices)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    async def events(self) -> AsyncIterator[tuple[int, Generation, Choice, EngineCoreOutput | None]]:
        if len(self.generations) == 1:
            async for choice, output in self.generations[0].events():
                yield 0, self.generations[0], choice, output
            return
        async for i, (choice, output) in merge([(i, g.events()) for i, g in enumerate(self.generations)]):
            if output is not None and choice.done:
                continue  # read ahead by a pump after the choice finished here
            yield i, self.generations[i], choice, output


async def completion_full(
    state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
) -> dict:
    try:
        async for _, generation, choice, output in batch.events():
            if output is not None:
                generation.on_output(choice, output)
    except BaseException:
        await batch.abort()
        raise
    choices = []
    for p, generation in enumerate(batch.generations):
        generation.finish_metrics()
        echo = batch.echo_texts[p] if request.echo else ""
        for choice in generation.choices:
            choices.append(
                {
                    "index": batch.index(p, choice),
                    "text": echo + choice.text.text,
                    "logprobs": _completion_choice_logprobs(
                        state, _with_offset(choice, len(echo)), request, _rows(choice)
                    ),
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                    "prompt_logprobs": None,
                }
            )
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(batch.generations[0].arrival),
        "model": model,
        "choices": choices,
        "usage": batch.usage(),
    }


async def completion_stream(
    state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
) -> AsyncIterator[bytes]:
    created = int(batch.generations[0].arrival)
    head = {"id": response_id, "object": "text_completion", "created": created, "model": model}
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    continuous = bool(options and options.continuous_usage_stats) and include_usage
    templates: dict[int, ContentTemplate] = {}
    try:
        if request.echo:
            for p, generation in enumerate(batch.generations):
                for choice in generation.choices:
                    index = batch.index(p, choice)
                    choice.text_offset = len(batch.echo_texts[p])
                    yield frame(
                        {
                            **head,
                            "choices": [
                                {"index": index, "text": batch.echo_texts[p], "logprobs": None, "finish_reason": None}
                            ],
                        }
                    )
        async for p, generation, choice, output in batch.events():
            if output is None:
                yield KEEPALIVE_FRAME
                continue
            index = batch.index(p, choice)
            rows_before = choice.text.num_tokens
            delta = generation.on_output(choice, output)
            logprobs = None
            if request.logprobs is not None and choice.text.num_tokens > rows_before:
                rows = _rows(choice)[rows_before : choice.text.num_tokens]
                logprobs = _completion_choice_logprobs(state, choice, request, rows)
            if choice.finish_reason is None and logprobs is None and not continuous:
                if delta:
                    template = templates.get(index)
                    if template is None:
                        template = templates[index] = ContentTemplate(
                            {
                                **head,
                                "choices": [
                                    {"index": index, "text": DELTA_MARKER, "logprobs": None, "finish_reason": None}
                                ],
                            }
                        )
                    yield template.render(delta)
                continue
            body: dict[str, Any] = {
                **head,
                "choices": [
                    {
                        "index": index,
                        "text": delta,
                        "logprobs": logprobs,
                        "finish_reason": choice.finish_reason,
                        "stop_reason": choice.stop_reason,
                    }
                ],
            }
            if continuous:
                body["usage"] = batch.usage()
            yield frame(body)
        for generation in batch.generations:
            generation.finish_metrics()
        if include_usage:
            yield frame({**head, "choices": [], "usage": batch.usage()})
        yield DONE_FRAME
    except (asyncio.CancelledError, GeneratorExit):
        await batch.abort()
        raise
    except BaseException as exc:
        await batch.abort()
        error = engine_error_to_api(exc)
        state.metrics.error(error.status)
        yield sse_error_frame(error.status, error.message)
        yield DONE_FRAME
    finally:
        await batch.abort()
