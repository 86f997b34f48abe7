"""One request's engine requests: sampling params -> EngineCoreRequests -> outputs folded into choices.

`prepare` builds the sampling parameters and starts a `Generation` (n choices, one engine request each);
`Generation.on_output` folds each engine output into its `Choice` (text, logprobs, finish) and
`Generation.batches` yields the outputs as they arrive. Whatever ends a request, `abort` finishes
every engine request it started. The routes turn choices into OpenAI bodies (server/api).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.to_thread

from pyfront.engine_client.client import (
    RequestAbortedError,
    RequestStream,
)
from pyfront.engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
    SamplingParams,
    finish_reason_name,
)
from pyfront.server.chat.plan import OutputPlan
from pyfront.server.errors import APIError, DeadlineExceeded
from pyfront.server.generate.merge import merge
from pyfront.server.generate.sampling import SamplingMemo, child_params
from pyfront.server.generate.structured_outputs import resolve_structured_outputs
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    CompletionRequest,
)
from pyfront.server.state import ServingState
from pyfront.server.text.detokenizer import get_factory
from pyfront.server.text.logprobs import (
    prompt_logprobs_entries,
)
from pyfront.server.text.stream import TextStream

logger = logging.getLogger("pyfront.server")

LogprobRow = tuple[list[int], list[float], int]
"""One position's logprobs: the ids (sampled or prompt token, then the top-K), their logprobs, the token's rank."""


@dataclass(slots=True)
class Choice:
    """One choice of a response: its engine request and the text assembled from its outputs."""

    index: int
    request_id: str
    stream: RequestStream | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs_rows: list[LogprobRow] = field(default_factory=list)
    """One ``(ids, logprobs, rank)`` row per sampled token, appended as outputs arrive (never rebuilt)."""
    prompt_rows: list[LogprobRow] | None = None
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
    generation: Generation = field(kw_only=True)
    """The Generation this choice belongs to (a completions request has one per prompt), as a weak proxy.

    Whatever holds a choice holds its Generation too (the handler, the frames object, CompletionBatch.generations),
    so the proxy always resolves. A plain reference made every Generation a reference cycle (generation -> choices ->
    choice -> generation): the whole request (its prompt ids, text streams, engine stream) then waited for the
    garbage collector instead of going when the request ended, and every request brought the next collection
    closer."""
    number: int = 0
    """The choice's index in the response: `index`, or for several completion prompts prompt * n + index."""
    text: TextStream = field(init=False)
    """Set by Generation.start once the engine requests are sent (read only after that)."""


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
        text_factory: Callable[[Sequence[int]], TextStream],
        external_id: str,
        deadline: float | None = None,
        keepalive: float | None = None,
        prompt_block_hashes: bytes | None = None,
        data_parallel_rank: int | None = None,
    ) -> None:
        self.state = state
        self.data_parallel_rank = data_parallel_rank
        """X-data-parallel-rank: every choice goes to this engine; None: the router picks."""
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
        internal = state.engine_ids(base_id)
        self._text_factory = text_factory
        owner = cast(Generation, weakref.proxy(self))  # see Choice.generation
        if n == 1:  # the usual case, without a comprehension's frame
            self.choices = [Choice(0, internal, generation=owner, number=0)]
        else:  # vLLM's child request ids
            self.choices = [Choice(i, f"{i}_{internal}", generation=owner, number=i) for i in range(n)]
        self.arrival = time.time()
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.last_output_at = self.started
        self.plan: OutputPlan | None = None

    async def start(self) -> None:
        """Send every choice's engine request, then make the choices' text streams; n > 1 children share one set
        of block hashes.

        The text streams (a detokenizer each) are made after the sends: nothing reads them before the first
        output, which can only arrive once this task waits, so the engine works while they are made.
        """
        engine = self.engine
        hashes = self.prompt_block_hashes if engine.hasher is not None else None
        if hashes is None and len(self.choices) > 1 and engine.hasher is not None:
            hashes = await engine.hasher.hash_prompt(self.prompt_ids, self.cache_salt, checked=True)
        plan = self.plan
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
                    self.data_parallel_rank,
                    priority=self.priority,
                    external_req_id=self.external_id,
                    reasoning_ended=plan.reasoning_ended if plan is not None else None,
                    reasoning_parser_kwargs=plan.reasoning_parser_kwargs if plan is not None else None,
                )
                choice.stream = await engine.add_request(request, prompt_block_hashes=hashes, trusted=True)
                hashed = choice.stream is not None and request.prompt_block_hashes is not None
                self.state.metrics.sent(hashed)
            for choice in self.choices:
                choice.text = self._text_factory(self.prompt_ids)
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
        choices = self.choices
        completion = choices[0].text.num_tokens if len(choices) == 1 else sum(c.text.num_tokens for c in choices)
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

    def _drain_timeout(self) -> float | None:
        """How long the next wait for outputs may last: until a keep-alive tick or the deadline (None: no bound);
        raises DeadlineExceeded once the deadline has passed."""
        timeout, deadline = self.keepalive, self.deadline
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded("the request deadline passed before the engine finished")
            timeout = remaining if timeout is None else min(timeout, remaining)
        return timeout

    def fold(self) -> Coroutine[Any, Any, None]:
        """A non-streamed answer: see :func:`fold_generations` (its coroutine itself, not one more around it)."""
        return fold_generations([self])

    async def _choice_batches(self, choice: Choice) -> AsyncIterator[tuple[Choice, list[EngineCoreOutput]]]:
        """One choice's outputs until its final one; raises DeadlineExceeded at the deadline."""
        stream = choice.stream
        assert stream is not None
        keepalive = self.keepalive
        while not choice.done:
            try:
                outputs = await stream.drain(self._drain_timeout())
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


