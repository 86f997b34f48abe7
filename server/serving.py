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
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import msgspec
from starlette.types import Send

from pyfront.engine_client.client import (
    EngineClient,
    RequestAbortedError,
    RequestStream,
    release_waiter,
)
from pyfront.engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
    SamplingParams,
    StructuredOutputsParams,
    finish_reason_name,
)
from pyfront.server.errors import APIError, DeadlineExceeded, sse_error_frame, to_api_error
from pyfront.server.metrics import Metrics
from pyfront.server.openai_types import (
    ChatCompletionRequest,
    CompletionRequest,
    completion_prompts,
    message_text,
    tool_dicts,
)
from pyfront.server.parsers import OutputParser
from pyfront.server.parsers.tool_choice import hermes_structural_tag
from pyfront.server.sampling import build_sampling_params, child_params, resolve_structured_outputs
from pyfront.server.sse import DELTA_MARKER, DONE_FRAME, ContentTemplate, frame
from pyfront.server.text import (
    PROMPT_TAIL_TOKENS,
    TextStream,
    chat_logprobs_content,
    completion_logprobs,
    get_factory,
    next_text_offset,
    prompt_logprobs_entries,
)
from pyfront.server.tokenizer import Tokenizer, TokenizerError

logger = logging.getLogger("pyfront.server")


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
    enable_prompt_tokens_details: bool = False
    """Report usage.prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details), as vLLM does."""
    active: int = 0
    engine: EngineClient | None = None
    engine_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    render_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=4, thread_name_prefix="pyfront-render")
    )
    """Worker threads for rendering, tokenizing and hashing chat prompts (one hop per request). A plain
    executor: anyio's to_thread costs a capacity limiter and cancel-scope checkpoints on every call."""

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
    """One ``(ids, logprobs, rank)`` row per sampled token, appended as outputs arrive (never rebuilt)."""
    prompt_rows: list | None = None
    """The prompt-logprob rows (positions 1..L-1) when the request asked for them, gathered over outputs."""
    cached_tokens: int | None = None
    """The engine's prefill stats for this choice (None until reported): prompt tokens found in the cache..."""
    cache_creation_tokens: int | None = None
    """...and prompt tokens computed and written to it."""
    done: bool = False
    parsed: Any = None
    """The choice's OutputStream (reasoning / tool calls) when the request uses parsers."""
    logprob_context: list[int] = field(default_factory=list)
    """The last sampled ids, so a character split over streamed chunks shows as vLLM shows it."""
    text_offset: int = 0
    generation: Generation | None = None
    """The Generation this choice belongs to (a completions request has one per prompt)."""
    number: int = 0
    """The choice's index in the response: `index`, or for several completion prompts prompt * n + index."""


