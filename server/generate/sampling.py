"""OpenAI request -> engine ``SamplingParams``, exactly as vLLM 0.32's OpenAI server builds them.

:func:`build_sampling_params` folds together what vLLM spreads over ``get_max_tokens`` (max_tokens),
``ChatCompletionRequest``/``CompletionRequest.to_sampling_params`` (defaults, mapping),
``SamplingParams.__post_init__``/``_verify_args``/``verify`` (normalization and validation),
``InputProcessor.process_inputs`` (watermarking, ``update_from_generation_config`` for EOS,
``update_from_tokenizer`` for bad words) and ``_validate_structured_outputs`` (grammar backend
resolution, ``choice`` -> EBNF). The result is what vLLM would put on the wire, key for key: the
same fields are set, with the same values, and floats vLLM creates at run time (``presence_penalty:
0.0`` ...) are fresh objects here too, so msgspec's identity-based ``omit_defaults`` writes the same
keys. ``n`` is always 1: the server fans ``request.n`` out with :func:`child_params`, like vLLM's
``ParentRequest``.

Anything the engine would refuse while decoding (docs/engine-protocol.md#inputs-that-break-an-engine) raises
:class:`~pyfront.server.errors.RequestValidationError` here, and the result always passes
:func:`pyfront.engine_client.validation.validate_sampling_params`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from pyfront.engine_client.protocol import RequestOutputKind, SamplingParams, StructuredOutputsParams
from pyfront.engine_client.validation import validate_sampling_params
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.structured_outputs import resolve_structured_outputs
from pyfront.server.openai.types import INT64_MAX, MAX_LOGPROBS, ChatCompletionRequest, CompletionRequest
from pyfront.server.openai.validate import merged_structured_outputs, parse_logit_bias

_SAMPLING_EPS = 1e-5


_MIN_TEMPERATURE = 1e-2


MAX_LOGPROB_TOKEN_IDS = 128
"""vLLM's ``MAX_LOGPROB_TOKEN_IDS``."""


MAX_BAD_WORDS = 128
"""vLLM's ``VLLM_MAX_NUM_BAD_WORDS`` default (token sequences after tokenization)."""


_OPENAI_DEFAULTS: tuple[tuple[str, float | int], ...] = (
    ("repetition_penalty", 1.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("temperature", 1.0),
    ("top_p", 1.0),
    ("top_k", 0),
    ("min_p", 0.0),
)


_PROTOCOL_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(SamplingParams)}


def _fresh(value: Any, name: str) -> Any:
    """``value``, but never the very object that is ``SamplingParams``' default for ``name``.

    vLLM's server always writes e.g. ``presence_penalty: 0.0`` because its value is a different
    float object than the class default; msgspec's ``omit_defaults`` compares by identity.
    """
    if type(value) is float and value is _PROTOCOL_DEFAULTS.get(name):
        return float(repr(value))
    return value