def prompt_truncation(truncate: int | None, side: str | None, max_model_len: int, length: int) -> slice | None:
    """The part of a ``length``-token prompt that ``truncate_prompt_tokens`` keeps, as vLLM 0.32 slices it
    (``TokenizeParams._truncation_slice``): None when it keeps everything; ``-1`` means the context length
    less one token held back for the output (``max_truncation_tokens``); the last tokens are kept unless
    ``truncation_side`` is ``"right"`` (vLLM's tokenizers truncate on the left for generation)."""
    if truncate is None:
        return None
    limit = max(0, max_model_len - 1) if truncate < 0 else truncate
    if limit >= length:
        return None
    if limit == 0:
        return slice(0, 0)
    return slice(0, limit) if side == "right" else slice(-limit, None)


def check_prompt_len(state: ServingState, prompt_len: int) -> None:
    """vLLM's ``_validate_prompt_len``: not empty (a chat can render to nothing), shorter than the context."""
    if prompt_len == 0:
        raise APIError(400, "The decoder prompt cannot be empty", param="messages")
    limit = state.max_model_len
    if limit and prompt_len >= limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )


def make_text_factory(state: ServingState, params: SamplingParams) -> Callable[[Sequence[int]], TextStream]:
    stop = params.stop if isinstance(params.stop, list) else ([params.stop] if params.stop else [])
    factory = get_factory(state.tokenizer.hf)

    def make(prompt_ids: Sequence[int]) -> TextStream:
        return TextStream(
            factory,
            stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            min_tokens=params.min_tokens,
            prompt_tail=prompt_ids,
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
    data_parallel_rank: int | None = None,
) -> Generation:
    cut = prompt_truncation(request.truncate_prompt_tokens, request.truncation_side, state.max_model_len,
                            len(prompt_ids))  # fmt: skip
    if cut is not None:
        prompt_ids = prompt_ids[cut]
        prompt_block_hashes = None  # they were the whole prompt's: the engine client hashes what is sent
    check_prompt_len(state, len(prompt_ids))
    tok = state.tokenizer
    memo = state.sampling_memo
    if memo is None:
        memo = state.sampling_memo = SamplingMemo()
    params = memo.build(
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
    if plan is not None and plan.constraint is not None:
        if params.structured_outputs is not None:
            raise APIError(400, "structured outputs cannot be combined with a forced tool choice", param="tool_choice")
        params.structured_outputs = resolve_structured_outputs(plan.constraint)
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
        data_parallel_rank=data_parallel_rank,
    )
    if plan is not None and plan.parser is not None:
        for choice in generation.choices:
            choice.parsed = plan.parser.stream()
        generation.plan = plan
    await generation.start()
    return generation