def usage_body(
    prompt: int, completion: int, details: dict[str, Any] | None, reasoning: int | None, *, nulls: bool
) -> dict[str, Any]:
    """`usage` as vLLM 0.32 dumps its UsageInfo: field order prompt, total, completion, then the details.

    Non-streamed answers dump every field (`nulls=True`: absent details are `null`); the final usage chunk
    of a stream drops the Nones (`model_dump_json(exclude_none=True)`), inside `details` too. `details`
    (`prompt_tokens_details`) is given only with --enable-prompt-tokens-details; `reasoning` only with a
    reasoning parser.
    """
    body: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
    body["completion_tokens"] = completion
    if details is not None:
        body["prompt_tokens_details"] = details if nulls else {k: v for k, v in details.items() if v is not None}
    elif nulls:
        body["prompt_tokens_details"] = None
    if reasoning is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    elif nulls:
        body["completion_tokens_details"] = None
    return body


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
        prompt_block_hashes: bytes | None = None,
    ) -> None:
        self.state = state
        self.prompt_block_hashes = prompt_block_hashes
        """Block hashes computed with the prompt (render_chat), or None: the engine client hashes."""
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
        self.choices = [Choice(i, rid, text_factory(tail), generation=self, number=i) for i, rid in enumerate(ids)]
        self.arrival = time.time()
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.last_output_at = self.started
        self.plan: OutputPlan | None = None

    async def start(self) -> None:
        """Send every choice's engine request; n > 1 children share one set of block hashes."""
        engine = self.engine
        hashes = self.prompt_block_hashes if engine.hasher is not None else None
        if hashes is None and len(self.choices) > 1 and engine.hasher is not None:
            hashes = await engine.hasher.hash_prompt(self.prompt_ids, self.cache_salt, checked=True)
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
                choice.stream = await engine.add_request(request, prompt_block_hashes=hashes, trusted=True)
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
            choice.cache_creation_tokens = output.prefill_stats.num_cache_creation_tokens
        if output.new_logprobs is not None:
            plain = output.new_logprobs.to_plain()
            choice.logprobs_rows.extend(zip(plain.token_ids, plain.logprobs, plain.ranks, strict=True))
        if output.new_prompt_logprobs_tensors is not None:
            plain = output.new_prompt_logprobs_tensors.to_plain()
            if choice.prompt_rows is None:
                choice.prompt_rows = []
            choice.prompt_rows.extend(zip(plain.token_ids, plain.logprobs, plain.ranks, strict=True))
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
            choice.finish_reason = finish_reason_name(finish)
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

    def prompt_tokens_details(self, *, chat: bool) -> dict[str, Any] | None:
        """usage.prompt_tokens_details with --enable-prompt-tokens-details, else None.

        The engine's prefill stats, 0 until reported (vLLM's output processor starts every request at 0
        and updates it from the first output's stats); the largest over n choices. vLLM's chat layer also
        reports the tokens written to the cache (`created_cache_tokens`), its completions layer does not.
        """
        if not self.state.enable_prompt_tokens_details:
            return None
        choices = self.choices
        cached = max((c.cached_tokens for c in choices if c.cached_tokens is not None), default=0)
        created = max((c.cache_creation_tokens for c in choices if c.cache_creation_tokens is not None), default=0)
        return {"cached_tokens": cached, "created_cache_tokens": created if chat else None, "multimodal_tokens": None}

    def reasoning_tokens(self, choice: Choice) -> int | None:
        """Generated tokens that are reasoning (None without --reasoning-parser, as vLLM leaves the field out)."""
        if self.state.reasoning_parser is None:
            return None
        reasoning = self.plan.parser.reasoning if self.plan is not None and self.plan.parser is not None else None
        if reasoning is None:
            return 0
        return reasoning.count_reasoning_tokens(choice.text.token_ids, self.state.tokenizer.token_id)

    def usage(self, *, streamed: bool) -> dict[str, Any]:
        """The chat answer's usage: the non-streamed body (`streamed=False`) or the final usage chunk."""
        completion = sum(c.text.num_tokens for c in self.choices)
        reasoning = None
        if self.state.reasoning_parser is not None:
            reasoning = sum(self.reasoning_tokens(c) or 0 for c in self.choices)
        details = self.prompt_tokens_details(chat=True)
        return usage_body(len(self.prompt_ids), completion, details, reasoning, nulls=not streamed)

    def choice_usage(self, choice: Choice) -> dict[str, Any]:
        """`stream_options.continuous_usage_stats`: the choice's own running usage, in vLLM's chunk shape."""
        completion = choice.text.num_tokens
        prompt = len(self.prompt_ids)
        reasoning = self.reasoning_tokens(choice)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "completion_tokens_details": None if reasoning is None else {"reasoning_tokens": reasoning},
        }

    def batches(self) -> AsyncIterator[tuple[Choice, list[EngineCoreOutput]]]:
        """Every choice's engine outputs as they arrive: one (choice, outputs) item per wake-up.

        An empty list is a keep-alive tick (`keepalive` seconds without output). Consumers stop reading a
        batch once its choice is done (a final output or a stop string). One async-generator level per
        wake-up, not per output, whatever n is: the streaming path pays for it once per engine step.
        """
        choices = [c for c in self.choices if c.stream is not None]
        if len(choices) == 1:
            return self._choice_batches(choices[0])
        return merge([self._choice_batches(c) for c in choices])

    async def _choice_batches(self, choice: Choice) -> AsyncIterator[tuple[Choice, list[EngineCoreOutput]]]:
        """One choice's outputs until its final one; raises DeadlineExceeded at the deadline."""
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
            if outputs:
                yield choice, outputs
                # Return after the final output even before the consumer has seen it: with n > 1 this
                # runs ahead in a pump, and a finished request has nothing more to drain.
                if any(o.finish_reason is not None for o in outputs):
                    return
            elif keepalive is not None:
                yield choice, outputs