def build_sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_len: int,
    max_model_len: int,
    eos_token_id: int | None,
    extra_eos_token_ids: Sequence[int],
    vocab_size: int,
    generation_defaults: Mapping[str, Any],
    streaming: bool,
    tokenize: Callable[[str], list[int]] | None,
    structured_outputs_backend: str = "auto",
) -> SamplingParams:
    """The engine ``SamplingParams`` vLLM 0.32's OpenAI server sends for ``request`` (with ``n`` = 1).

    ``request`` must come from :func:`~pyfront.server.openai.decode.decode_chat_request` /
    :func:`~pyfront.server.openai.decode.decode_completion_request`. ``prompt_len``: tokens in the rendered
    (and truncated) prompt. ``eos_token_id``: the tokenizer's EOS id (vLLM's ``renderer.get_eos_token_id()``).
    ``extra_eos_token_ids``: ``generation_config.json``'s ``eos_token_id`` (int list; may repeat the primary
    id). ``vocab_size``: the model's vocabulary size (logits width). ``generation_defaults``: see
    :func:`generation_defaults_from_config`. ``streaming`` selects DELTA vs FINAL_ONLY. ``tokenize`` encodes
    a string *without* special tokens (needed only for ``bad_words``). ``structured_outputs_backend``: the
    server's ``--structured-outputs-config`` backend ("auto" by default).

    Raises RequestValidationError with vLLM's message for every request vLLM answers with 400.
    """
    is_chat = isinstance(request, ChatCompletionRequest)
    max_tokens = request_max_tokens(request, prompt_len, max_model_len, generation_defaults)
    min_tokens = request.min_tokens

    # --- user -> server default (generation config) -> OpenAI default -------------------------------
    values: dict[str, Any] = {}
    for name, default in _OPENAI_DEFAULTS:
        value = getattr(request, name)
        if value is None:
            value = generation_defaults.get(name)
            if value is None:
                value = default
        values[name] = value
    temperature = values["temperature"]
    if not (isinstance(temperature, int | float) and math.isfinite(temperature)):
        raise RequestValidationError(f"temperature must be a finite number, got {temperature}.", "temperature")
    if 0 < temperature < _MIN_TEMPERATURE:
        temperature = _MIN_TEMPERATURE
    n = request.n or 1
    top_p, top_k, min_p = values["top_p"], values["top_k"], values["min_p"]
    greedy = temperature < _SAMPLING_EPS
    if greedy:
        if n > 1:
            raise RequestValidationError(f"n must be 1 when using greedy sampling, got {n}.", "n")
        # __post_init__'s constants are the class defaults' objects (one module): vLLM omits these keys.
        top_p, top_k, min_p = _PROTOCOL_DEFAULTS["top_p"], 0, _PROTOCOL_DEFAULTS["min_p"]

    seed = request.seed
    if seed == -1:
        seed = None
    if seed is not None and n > 1 and seed + n - 1 > INT64_MAX:
        raise RequestValidationError(f"seed + n - 1 must fit in a 64-bit integer, got seed={seed} and n={n}.", "seed")

    # --- stop strings and stop tokens ----------------------------------------------------------------
    stop = request.stop
    stop_list: list[str] = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    output_text_buffer_length = 0
    if stop_list and not request.include_stop_str_in_output:
        output_text_buffer_length = max(len(s) for s in stop_list) - 1

    stop_token_ids = list(request.stop_token_ids) if request.stop_token_ids is not None else []
    default_stop_ids = generation_defaults.get("stop_token_ids")
    if default_stop_ids:
        stop_token_ids = [*stop_token_ids, *default_stop_ids] if stop_token_ids else list(default_stop_ids)
    stop_token_ids = list(dict.fromkeys(stop_token_ids))
    all_stop_token_ids: set[int] = set()  # built in vLLM's order: same set iteration order on the wire
    all_stop_token_ids.update(stop_token_ids)

    # --- logprobs ----------------------------------------------------------------------------------
    logprob_token_ids = request.logprob_token_ids or None
    if isinstance(request, ChatCompletionRequest):
        logprobs = request.top_logprobs if request.logprobs and not logprob_token_ids else None
    else:
        logprobs = None if logprob_token_ids else request.logprobs
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is None and request.echo:
        prompt_logprobs = request.top_logprobs if isinstance(request, ChatCompletionRequest) else request.logprobs
    if logprobs:
        _check_logprobs_limit(logprobs, "sample", "top_logprobs" if is_chat else "logprobs", vocab_size)
    if logprob_token_ids is not None:
        if len(logprob_token_ids) > MAX_LOGPROB_TOKEN_IDS:
            raise RequestValidationError(
                f"Requested logprob_token_ids of length {len(logprob_token_ids)}, which is greater than "
                f"max allowed: {MAX_LOGPROB_TOKEN_IDS}",
                "logprob_token_ids",
            )
        _check_vocab(logprob_token_ids, "logprob_token_ids", vocab_size)
    if prompt_logprobs:
        _check_logprobs_limit(prompt_logprobs, "prompt", "prompt_logprobs", vocab_size)

    # --- token-id validation (SamplingParams.verify) ----------------------------------------------------
    logit_bias = parse_logit_bias(request.logit_bias) if request.logit_bias is not None else None
    if logit_bias:
        _check_vocab(list(logit_bias), "logit_bias", vocab_size)
    _check_vocab(stop_token_ids, "stop_token_ids", vocab_size)
    allowed = request.allowed_token_ids
    if allowed is not None:
        if not allowed:
            raise RequestValidationError("allowed_token_ids is not None and empty!", "allowed_token_ids")
        if any(t < 0 or t >= vocab_size for t in allowed):
            raise RequestValidationError("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids")
        allowed = list(allowed)

    # --- structured outputs --------------------------------------------------------------------------
    structured = merged_structured_outputs(request)
    structured_outputs = None
    if structured is not None:
        structured_outputs = resolve_structured_outputs(
            StructuredOutputsParams(
                json=structured.json,
                regex=structured.regex,
                choice=list(structured.choice) if structured.choice is not None else None,
                grammar=structured.grammar,
                json_object=structured.json_object,
                disable_any_whitespace=structured.disable_any_whitespace,
                disable_additional_properties=structured.disable_additional_properties,
                whitespace_pattern=structured.whitespace_pattern,
                structural_tag=structured.structural_tag,
            ),
            structured_outputs_backend,
        )

    # --- InputProcessor: feature gates ----------------------------------------------------------------
    thinking_token_budget = request.thinking_token_budget
    if thinking_token_budget == -1:
        thinking_token_budget = None
    if thinking_token_budget is not None:
        raise RequestValidationError(
            "thinking_token_budget is set but reasoning_config is not configured. Please set "
            "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.",
            "thinking_token_budget",
        )
    check_routed_experts_start(request, prompt_len)

    # --- update_from_generation_config: EOS ------------------------------------------------------------
    ignore_eos = request.ignore_eos
    if eos_token_id is not None:
        all_stop_token_ids.add(eos_token_id)
    if extra_eos_token_ids:
        eos_ids: set[int] = {extra_eos_token_ids} if isinstance(extra_eos_token_ids, int) else set(extra_eos_token_ids)
        if eos_token_id is not None:
            eos_ids.discard(eos_token_id)
        if eos_ids:
            all_stop_token_ids.update(eos_ids)
            if not ignore_eos:
                eos_ids.update(stop_token_ids)
                stop_token_ids = list(eos_ids)
    for t in all_stop_token_ids:  # a loop, not any() over a generator: every request has one or two
        if t < 0 or t >= vocab_size:
            raise RequestValidationError(
                f"EOS / stop token ids {sorted(all_stop_token_ids)} must be below the vocabulary size {vocab_size}"
            )

    # --- update_from_tokenizer: bad words ---------------------------------------------------------------
    bad_words = list(dict.fromkeys(request.bad_words)) if request.bad_words else []
    bad_words_token_ids = _bad_words_token_ids(bad_words, tokenize, vocab_size) if bad_words else None

    extra_args = dict(request.vllm_xargs) if request.vllm_xargs else None
    rd = request.repetition_detection
    repetition_detection = (
        {"max_pattern_size": rd.max_pattern_size, "min_pattern_size": rd.min_pattern_size, "min_count": rd.min_count}
        if rd is not None
        else None
    )

    params = SamplingParams(
        n=1,
        presence_penalty=_fresh(values["presence_penalty"], "presence_penalty"),
        frequency_penalty=_fresh(values["frequency_penalty"], "frequency_penalty"),
        repetition_penalty=_fresh(values["repetition_penalty"], "repetition_penalty"),
        temperature=_fresh(temperature, "temperature"),
        watermarking=False,
        top_p=top_p if greedy else _fresh(top_p, "top_p"),
        top_k=top_k,
        min_p=min_p if greedy else _fresh(min_p, "min_p"),
        seed=seed,
        stop=stop_list,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=list(logprob_token_ids) if logprob_token_ids is not None else None,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY,
        stream_interval=request.stream_interval,
        skip_clone=True,
        output_text_buffer_length=output_text_buffer_length,
        eos_token_id=None if ignore_eos else eos_token_id,
        all_stop_token_ids=list(all_stop_token_ids),
        structured_outputs=structured_outputs,
        logit_bias=logit_bias,
        allowed_token_ids=allowed,
        extra_args=extra_args,
        bad_words=bad_words,
        bad_words_token_ids=bad_words_token_ids,
        skip_reading_prefix_cache=prompt_logprobs is not None,
        thinking_token_budget=None,
        repetition_detection=repetition_detection,
        routed_experts_prompt_start=request.routed_experts_prompt_start,
    )
    return _validated(params)