async def fold_generations(generations: Sequence[Generation]) -> None:
    """Non-streamed answers (one Generation per prompt): every output is folded into its choice from the engine
    client's output loop (a listener per choice, as push streams have), and the caller wakes once, when every
    choice of every generation is done.

    Waking the task for each batch of outputs cost every output a future, a task step and a drain: on 64
    concurrent non-streamed 128-token answers, front-end CPU per token went from 13.7-18.1 to 9.4-12.5 us without
    them (6 interleaved rounds, benchmarks/README.md, stop 32). An error ends the wait with itself: an engine
    error's APIError, a failed stream (a dead engine), the deadline (`DeadlineExceeded`, the earliest of the
    generations'); a stop string's abort of its own choice does not (the choice is done by then). The caller
    aborts what is left on an error.
    """
    if len(generations) == 1 and len(generations[0].choices) == 1:  # the usual answer, without comprehensions
        only = generations[0]
        choices = [only.choices[0]] if only.choices[0].stream is not None else []
        deadlines = [only.deadline] if only.deadline is not None else []
    else:
        choices = [c for g in generations for c in g.choices if c.stream is not None]
        deadlines = [g.deadline for g in generations if g.deadline is not None]
    loop = asyncio.get_running_loop()
    waiting = _Fold(choices, loop.create_future())
    timer: asyncio.TimerHandle | None = None
    try:
        for choice in choices:
            stream = choice.stream
            assert stream is not None
            listener = _FoldListener(waiting, choice)
            for output in stream.listen(listener):
                listener.on_output(output)
            if stream.error is not None:
                listener.on_error(stream.error)
        if not waiting.future.done() and deadlines:
            timer = loop.call_later(max(0.0, min(deadlines) - time.monotonic()), waiting.expire)
        await waiting.future
    finally:
        if timer is not None:
            timer.cancel()
        for choice in choices:
            assert choice.stream is not None
            choice.stream.listen(None)


class _Fold:
    """What :func:`fold_generations` waits for: `future` is done when every choice is, or fails with the first error."""

    __slots__ = ("future", "pending")

    def __init__(self, choices: list[Choice], future: asyncio.Future[None]) -> None:
        self.future = future
        pending = 0
        for choice in choices:  # a loop, not sum() over a generator: one choice, usually
            if not choice.done:
                pending += 1
        self.pending = pending
        if not self.pending:
            future.set_result(None)

    def output(self, choice: Choice, output: EngineCoreOutput) -> None:
        if choice.done or self.future.done():
            return
        try:
            choice.generation.on_output(choice, output)
        except Exception as exc:  # an engine error's APIError (or a bug): the handler answers with it
            self.fail(exc)
            return
        if choice.done:
            self.pending -= 1
            if not self.pending:
                self.future.set_result(None)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def expire(self) -> None:
        self.fail(DeadlineExceeded("the request deadline passed before the engine finished"))


class _FoldListener:
    """One choice's engine stream listener for :func:`fold_generations` (a StreamListener: never raises)."""

    __slots__ = ("choice", "waiting")

    def __init__(self, waiting: _Fold, choice: Choice) -> None:
        self.waiting = waiting
        self.choice = choice

    def on_output(self, output: EngineCoreOutput) -> None:
        self.waiting.output(self.choice, output)

    def on_error(self, error: BaseException) -> None:
        if not self.choice.done:  # done: a stop string aborted it here, nothing more to read
            self.waiting.fail(error)


def choice_rows(choice: Choice, start: int = 0) -> list[LogprobRow]:
    """Logprob rows of the kept tokens from `start` on (stop strings may have dropped trailing tokens).

    A slice of the rows gathered so far: streaming asks for the new tokens' rows only, so the cost of an
    output does not grow with the length of the stream.
    """
    return choice.logprobs_rows[start : choice.text.num_tokens]


def prompt_logprobs(state: ServingState, choice: Choice) -> list[dict[int, dict[str, Any]] | None] | None:
    """The response's `prompt_logprobs`: None unless the engine was asked for them (prompt_logprobs or echo)."""
    if choice.generation.params.prompt_logprobs is None:
        return None
    return prompt_logprobs_entries(state.tokenizer.hf, choice.prompt_rows or ())
