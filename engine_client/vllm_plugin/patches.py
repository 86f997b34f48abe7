"""The attribute swaps that give a stock vLLM engine FEH's engine side; no vLLM file is changed.

Installed by `install` after the layout guard (`layout.problems`) found the running vLLM to be the checked
layout. Each swap keeps vLLM's behaviour for everything FEH does not touch:

1. `vllm.v1.engine.core.EngineCoreRequest` becomes a msgspec subclass with one more trailing field (index
   22, typed `Any`). The input thread builds its ADD decoder from that module global when it starts, which
   is after the plugin loads. 22-element requests still decode (the field defaults to None); the field is
   untyped because a typed field that fails to decode raises inside the input thread and kills it. The
   value is validated here instead (`FehState.judge`).
2. `EngineCoreProc._make_ready_response` returns a dataclass subclass of `EngineCoreReadyResponse` with
   `native_frontend_hash_config`, only when this engine's hashing is what feh1 computes (`advertisable`).
   Stock front ends ignore the extra key.
3. `Request.from_engine_core_request` seeds a request's block hashes from a usable blob: `Request.__init__`
   calls its block hasher once, for the prompt; a `SeededHasher` answers that call with the shipped hashes
   and hands every later call (generated tokens) to the engine's own hasher, which chains from the last
   shipped hash exactly as it would from its own.
4. In salt mode feh1, salted requests get a copy of vLLM's `request_block_hasher` (made once, when the
   engine advertises) whose global `generate_block_hash_extra_keys` turns the tagged `(("cache_salt", s),)`
   into feh1's `(s,)`; unsalted requests keep the engine's own hasher (the rewrite would change nothing).
   Only that copy sees the change: the KV-event and offload code call their own, unchanged binding and
   keep the tagged form their consumers parse.
5. `EngineCore.pyfront_feh_stats` returns the counters (a utility method: the front end calls it by name).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import types
from typing import Any

import msgspec

from pyfront.engine_client.negotiation import ADVERTISEMENT_KEY, feh_eligible
from pyfront.engine_client.protocol import NativeFrontendHashConfig
from pyfront.engine_client.vllm_plugin.layout import FEH_FIELD, inner_function_code, problems, read_layout
from pyfront.engine_client.vllm_plugin.state import FehState, Hasher, SaltMode
from pyfront.hashing import ALGORITHM, HashConfig
from pyfront.hashing.config import DIGEST_SIZE

logger = logging.getLogger("vllm.pyfront_feh")

STATS_METHOD = "pyfront_feh_stats"
"""The utility method that returns the counters (`EngineClient.call_utility("pyfront_feh_stats")`)."""


class SeededHasher:
    """A one-shot block hasher: the shipped hashes for `Request.__init__`'s call, then the engine's own.

    `Request.__init__` calls its hasher exactly once, for the full blocks of the prompt (the layout guard
    checked that it calls update_block_hashes); that call gets the shipped list, which `FehState.judge`
    checked holds one hash per full prompt block. Every later call comes after generated tokens were
    appended, and vLLM's hasher starts at `len(request.block_hashes)` blocks, chaining from the last hash:
    the shipped hashes therefore stand exactly where the engine's own would.
    """

    __slots__ = ("_hasher", "_seed")

    def __init__(self, hashes: list[bytes], hasher: Hasher) -> None:
        self._seed: list[bytes] | None = hashes
        self._hasher = hasher

    def __call__(self, request: Any) -> list[bytes]:
        seed = self._seed
        if seed is None:
            return self._hasher(request)
        self._seed = None
        return seed


def feh1_salted(hasher: types.FunctionType) -> types.FunctionType:
    """A copy of vLLM's request hasher whose salt key on block 0 is feh1's untagged `(salt,)`.

    Only requests whose block-0 extra keys are exactly the salt are rewritten: those are the text prompts
    feh1 covers. LoRA, multimodal and prompt-embedding requests keep vLLM's tagged keys (they never carry
    shipped hashes, so they need only be consistent with themselves). The copy gets a snapshot of the
    module's globals with one name replaced; the guard checked that the hasher reads only functions from
    them, so the snapshot cannot go stale (NONE_HASH is read by hash_block_tokens from the live module).
    """
    stock_extra_keys = hasher.__globals__["generate_block_hash_extra_keys"]

    def generate_block_hash_extra_keys(
        request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        keys, next_mm_idx = stock_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
        if keys is not None and len(keys) == 1 and keys[0][0] == "cache_salt":
            return (keys[0][1],), next_mm_idx
        return keys, next_mm_idx

    overlay = dict(hasher.__globals__)
    overlay["generate_block_hash_extra_keys"] = generate_block_hash_extra_keys
    return types.FunctionType(hasher.__code__, overlay, hasher.__name__, hasher.__defaults__, hasher.__closure__)


def advertisable(engine: Any, stock_hasher_code: types.CodeType) -> tuple[HashConfig | None, str]:
    """The feh1 config this engine hashes with, or None and why it cannot advertise one.

    The facts come from what the engine will actually use: the block size and hash function are read from
    its request hasher's closure (not recomputed from the config), NONE_HASH from kv_cache_utils after the
    engine initialised it.
    """
    import vllm.v1.core.kv_cache_utils as kv_cache_utils
    from vllm.utils.hashing import sha256

    cache_config = engine.vllm_config.cache_config
    if not cache_config.enable_prefix_caching:
        return None, "prefix caching is off"
    if cache_config.prefix_caching_hash_algo != "sha256":
        return None, f"prefix_caching_hash_algo is {cache_config.prefix_caching_hash_algo!r}; feh1 needs 'sha256'"
    if pickle.HIGHEST_PROTOCOL != 5:
        return None, f"vLLM's sha256 pickles with protocol {pickle.HIGHEST_PROTOCOL}; feh1 is protocol 5"
    if engine.vllm_config.kv_transfer_config is not None:
        return None, "a KV connector is configured; the plugin was checked without one"
    hasher = engine.request_block_hasher
    if not isinstance(hasher, types.FunctionType) or hasher.__code__ is not stock_hasher_code:
        return None, f"the engine's block hasher {hasher!r} is not vLLM's request_block_hasher"
    cells = dict(zip(hasher.__code__.co_freevars, (c.cell_contents for c in hasher.__closure__ or ()), strict=True))
    if cells.get("caching_hash_fn") is not sha256:
        return None, f"the engine hashes blocks with {cells.get('caching_hash_fn')!r}, not vLLM's sha256"
    block_size = cells.get("hash_block_size")
    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    if not isinstance(none_hash, bytes) or len(none_hash) != DIGEST_SIZE:
        return None, f"NONE_HASH is {none_hash!r}, not {DIGEST_SIZE} bytes"
    try:
        return HashConfig(ALGORITHM, block_size, none_hash), "ok"  # type: ignore[arg-type]  # HashConfig checks it
    except ValueError as exc:
        return None, str(exc)


def install(state: FehState) -> list[str]:
    """Swap the five attributes if the guard allows; returns the guard's problems (then nothing was swapped)."""
    import vllm.v1.engine as engine
    import vllm.v1.engine.core as core
    from vllm.v1.request import Request

    layout = read_layout(STATS_METHOD)
    found = problems(layout)
    if found:
        return [f"vLLM {layout.vllm_version}: {problem}" for problem in found]

    stock_hasher_code = inner_function_code(core.get_request_block_hasher)
    assert stock_hasher_code is not None  # the guard checked

    # Everything is built first and assigned at the end, so a failure while building leaves vLLM untouched.
    # 1. The ADD decoder's type.
    feh_request_cls = msgspec.defstruct(
        "FehEngineCoreRequest", [(FEH_FIELD, Any, None)], bases=(engine.EngineCoreRequest,), module=__name__
    )

    # 2. The registration.
    ready_cls = engine.EngineCoreReadyResponse
    feh_ready_cls = dataclasses.make_dataclass(
        "FehEngineCoreReadyResponse", [(ADVERTISEMENT_KEY, Any, dataclasses.field(default=None))], bases=(ready_cls,)
    )
    stock_make_ready = core.EngineCoreProc._make_ready_response

    def _make_ready_response(self: Any) -> Any:
        response = stock_make_ready(self)
        # This runs in the input thread, where an exception would end the thread and so the engine: a
        # surprise while deciding means "advertise nothing", never a dead engine.
        salted: tuple[Hasher, Hasher] | None = None
        try:
            config, reason = advertisable(self, stock_hasher_code)
            if config is not None and state.settings.salt_mode is SaltMode.FEH1:
                salted = (self.request_block_hasher, feh1_salted(self.request_block_hasher))
        except Exception as exc:
            logger.exception("FEH: deciding the advertisement failed")
            config, reason = None, f"deciding the advertisement failed: {exc!r}"
        if config is None:
            state.stay_inactive(reason)
            logger.info("FEH: this engine advertises no native_frontend_hash_config: %s", reason)
            return response
        state.activate(config, salted)
        logger.info(
            "FEH: advertising %s (salt mode %s, verifying the first blob and %.2g%% of the rest); utility %s has "
            "the counters",
            config.describe(),
            state.settings.salt_mode.value,
            100 * state.settings.verify_fraction,
            STATS_METHOD,
        )
        values = {f.name: getattr(response, f.name) for f in dataclasses.fields(response)}
        return feh_ready_cls(**values, **{ADVERTISEMENT_KEY: NativeFrontendHashConfig.from_hash_config(config)})

    # 3. Seeding a request's block hashes.
    stock_from_request = Request.__dict__["from_engine_core_request"].__func__

    def from_engine_core_request(cls: type, request: Any, block_hasher: Hasher | None) -> Any:
        blob = getattr(request, FEH_FIELD, None)
        if block_hasher is None:  # no prefix caching and no connector: nothing is hashed, FEH is inactive
            state.judge(blob, 0, eligible=False, salted=False)  # counts an unexpected blob as "inactive"
            return stock_from_request(cls, request, None)
        salted = bool(request.cache_salt)
        block_hasher = state.hasher_for(block_hasher, salted)
        prompt = request.prompt_token_ids
        verdict = state.judge(blob, len(prompt) if prompt is not None else 0, feh_eligible(request), salted)
        if verdict.hashes is not None and not verdict.verify:
            req = stock_from_request(cls, request, SeededHasher(verdict.hashes, block_hasher))
            state.record_used(len(verdict.hashes))
            return req
        req = stock_from_request(cls, request, block_hasher)
        if verdict.hashes is None:
            state.record_engine_hashed(len(req.block_hashes))
        else:
            state.record_verified(request.request_id, verdict.hashes, req.block_hashes)
        return req

    # 4 is made in _make_ready_response (the engine's hasher exists only by then) and picked by
    # state.hasher_for above. 5. The counters.
    def pyfront_feh_stats(self: Any) -> dict[str, Any]:
        """FEH's counters and state on this engine (pyfront.engine_client.vllm_plugin)."""
        return state.snapshot()

    core.EngineCoreRequest = feh_request_cls
    core.EngineCoreProc._make_ready_response = _make_ready_response
    Request.from_engine_core_request = classmethod(from_engine_core_request)
    setattr(core.EngineCore, STATS_METHOD, pyfront_feh_stats)
    return []
