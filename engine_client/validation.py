"""Check an ADD before it leaves: the engine validates while decoding, outside any try block.

A request the engine's decoder rejects (docs/engine-protocol.md#inputs-that-break-an-engine) kills
the engine's input thread silently, so everything `SamplingParams._verify_args` / `verify()` would refuse
is refused here first, with a ValueError. The server's sampling builder checks every request before this
(its result always passes), so a ValueError from here reaching the server is a bug of the server's: a logged 500.
"""

from __future__ import annotations

import marshal
import math
from typing import TypeGuard

from pyfront.engine_client.protocol import EngineCoreRequest, SamplingParams, StructuredOutputsParams

MAX_LOGPROBS = 20
"""vLLM's default `max_logprobs`."""
_INT64_MAX = 2**63 - 1
_KNOWN_BACKENDS = ("xgrammar", "guidance", "outlines", "lm-format-enforcer")


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


_INT32_MAX = 2**31 - 1


def _check_token_ids(name: str, ids: object) -> None:
    if not isinstance(ids, list):
        raise ValueError(f"{name} must be a list of non-negative int32 token ids")
    for t in ids:  # a loop, not all() over a generator: these lists are short and checked on every request
        if type(t) is not int or not 0 <= t <= _INT32_MAX:
            raise ValueError(f"{name} must be a list of non-negative int32 token ids")


def _check_prompt_ids(ids: object) -> None:
    """Every id an exact non-negative int32, at C speed: marshal v2 writes each such int as b"i" + 4 bytes."""
    if type(ids) is not list:
        raise ValueError("prompt_token_ids must be a list")
    n = len(ids)
    try:
        serialized = marshal.dumps(ids, 2)
    except ValueError:
        serialized = b""
    if len(serialized) != 5 + 5 * n or serialized[5::5] != b"i" * n or (n and min(ids) < 0):
        raise ValueError("prompt_token_ids must be a list of non-negative int32 token ids")


def _check_float(name: str, value: object, low: float, high: float, *, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}], got {value}")


_FLOAT_RANGES = (
    ("presence_penalty", -2.0, 2.0, False),
    ("frequency_penalty", -2.0, 2.0, False),
    ("repetition_penalty", 0.0, math.inf, True),
    ("temperature", 0.0, 2.0, False),
    ("top_p", 0.0, 1.0, True),
    ("min_p", 0.0, 1.0, False),
)
"""(field, low, high, low end open) of the float fields; the high end is closed, and a value must be finite."""


def _floats_plainly_valid(sp: SamplingParams) -> bool:
    """True when every float field is a ``float`` inside its range: the common case, in one expression.

    Every comparison here is one :func:`_check_float` makes, and a NaN or an infinity fails one of them (the one
    unbounded range is written open at both ends), so True implies every check passes. False only means the full
    checks run, one field at a time, and name the field that fails.
    """
    presence, frequency, repetition = sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty
    temperature, top_p, min_p = sp.temperature, sp.top_p, sp.min_p
    return (
        type(presence) is float
        and type(frequency) is float
        and type(repetition) is float
        and type(temperature) is float
        and type(top_p) is float
        and type(min_p) is float
        and -2.0 <= presence <= 2.0
        and -2.0 <= frequency <= 2.0
        and 0.0 < repetition < math.inf
        and 0.0 <= temperature <= 2.0
        and 0.0 < top_p <= 1.0
        and 0.0 <= min_p <= 1.0
    )


def _check_logprobs(name: str, value: object) -> None:
    if not _is_int(value) or value < -1 or value > MAX_LOGPROBS:
        raise ValueError(f"{name} must be -1 or between 0 and {MAX_LOGPROBS}, got {value!r}")