async def merge(sources: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """Interleave several async iterators as items arrive.

    Errors from any source are raised to the consumer; the pumps are cancelled when it stops.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    done = object()

    async def pump(source: AsyncIterator[Any]) -> None:
        try:
            async for item in source:
                await queue.put(item)
        except BaseException as exc:  # handed to the consumer
            await queue.put(_Failure(exc))
        finally:
            await queue.put(done)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, _Failure):
                raise item.error
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


# ---------------------------------------------------------------------- chat


def _message_dicts(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text parts joined, tool call arguments as objects.

    Tool calls follow vLLM 0.32's `_postprocess_messages` (vllm/renderers/chat_utils.py): an empty list is
    dropped, and arguments become a dict, `{}` when they are empty, not JSON, or JSON that is not an
    object (logged). A malformed call lives in the history, so refusing it would fail every later turn of
    that conversation: vLLM coerces it, and so does pyfront, so both render the same prompt.
    """
    messages = msgspec.to_builtins(request.messages)
    for message, original in zip(messages, request.messages, strict=True):
        if isinstance(message.get("content"), list):
            message["content"] = message_text(original)
        calls = message.get("tool_calls")
        if isinstance(calls, list) and not calls:
            del message["tool_calls"]
        for call in calls or ():
            function = call.get("function") or {}
            function["arguments"] = _arguments_object(function.get("name"), function.get("arguments"))
    return messages


def _arguments_object(name: str | None, arguments: Any) -> dict[str, Any]:
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return arguments
    parsed: Any = arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            logger.warning("tool call %r has arguments that are not JSON (%d chars): rendered as {}", name,
                           len(arguments))  # fmt: skip
            return {}
    if not isinstance(parsed, dict):
        logger.warning("tool call %r arguments are a %s, not an object: rendered as {}", name, type(parsed).__name__)
        return {}
    return parsed


async def render_chat(
    state: ServingState, request: ChatCompletionRequest, *, hash_prompt: bool = False
) -> tuple[str, list[int], bytes | None]:
    """Render and tokenize the chat on a worker thread; with `hash_prompt`, also its block hashes (when FEH is on).

    Hashing in the same thread hop as rendering saves a second hop per request; the blob is what
    EngineClient.add_request would compute (the same memo), so the engine request is the same.
    """
    if request.chat_template is not None and not state.allow_request_chat_template:
        raise APIError(400, "per-request chat templates are disabled on this server", param="chat_template")
    hasher = state.engine.hasher if hash_prompt and state.engine is not None else None

    def render() -> tuple[str, list[int], bytes | None]:
        # Everything proportional to the history runs here, on a worker thread.
        text, ids = state.tokenizer.tokenize_chat(
            _message_dicts(request),
            tools=tool_dicts(request.tools) if request.tools else None,
            documents=msgspec.to_builtins(request.documents) if getattr(request, "documents", None) else None,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template=request.chat_template,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        # The tokenizer's ids are exact int32 ints: the memo may skip its own check (checked=True).
        blob = hasher.hash_prompt_sync(ids, request.cache_salt, checked=True) if hasher is not None else None
        return text, ids, blob

    try:
        return await asyncio.get_running_loop().run_in_executor(state.render_pool, render)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="messages") from None


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
    prompt_block_hashes: bytes | None = None,
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
        prompt_block_hashes=prompt_block_hashes,
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


async def fold_outputs(batches: AsyncIterator[tuple[Choice, list[EngineCoreOutput]]]) -> None:
    """Non-streamed answers: fold every output into its choice until all choices are done."""
    async for choice, outputs in batches:
        for output in outputs:
            if choice.done:
                break
            choice.generation.on_output(choice, output)


async def chat_full(
    state: ServingState, request: ChatCompletionRequest, generation: Generation, response_id: str, model: str
) -> dict:
    try:
        await fold_outputs(generation.batches())
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
        "usage": generation.usage(streamed=False),
        "prompt_logprobs": _prompt_logprobs(state, generation.choices[0]),
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


def _rows(choice: Choice, start: int = 0) -> list:
    """Logprob rows of the kept tokens from `start` on (stop strings may have dropped trailing tokens).

    A slice of the rows gathered so far: streaming asks for the new tokens' rows only, so the cost of an
    output does not grow with the length of the stream.
    """
    return choice.logprobs_rows[start : choice.text.num_tokens]


def chat_stream(
    state: ServingState, request: ChatCompletionRequest, generation: Generation, response_id: str, model: str
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed chat completion (n > 1; one choice takes PushStream)."""
    frames = ChatFrames(state, request, generation, response_id, model)
    return stream_frames(state, generation.batches(), frames, [generation])


async def stream_frames(
    state: ServingState,
    batches: AsyncIterator[tuple[Choice, list[EngineCoreOutput]]],
    frames: ChatFrames | CompletionFrames,
    generations: list[Generation],
) -> AsyncIterator[bytes]:
    """An SSE body rendered by `frames`: one bytes item per engine wake-up (one frame per output).

    Whatever ends it (the last output, an error, the client leaving), every engine request of
    `generations` is finished or aborted by the time it returns.
    """

    async def abort() -> None:
        for generation in generations:
            await generation.abort()

    try:
        async for choice, outputs in batches:
            if not outputs:
                yield KEEPALIVE_FRAME
                continue
            if choice.done:
                continue  # with n > 1 a choice's pump reads ahead: what it queued after the end is dropped
            if len(outputs) == 1:
                yield frames.output(choice, outputs[0])
                continue
            parts = []
            for output in outputs:
                if choice.done:
                    break
                parts.append(frames.output(choice, output))
            yield b"".join(parts)
        for generation in generations:
            generation.finish_metrics()
        yield frames.closing()
    except (asyncio.CancelledError, GeneratorExit):
        await abort()
        raise
    except BaseException as exc:
        await abort()
        error = to_api_error(exc)
        state.metrics.error(error.status)
        yield sse_error_frame(error.status, error.message) + DONE_FRAME
    finally:
        await abort()


class ChatFrames:
    """Renders a streamed chat's SSE frames; a plain text delta is one template fill, no dict building."""

    __slots__ = ("continuous", "generation", "head", "include_usage", "request", "role_pending", "state", "templates")

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
            prefix = frame(self._chunk(choice.index, {"role": "assistant", "content": ""}, None, None))
        request = self.request
        rows_before = choice.text.num_tokens
        delta = generation.on_output(choice, output)
        logprobs = None
        if request.logprobs and choice.text.num_tokens > rows_before:
            logprobs = _chat_logprobs(self.state, choice, _rows(choice, rows_before), request)
        finish_reason = choice.finish_reason
        if choice.parsed is None:
            if finish_reason is None and logprobs is None and not self.continuous:
                return prefix + self.templates[choice.index].render(delta) if delta else prefix
            delta_body: dict[str, Any] = {"content": delta} if delta else {}
        else:
            delta_body = _parsed_delta(choice, generation.plan, delta, finish_reason is not None)
            if finish_reason is not None:
                finish_reason = _tool_finish_reason(generation.plan, finish_reason, bool(choice.parsed.calls))
        if finish_reason is not None:
            body = self._chunk(choice.index, delta_body, logprobs, finish_reason)
            body["choices"][0]["stop_reason"] = choice.stop_reason
        elif delta_body or logprobs is not None:
            body = self._chunk(choice.index, delta_body, logprobs, None)
        else:
            return prefix
        if self.continuous:
            body["usage"] = generation.choice_usage(choice)
        return prefix + frame(body)

    def closing(self) -> bytes:
        """The usage chunk (when asked for) and [DONE]."""
        if self.include_usage:
            return frame({**self.head, "choices": [], "usage": self.generation.usage(streamed=True)}) + DONE_FRAME
        return DONE_FRAME


# ---------------------------------------------------------------------- completions


async def tokenize_completion_prompts(
    state: ServingState, request: CompletionRequest
) -> list[tuple[str | None, list[int]]]:
    """Each prompt's ids, with the text vLLM echoes for it when `echo` is on (else None), on a worker thread.

    vLLM echoes a text prompt as the request wrote it and a token prompt as `tokenizer.decode(ids)` (its
    renderer's `needs_detokenization`), never re-decoding a text prompt's ids.
    """
    prompts = completion_prompts(request)  # the shapes decode_completion_request accepted
    vocab = state.tokenizer.vocab_size
    tokenizer = state.tokenizer
    echo = bool(request.echo)

    def run() -> list[tuple[str | None, list[int]]]:
        out: list[tuple[str | None, list[int]]] = []
        for p in prompts:
            if isinstance(p, str):
                out.append((p if echo else None, tokenizer.encode(p, add_special_tokens=True)))
            else:
                if not p or not all(type(t) is int and 0 <= t < vocab for t in p):
                    raise APIError(400, f"token ids in prompt must be ints in [0, {vocab})", param="prompt")
                ids = list(p)
                out.append((tokenizer.decode(ids) if echo else None, ids))
        return out

    return await anyio.to_thread.run_sync(run)


def _completion_choice_logprobs(
    state: ServingState, choice: Choice, request: CompletionRequest, rows: Sequence, *, echo: bool = False
) -> dict | None:
    """Completions logprobs for `rows`, continuing the choice's text offset and decoding context.

    With `echo` (the choice's first chunk of an echoed request) the prompt's positions come first, as
    vLLM lists `[*prompt_logprobs, *output.logprobs]` against `[*prompt_token_ids, *output.token_ids]`:
    the first prompt token unscored (`None`), the others from the engine's prompt logprobs, decoded
    with their own context (the prompt's), then the generated rows with the choice's.
    """
    if request.logprobs is None:
        return None
    tokenizer = state.tokenizer.hf
    as_ids = bool(request.return_tokens_as_token_ids)
    parts = []
    if echo:
        prompt = completion_logprobs(
            tokenizer,
            choice.prompt_rows or (),
            top_logprobs=request.logprobs,
            initial_text_offset=choice.text_offset,
            return_tokens_as_token_ids=as_ids,
            context=[],
            unscored_token_ids=choice.generation.prompt_ids[:1],
        )
        choice.text_offset = next_text_offset(prompt, choice.text_offset)
        parts.append(prompt)
    if rows or not echo:
        output = completion_logprobs(
            tokenizer,
            rows,
            top_logprobs=request.logprobs,
            initial_text_offset=choice.text_offset,
            return_tokens_as_token_ids=as_ids,
            context=choice.logprob_context,
        )
        choice.text_offset = next_text_offset(output, choice.text_offset)
        parts.append(output)
    if len(parts) == 1:
        return parts[0]
    return {key: parts[0][key] + parts[1][key] for key in parts[0]}


def _prompt_logprobs(state: ServingState, choice: Choice) -> list | None:
    """The response's `prompt_logprobs`: None unless the engine was asked for them (prompt_logprobs or echo)."""
    if choice.generation is None or choice.generation.params.prompt_logprobs is None:
        return None
    return prompt_logprobs_entries(state.tokenizer.hf, choice.prompt_rows or ())


class CompletionBatch:
    """A completions request may carry several prompts: one Generation each, choices numbered across.

    `echo_texts[p]` is prompt p as vLLM echoes it: the request's own string for a text prompt, the
    decoded ids for a token prompt. With `echo_only` (echo and max_tokens 0) the engine was asked for
    one token, which is dropped from the text and logprobs but, as vLLM does, counted in usage.
    """

    def __init__(self, generations: list[Generation], echo_texts: list[str] | None, n: int, echo_only: bool) -> None:
        self.generations = generations
        self.echo_texts = echo_texts
        self.echo_only = echo_only
        self.n = n
        for p, generation in enumerate(generations):
            for choice in generation.choices:
                choice.number = p * n + choice.index

    async def abort(self) -> None:
        for generation in self.generations:
            await generation.abort()

    def usage(self, *, streamed: bool) -> dict[str, Any]:
        """vLLM's completion usage; its cached tokens are the last prompt's (non-streamed) or the first's."""
        prompt = sum(len(g.prompt_ids) for g in self.generations)
        completion = sum(c.text.num_tokens for g in self.generations for c in g.choices)
        details = (self.generations[0] if streamed else self.generations[-1]).prompt_tokens_details(chat=False)
        return usage_body(prompt, completion, details, None, nulls=not streamed)

    def batches(self) -> AsyncIterator[tuple[Choice, list[EngineCoreOutput]]]:
        """Every choice of every prompt, as Generation.batches(); `choice.generation` says whose it is."""
        if len(self.generations) == 1:
            return self.generations[0].batches()
        return merge([g.batches() for g in self.generations])


async def completion_full(
    state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
) -> dict:
    try:
        await fold_outputs(batch.batches())
    except BaseException:
        await batch.abort()
        raise
    choices = []
    for p, generation in enumerate(batch.generations):
        generation.finish_metrics()
        for choice in generation.choices:
            text, rows = choice.text.text, _rows(choice)
            if batch.echo_only:
                text, rows = "", []
            echo = batch.echo_texts is not None
            choices.append(
                {
                    "index": choice.number,
                    "text": (batch.echo_texts[p] if batch.echo_texts is not None else "") + text,
                    "logprobs": _completion_choice_logprobs(state, choice, request, rows, echo=echo),
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                    "prompt_logprobs": _prompt_logprobs(state, choice),
                }
            )
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(batch.generations[0].arrival),
        "model": model,
        "choices": choices,
        "usage": batch.usage(streamed=False),
    }


def completion_stream(
    state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed completion (several prompts or n > 1; one choice takes PushStream)."""
    frames = CompletionFrames(state, request, batch, response_id, model)
    return stream_frames(state, batch.batches(), frames, batch.generations)


class CompletionFrames:
    """Renders a streamed completion's SSE frames; a plain text delta is one template fill.

    With echo, a choice's first frame carries its prompt's text (and logprobs) before its first
    generated text, as vLLM's first chunk does; it waits for the first output that has tokens or
    a finish, since the prompt logprobs come with it.
    """

    __slots__ = ("batch", "continuous", "echo_pending", "head", "include_usage", "request", "state", "templates")

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
            rows = _rows(choice, rows_before) if has_rows else []
            logprobs = _completion_choice_logprobs(self.state, choice, request, rows, echo=echo)
        if echo:
            assert batch.echo_texts is not None
            delta = batch.echo_texts[choice.number // batch.n] + delta
        if choice.finish_reason is None and logprobs is None and not self.continuous and not echo:
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
        if echo:  # vLLM's echo chunk carries the prompt's ids, asked for or not (they share its echo branch)
            body["choices"][0]["prompt_token_ids"] = choice.generation.prompt_ids
        if self.continuous:
            prompt, completion = len(choice.generation.prompt_ids), choice.text.num_tokens
            body["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
            body["usage"]["completion_tokens"] = completion
        return frame(body)

    def closing(self) -> bytes:
        if self.include_usage:
            return frame({**self.head, "choices": [], "usage": self.batch.usage(streamed=True)}) + DONE_FRAME
        return DONE_FRAME


# ---------------------------------------------------------------------- push streaming (one choice)


class PushStream:
    """A streamed response with one choice, written from the engine client's output loop.

    The general path (chat_stream / completion_stream under SSEResponse) wakes the request's task for
    every engine output. Here the choice's RequestStream hands each output to `on_output` while the
    engine's batch is routed; it renders the same frames (ChatFrames / CompletionFrames) and writes them
    with the server's `send` at once. Sending a body chunk completes without suspending unless the
    client stopped reading (flow control), so the send coroutine is driven by hand; if it does suspend,
    the request's task resumes it exactly as an asyncio Task would (await the future it yielded, then
    `send(None)`), and later frames queue behind it in order. The task wakes only for that, at the end,
    on an error, and on keep-alive / deadline timers: not once per token.
    """

    def __init__(self, state: ServingState, generation: Generation, frames: ChatFrames | CompletionFrames) -> None:
        assert len(generation.choices) == 1
        self.state = state
        self.generation = generation
        self.choice = generation.choices[0]
        self.frames = frames
        self._send: Send | None = None
        self._pending: tuple[Any, Any] | None = None
        """A send coroutine that suspended, and what it yielded."""
        self._backlog: list[bytes] = []
        self._attention: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None

    # -------------------------------------------------- called from the output loop (must not raise)

    def on_output(self, output: EngineCoreOutput) -> None:
        if self._done or self._error is not None:
            return
        try:
            chunk = self.frames.output(self.choice, output)
        except Exception as exc:  # raised in the request's task by run()
            self._error = exc
            self._wake()
            return
        if self.choice.done:
            self._done = True
        if chunk:
            self._write(chunk)
        if self._done:
            self._wake()

    def on_error(self, error: BaseException) -> None:
        if self._done:
            return
        if isinstance(error, RequestAbortedError):
            self._done = True  # aborted here (or by an admin): the stream ends as the general path ends it
        else:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        attention = self._attention
        if attention is not None and not attention.done():
            attention.set_result(None)

    def _write(self, chunk: bytes) -> None:
        if self._pending is not None:
            self._backlog.append(chunk)
            return
        assert self._send is not None
        coro = self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:
            if self._error is None:
                self._error = exc
            self._wake()
            return
        self._pending = (coro, yielded)
        self.state.metrics.write_waits.inc()
        self._wake()

    # -------------------------------------------------- the request's task

    async def _resume_pending(self) -> None:
        """Finish the suspended send as a Task would, then write what queued behind it.

        A Task that gets a future from a coroutine clears the future's `_asyncio_future_blocking`
        flag, waits for it to be done and resumes the coroutine with `send(None)`, which then reads
        the future's result or exception itself. This does the same from the request's task.
        """
        assert self._pending is not None
        coro, yielded = self._pending
        loop = asyncio.get_running_loop()
        while True:
            if yielded is None:  # a bare `yield` (asyncio.sleep(0)): resume on the next loop pass
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False
                if not yielded.done():
                    waiter = loop.create_future()
                    yielded.add_done_callback(lambda _, waiter=waiter: release_waiter(waiter))
                    try:
                        await waiter
                    except asyncio.CancelledError:
                        yielded.cancel()
                        self._pending = None
                        coro.close()
                        raise
            try:
                yielded = coro.send(None)
            except StopIteration:
                break
            except BaseException:
                self._pending = None
                raise
        self._pending = None
        backlog, self._backlog = self._backlog, []
        for chunk in backlog:
            self._write(chunk)

    async def _wait(self) -> None:
        """Until something needs the task, or the next keep-alive / deadline check is due."""
        generation = self.generation
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        timeout = None
        keepalive, deadline = generation.keepalive, generation.deadline
        if keepalive is not None:
            timeout = max(0.0, keepalive - (now - generation.last_output_at))
        if deadline is not None:
            timeout = deadline - now if timeout is None else min(timeout, deadline - now)
        attention = self._attention = loop.create_future()
        timer = loop.call_later(max(timeout, 0.0), release_waiter, attention) if timeout is not None else None
        try:
            await attention
        finally:
            self._attention = None
            if timer is not None:
                timer.cancel()
        if self._done or self._error is not None or self._pending is not None:
            return
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise DeadlineExceeded("the request deadline passed before the engine finished")
        if keepalive is not None and now - generation.last_output_at >= keepalive:
            generation.last_output_at = now
            self._write(KEEPALIVE_FRAME)

    async def _flush(self) -> None:
        while self._pending is not None:
            await self._resume_pending()

    async def run(self, send: Send) -> None:
        """Stream the response body (the response start is sent by SSEResponse)."""
        generation = self.generation
        stream = self.choice.stream
        assert stream is not None
        self._send = send
        try:
            for output in stream.listen(self):
                self.on_output(output)
            if stream.error is not None:
                self.on_error(stream.error)
            while True:
                if self._pending is not None:
                    await self._resume_pending()
                elif self._error is not None:
                    raise self._error
                elif self._done:
                    break
                else:
                    await self._wait()
            generation.finish_metrics()
            self._write(self.frames.closing())
            await self._flush()
        except asyncio.CancelledError:
            self._done = True
            await generation.abort()
            raise
        except BaseException as exc:
            self._done = True
            await generation.abort()
            error = to_api_error(exc)
            self.state.metrics.error(error.status)
            if self._pending is not None:
                self._pending[0].close()
                self._pending = None
            self._backlog.clear()
            self._write(sse_error_frame(error.status, error.message) + DONE_FRAME)
            await self._flush()
        finally:
            self._done = True
            stream.listen(None)
            await generation.abort()