def request_max_tokens(
    request: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    max_model_len: int,
    generation_defaults: Mapping[str, Any],
) -> int:
    """The engine's ``max_tokens`` for ``request`` with a prompt of ``prompt_len`` tokens, with vLLM's errors for
    lengths it refuses (``TokenizeParams.__post_init__`` and ``get_max_tokens``); also refuses ``min_tokens`` above
    it. The one part of :func:`build_sampling_params` that depends on the prompt's length."""
    is_chat = isinstance(request, ChatCompletionRequest)
    requested: int | None
    if isinstance(request, ChatCompletionRequest):
        if request.max_completion_tokens is not None:
            requested, max_param = request.max_completion_tokens, "max_completion_tokens"
        else:
            requested, max_param = request.max_tokens, "max_tokens"
    else:
        requested, max_param = request.max_tokens, "max_tokens"
    if (requested or 0) > max_model_len:
        raise RequestValidationError(
            f"{max_param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            max_param,
        )
    truncate = request.truncate_prompt_tokens
    input_len = prompt_len
    if truncate is not None:
        if truncate > max_model_len:
            raise RequestValidationError(
                f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len = {max_model_len}. "
                "Please request a smaller truncation size.",
                "truncate_prompt_tokens",
            )
        input_len = min(input_len, max_model_len if truncate == -1 else truncate)
    if max_model_len < input_len:
        raise RequestValidationError(
            f"Input length ({input_len}) exceeds model's maximum context length ({max_model_len}).",
            "messages" if is_chat else "prompt",
        )
    fallback = requested if requested is not None else generation_defaults.get("max_tokens")
    max_tokens = max_model_len - input_len if fallback is None else min(max_model_len - input_len, fallback)
    if not is_chat and request.echo and request.max_tokens == 0:
        max_tokens = 1  # echo without generation: vLLM asks the engine for one token and drops it
    if max_tokens < 1:
        raise RequestValidationError(f"max_tokens must be at least 1, got {max_tokens}.", max_param)
    min_tokens = request.min_tokens
    if min_tokens > max_tokens:
        raise RequestValidationError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.", "min_tokens"
        )
    return max_tokens


