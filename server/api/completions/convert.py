"""Completions: prompts -> token ids, and engine outputs -> the text completion body and its logprobs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pyfront.server.chat.render import INLINE_RENDER_MAX_BYTES
from pyfront.server.errors import APIError
from pyfront.server.generate.generation import (
    Choice,
    Generation,
    LogprobRow,
    choice_rows,
    fold_generations,
    prompt_logprobs,
    usage_body,
)
from pyfront.server.openai.types import (
    CompletionRequest,
    completion_prompts,
)
from pyfront.server.state import ServingState
from pyfront.server.text.logprobs import (
    completion_logprobs,
    next_text_offset,
)


async def tokenize_completion_prompts(
    state: ServingState, request: CompletionRequest, body_bytes: int | None = None
) -> list[tuple[str | None, list[int]]]:
    """Each prompt's ids, with the text vLLM echoes for it when `echo` is on (else None).

    On a worker thread, or inline when the request body (`body_bytes`) is within the bound of a chat's inline
    render (chat.render.INLINE_RENDER_MAX_BYTES: a short prompt's tokenize costs less than the hop).

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

    if body_bytes is not None and body_bytes <= INLINE_RENDER_MAX_BYTES:
        return run()
    return await asyncio.get_running_loop().run_in_executor(state.render_pool, run)


def completion_choice_logprobs(
    state: ServingState, choice: Choice, request: CompletionRequest, rows: Sequence[LogprobRow], *, echo: bool = False
) -> dict[str, Any] | None:
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

    async def fold(self) -> None:
        """Non-streamed: every output of every prompt folded into its choice (see fold_generations)."""
        await fold_generations(self.generations)


async def completion_full(
    state: ServingState, request: CompletionRequest, batch: CompletionBatch, response_id: str, model: str
) -> dict[str, Any]:
    try:
        await batch.fold()
    except BaseException:
        await batch.abort()
        raise
    choices = []
    for p, generation in enumerate(batch.generations):
        generation.finish_metrics()
        for choice in generation.choices:
            text, rows = choice.text.text, choice_rows(choice)
            if batch.echo_only:
                text, rows = "", []
            echo = batch.echo_texts is not None
            # vLLM 0.32: with return_token_ids an echo adds the prompt's ids, not its text.
            echoed = batch.echo_texts[p] if batch.echo_texts is not None and not request.return_token_ids else ""
            body = {
                "index": choice.number,
                "text": echoed + text,
                "logprobs": completion_choice_logprobs(state, choice, request, rows, echo=echo),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "prompt_logprobs": prompt_logprobs(state, choice),
            }
            if request.return_token_ids:
                body["prompt_token_ids"] = generation.prompt_ids
                body["token_ids"] = choice.text.token_ids
            choices.append(body)
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(batch.generations[0].arrival),
        "model": model,
        "choices": choices,
        "usage": batch.usage(streamed=False),
    }