def validate_sampling_params(sp: SamplingParams) -> None:
    if sp.n != 1:
        raise ValueError("n must be 1 on the wire (the front end fans n > 1 out into child requests)")
    if not _floats_plainly_valid(sp):
        for name, low, high, low_open in _FLOAT_RANGES:
            _check_float(name, getattr(sp, name), low, high, low_open=low_open)
    top_k, max_tokens, min_tokens = sp.top_k, sp.max_tokens, sp.min_tokens
    if type(top_k) is not int or (top_k < 1 and top_k not in (0, -1)):
        raise ValueError(f"top_k must be 0, -1 (off) or at least 1, got {top_k!r}")
    if type(max_tokens) is not int or not 1 <= max_tokens <= _INT64_MAX:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if type(min_tokens) is not int or min_tokens < 0:
        raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
    if min_tokens > max_tokens:
        raise ValueError(f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})")
    if sp.logprobs is not None:
        _check_logprobs("logprobs", sp.logprobs)
    if sp.prompt_logprobs is not None:
        _check_logprobs("prompt_logprobs", sp.prompt_logprobs)
    if sp.seed is not None and (not _is_int(sp.seed) or not -(2**63) <= sp.seed <= _INT64_MAX):
        raise ValueError(f"seed must be a 64-bit int, got {sp.seed!r}")
    stop = sp.stop
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError("stop must be a non-empty string or a list of non-empty strings")
    if sp.stop_token_ids is not None:
        _check_token_ids("stop_token_ids", sp.stop_token_ids)
    if sp.all_stop_token_ids is not None:
        _check_token_ids("all_stop_token_ids", sp.all_stop_token_ids)
    if sp.allowed_token_ids is not None:
        _check_token_ids("allowed_token_ids", sp.allowed_token_ids)
    if sp.logprob_token_ids is not None:
        _check_token_ids("logprob_token_ids", sp.logprob_token_ids)
    if sp.allowed_token_ids is not None and not sp.allowed_token_ids:
        raise ValueError("allowed_token_ids must not be empty")
    if sp.eos_token_id is not None and (not _is_int(sp.eos_token_id) or sp.eos_token_id < 0):
        raise ValueError("eos_token_id must be a non-negative int")
    if sp.logit_bias is not None:
        for key, bias in sp.logit_bias.items():
            if not _is_int(key) or key < 0:
                raise ValueError(f"logit_bias keys must be token ids (ints), got {key!r}")
            _check_float(f"logit_bias[{key}]", bias, -100.0, 100.0)
    if sp.bad_words_token_ids is not None:
        for ids in sp.bad_words_token_ids:
            _check_token_ids("bad_words token ids", ids)
    if sp.structured_outputs is not None:
        validate_structured_outputs(sp.structured_outputs)


def validate_structured_outputs(so: StructuredOutputsParams) -> None:
    kinds = [
        name
        for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        if getattr(so, name) not in (None, False)
    ]
    if len(kinds) != 1:
        raise ValueError(
            f"structured outputs need exactly one of json, regex, choice, grammar, "
            f"json_object, structural_tag; got {kinds or 'none'}"
        )
    if so.backend not in _KNOWN_BACKENDS:
        raise ValueError(f"structured outputs backend must be resolved by the front end, got {so.backend!r}")


def validate_request(
    request: EngineCoreRequest, max_model_len: int, client_count: int, *, trusted: bool = False
) -> None:
    """ValueError for anything a 0.32 engine would choke on.

    `trusted=True`: the prompt ids come from a tokenizer (or were range-checked) and the sampling parameters
    were built and validated by the server (`pyfront.server.sampling`), so the linear per-id check and a second
    sampling check are skipped; the structural checks always run.
    """
    if not isinstance(request.request_id, str) or not request.request_id:
        raise ValueError("request_id must be a non-empty string")
    prompt = request.prompt_token_ids
    if prompt is None:
        raise ValueError("prompt_token_ids is required (prompt embeddings are not supported)")
    if not prompt:
        raise ValueError("the prompt must contain at least one token")
    if not trusted:
        _check_prompt_ids(prompt)
    if max_model_len and len(prompt) >= max_model_len:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the engines' max_model_len is {max_model_len}")
    if request.sampling_params is None:
        raise ValueError("sampling_params is required")
    if not trusted:
        validate_sampling_params(request.sampling_params)
    if request.cache_salt is not None and not isinstance(request.cache_salt, str):
        raise ValueError("cache_salt must be a string")
    if not 0 <= request.client_index < client_count:
        raise ValueError(f"client_index {request.client_index} is out of range")
    if request.mm_features or request.prompt_embeds is not None or request.pooling_params is not None:
        raise ValueError("multimodal, prompt-embedding and pooling requests are not supported")