def check_routed_experts_start(request: ChatCompletionRequest | CompletionRequest, prompt_len: int) -> None:
    if not 0 <= request.routed_experts_prompt_start <= prompt_len:
        raise RequestValidationError(
            f"routed_experts_prompt_start must be between 0 and the prompt length ({prompt_len}), inclusive.",
            "routed_experts_prompt_start",
        )


def _validated(params: SamplingParams) -> SamplingParams:
    try:
        validate_sampling_params(params)
    except ValueError as exc:  # only reachable with an invalid server configuration (generation defaults)
        raise RequestValidationError(f"Invalid sampling parameters: {exc}") from None
    return params


class SamplingMemo:
    """:func:`build_sampling_params` with the result kept per request shape: a request whose sampling fields are
    those of an earlier one gets a copy of its parameters with its own ``max_tokens``.

    Why: building the parameters is a long function over some 40 fields of the request, run on every request; on a
    short request the copy saves ~6 % of the front end's instructions (callgrind, peers.py's sequential scenario:
    773.5k -> 728.4k a request), and more of its time, the build being code and data the caches lose between
    requests (6-7 us in a loop, 14-45 us with the caches flushed before each call; benchmarks/README.md, stop 37).
    The clients that send short requests (eval harnesses, agents, load tests, RL rollouts) send the same sampling
    fields every time.

    Why the copy equals a fresh build, field for field (tests/server/generate/test_sampling.py checks it on random
    requests): :func:`build_sampling_params` reads the request, the prompt's length and the server's facts (the
    tokenizer's EOS ids, the vocabulary size, the generation defaults). The prompt's length enters through
    :func:`request_max_tokens` (the ``max_tokens`` field and its errors) and :func:`check_routed_experts_start`
    (an error) alone; a hit runs both and makes a copy of the kept result with its own ``max_tokens``, and of the
    validation the build ends with, only the checks of ``max_tokens`` can come out otherwise than for the kept result:
    a hit makes them. Every other field is a function of the key's values and the facts: :func:`memo_key` names
    every other field the build reads, with its type (``1``, ``1.0`` and ``True`` are equal keys but not equal
    parameters), and leaves out (None: built in full, never kept) the requests whose fields are containers it
    does not put in the key (logit bias, allowed or logprob token ids, bad words, extra args, repetition detection,
    structured outputs). The facts are compared at each call (the EOS list and the defaults by identity: the
    tokenizer makes them once): other facts forget every entry. Errors are never
    kept: a request the build refuses is built in full every time, and a kept shape passed every check that does
    not depend on the prompt's length. The lists of the result are copied in and out, so that neither a caller nor
    a later hit can change another's.

    For the event loop's thread (dict operations only: a race could lose an entry, never mix two).
    """

    MAX_ENTRIES = 64
    """Request shapes kept (the oldest goes first); a server sees a handful."""

    __slots__ = ("_defaults", "_entries", "_eos", "_extra", "_vocab_size", "hits")

    def __init__(self) -> None:
        self.hits = 0
        """Requests answered from a kept shape."""
        self._entries: dict[tuple[tuple[Any, ...], tuple[type, ...]], SamplingParams] = {}
        self._eos: int | None = None
        self._extra: Sequence[int] | None = None
        self._vocab_size = 0
        self._defaults: Mapping[str, Any] | None = None

    def build(
        self,
        request: ChatCompletionRequest | CompletionRequest,
        *,
        prompt_len: int,
        max_model_len: int,
        eos_token_id: int | None,
        extra_eos_token_ids: Sequence[int],
        vocab_size: int,
        generation_defaults: Mapping[str, Any],
        streaming: bool,
        tokenize: Callable[[str], list[int]] | None,
    ) -> SamplingParams:
        """What ``build_sampling_params`` with these arguments returns (or raises)."""
        key = memo_key(request, streaming)
        if key is not None:
            if (
                eos_token_id != self._eos
                or extra_eos_token_ids is not self._extra
                or vocab_size != self._vocab_size
                or generation_defaults is not self._defaults
            ):
                self._entries = {}
                self._eos, self._extra, self._vocab_size = eos_token_id, extra_eos_token_ids, vocab_size
                self._defaults = generation_defaults
            kept = self._entries.get(key)
            if kept is not None:
                self.hits += 1
                max_tokens = request_max_tokens(request, prompt_len, max_model_len, generation_defaults)
                check_routed_experts_start(request, prompt_len)
                params = _copy(kept, max_tokens)
                if type(max_tokens) is int and max_tokens <= INT64_MAX:
                    return params  # what validation reads besides the kept fields (>= 1 and >= min_tokens: above)
                return _validated(params)  # its error
        params = build_sampling_params(
            request,
            prompt_len=prompt_len,
            max_model_len=max_model_len,
            eos_token_id=eos_token_id,
            extra_eos_token_ids=extra_eos_token_ids,
            vocab_size=vocab_size,
            generation_defaults=generation_defaults,
            streaming=streaming,
            tokenize=tokenize,
        )
        if key is not None:
            entries = self._entries
            if len(entries) >= self.MAX_ENTRIES:
                entries.pop(next(iter(entries)))
            entries[key] = _copy(params, params.max_tokens)
        return params


def _copy(params: SamplingParams, max_tokens: int | None) -> SamplingParams:
    """``params`` with ``max_tokens``, sharing no list with it (a kept result has no bad words, and no token lists
    but these)."""
    stop, stop_ids = params.stop, params.stop_token_ids
    assert type(stop) is list and stop_ids is not None, "build_sampling_params makes both lists"
    return msgspec.structs.replace(
        params,
        max_tokens=max_tokens,
        stop=list(stop),
        stop_token_ids=list(stop_ids),
        all_stop_token_ids=list(params.all_stop_token_ids),
        bad_words=[],
    )


def memo_key(
    request: ChatCompletionRequest | CompletionRequest, streaming: bool
) -> tuple[tuple[Any, ...], tuple[type, ...]] | None:
    """The request's shape for :class:`SamplingMemo`: every field :func:`build_sampling_params` reads outside
    :func:`request_max_tokens`, and their types; None when a field it leaves out is set."""
    r = request
    if (
        r.logit_bias is not None
        or r.allowed_token_ids is not None
        or r.logprob_token_ids
        or r.bad_words
        or r.vllm_xargs
        or r.repetition_detection is not None
        or r.structured_outputs is not None
        or r.guided_json is not None
        or r.guided_regex is not None
        or r.guided_choice is not None
        or r.guided_grammar is not None
        or (r.response_format is not None and r.response_format.type != "text")
    ):
        return None
    stop: Any = r.stop
    if type(stop) is list:
        stop = tuple(stop)  # strs (a list of anything else fails the build: never kept)
    ids: Any = r.stop_token_ids
    if ids is not None:
        for t in ids:
            if type(t) is not int:
                return None
        ids = tuple(ids)
    values = (
        type(r),
        streaming,
        r.repetition_penalty,
        r.presence_penalty,
        r.frequency_penalty,
        r.temperature,
        r.top_p,
        r.top_k,
        r.min_p,
        r.n,
        r.seed,
        stop,
        r.include_stop_str_in_output,
        ids,
        r.logprobs,
        r.top_logprobs if isinstance(r, ChatCompletionRequest) else None,
        r.prompt_logprobs,
        r.echo,
        r.min_tokens,
        r.ignore_eos,
        r.skip_special_tokens,
        r.spaces_between_special_tokens,
        r.stream_interval,
        r.thinking_token_budget,
        r.routed_experts_prompt_start,
    )
    return values, tuple(map(type, values))


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sampling params of child ``index`` of an ``n > 1`` request (vLLM's ``ParentRequest``).

    ``n`` = 1 and, when the parent is seeded, ``seed + index``; an unseeded parent's params are
    returned as they are (vLLM shares one child params object then). Children go to the engine as
    ``f"{index}_{request_id}"``.
    """
    if params.seed is None:
        return params if params.n == 1 else msgspec.structs.replace(params, n=1)
    return msgspec.structs.replace(params, n=1, seed=params.seed + index)


def _check_vocab(ids: Sequence[int], name: str, vocab_size: int) -> None:
    for t in ids:  # a loop first: the list of the invalid ones is made only for the error
        if t < 0 or t >= vocab_size:
            break
    else:
        return
    invalid = [t for t in ids if t < 0 or t >= vocab_size]
    if invalid:
        raise RequestValidationError(
            f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: {vocab_size}", name
        )


def _check_logprobs_limit(value: int, kind: str, param: str, vocab_size: int) -> None:
    requested = vocab_size if value == -1 else value
    if requested > MAX_LOGPROBS:
        raise RequestValidationError(
            f"Requested {kind} logprobs of {requested}, which is greater than max allowed: {MAX_LOGPROBS}", param
        )


def _bad_words_token_ids(
    bad_words: list[str], tokenize: Callable[[str], list[int]] | None, vocab_size: int
) -> list[list[int]]:
    """``SamplingParams.update_from_tokenizer``: each word without and (if it makes a new word) with a space."""
    if tokenize is None:
        raise RequestValidationError("bad_words needs the server's tokenizer, which is not available.", "bad_words")
    out: list[list[int]] = []
    for bad_word in bad_words:
        for add_prefix_space in (False, True):
            prompt = (" " if add_prefix_space else "") + bad_word.lstrip()
            ids = list(tokenize(prompt))
            if not ids:
                if not add_prefix_space:
                    raise RequestValidationError("bad_words entries must tokenize to at least one token.", "bad_words")
                continue
            if not add_prefix_space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
                if len(out) > MAX_BAD_WORDS:
                    raise RequestValidationError(
                        f"Too many bad words after tokenization: {len(out)}. The max number is {MAX_BAD_WORDS}.",
                        "bad_words",
                    )
    invalid = [t for ids in out for t in ids if t < 0 or t >= vocab_size]
    if invalid:
        raise RequestValidationError(
            f"The model vocabulary size is {vocab_size}, but the following tokens were specified as bad: "
            f"{invalid}. All token id values should be integers satisfying: 0 <= token_id <= {vocab_size - 1}.",
            "bad_words",
        )
    return out
