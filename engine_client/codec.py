"""msgpack codec and ZMQ framing of vLLM's EngineCore protocol, for both sides.

:class:`Encoder` / :class:`Decoder` mirror vLLM's ``MsgpackEncoder`` / ``MsgpackDecoder``
(``vllm/v1/serial_utils.py``) for what a text front end needs:

* encoding returns a list of frames ``[payload, aux_1, ...]``; an array (:class:`WireTensor`)
  of at least ``size_threshold`` bytes (vLLM's ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``, default
  256) becomes its own frame and the payload holds its frame index; smaller ones are inline
  as msgpack ext type 3. ``bytes`` values are always inline (msgpack bin), as in vLLM.
* decoding takes the frame list and resolves both forms back into a :class:`WireTensor`
  (zero-copy for aux frames). Ext types 1 and 2 (pickle / cloudpickle) are rejected.

On top of those, the message-level functions build and parse what each socket carries
(docs/engine-protocol.md#framing): the front end uses ``encode_add`` / ``encode_abort`` /
``encode_utility`` / ``decode_outputs`` / ``decode_handshake`` / ``decode_ready_response`` /
``encode_init``; a mock engine uses the mirror images ``decode_input`` / ``decode_request`` /
``encode_outputs`` / ``encode_handshake`` / ``encode_ready_response`` / ``decode_init``.
Type frames and identities are bytes; the socket layer adds/strips the ROUTER identity.

Encoders and decoders keep the aux-frame list of the call in progress in a thread-local, so
the module-level instances below are safe to share between threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
from msgspec import msgpack

from pyfront.engine_client.protocol import (
    ENGINE_CORE_DEAD,
    REQUEST_TYPE_ABORT,
    REQUEST_TYPE_ADD,
    REQUEST_TYPE_START_DP_WAVE,
    REQUEST_TYPE_UTILITY,
    STOCK_REQUEST_FIELDS,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineHandshakeMessage,
    EngineHandshakeMetadata,
    StartDpWave,
    UtilityCall,
    WireTensor,
)

__all__ = [
    "CUSTOM_TYPE_CLOUDPICKLE",
    "CUSTOM_TYPE_PICKLE",
    "CUSTOM_TYPE_RAW_VIEW",
    "DEFAULT_ZERO_COPY_THRESHOLD",
    "Buffer",
    "Decoder",
    "Encoder",
    "EngineCoreDeadError",
    "EngineInput",
    "decode_handshake",
    "decode_init",
    "decode_input",
    "decode_outputs",
    "decode_ready_response",
    "decode_request",
    "encode_abort",
    "encode_add",
    "encode_handshake",
    "encode_init",
    "encode_outputs",
    "encode_ready_response",
    "encode_utility",
    "is_engine_core_dead",
]

CUSTOM_TYPE_PICKLE = 1
"""vLLM ext code for pickled objects; only with VLLM_ALLOW_INSECURE_SERIALIZATION, rejected here."""
CUSTOM_TYPE_CLOUDPICKLE = 2
"""vLLM ext code for cloudpickled functions; rejected here."""
CUSTOM_TYPE_RAW_VIEW = 3
"""vLLM ext code for the raw bytes of a small array (inline tensor data)."""

DEFAULT_ZERO_COPY_THRESHOLD = 256
"""vLLM's default VLLM_MSGPACK_ZERO_COPY_THRESHOLD: arrays this big or bigger go to aux frames."""

Buffer = bytes | bytearray | memoryview
"""A frame: anything with the buffer protocol (zmq.Frame works too)."""

T = TypeVar("T")


class EngineCoreDeadError(RuntimeError):
    """The engine sent ``ENGINE_CORE_DEAD``: it hit a fatal error and is exiting."""


class Encoder:
    """vLLM ``MsgpackEncoder`` semantics: ``encode(obj) -> [payload, aux_1, ...]``.

    Only :class:`WireTensor` needs the hook; every other value is plain msgspec. Aux buffers
    are appended in encode (depth-first) order, so index 1 is the first array met, exactly as
    vLLM numbers them.
    """

    def __init__(self, size_threshold: int = DEFAULT_ZERO_COPY_THRESHOLD) -> None:
        self.size_threshold = size_threshold
        self._encoder = msgpack.Encoder(enc_hook=self._enc_hook)
        self._local = threading.local()

    def encode(self, obj: Any) -> list[Buffer]:
        """Frames for ``obj``: the msgpack payload followed by any aux buffers."""
        bufs: list[Buffer] = [b""]
        local = self._local
        local.aux = bufs
        try:
            bufs[0] = self._encoder.encode(obj)
        finally:
            local.aux = None
        return bufs

    def encode_into(self, obj: Any, buf: bytearray) -> list[Buffer]:
        """Like :meth:`encode`, writing the payload into ``buf`` (which becomes frame 0)."""
        bufs: list[Buffer] = [buf]
        local = self._local
        local.aux = bufs
        try:
            self._encoder.encode_into(obj, buf)
        finally:
            local.aux = None
        return bufs

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, WireTensor):
            data = obj.data
            # vLLM: ndarrays inline when 0-d or nbytes < threshold; tensors when nbytes <
            # threshold. A 0-d array is at most 16 bytes, so one rule covers both.
            if not obj.shape or memoryview(data).nbytes < self.size_threshold:
                return obj.dtype, obj.shape, msgpack.Ext(CUSTOM_TYPE_RAW_VIEW, data)
            aux = self._local.aux
            if aux is None:  # pragma: no cover - only reachable by calling the hook directly
                raise RuntimeError("WireTensor encoded outside Encoder.encode")
            aux.append(data)
            return obj.dtype, obj.shape, len(aux) - 1
        raise TypeError(f"cannot encode {type(obj).__qualname__} on the engine wire")


class _DecodeContext(threading.local):
    aux: Sequence[Buffer] = ()


_EMPTY: tuple[Buffer, ...] = ()


class Decoder(Generic[T]):
    """vLLM ``MsgpackDecoder`` semantics: ``decode(frames)`` with aux frames for tensors.

    ``frames`` is ``[payload, aux_1, ...]`` (or a single buffer). Array data that is an int
    resolves to that frame (kept by reference, no copy); inline ext-3 data is copied out of the
    payload (it is under 256 bytes).
    """

    def __init__(self, type_: type[T] | Any = Any) -> None:
        self._ctx = _DecodeContext()
        self._decoder = msgpack.Decoder(type_, dec_hook=self._dec_hook, ext_hook=_ext_hook)

    def decode(self, frames: Sequence[Buffer] | Buffer) -> T:
        """Decode one message; raises ``msgspec.DecodeError``/``ValidationError`` when malformed."""
        if isinstance(frames, bytes | bytearray | memoryview):
            return self._decoder.decode(frames)
        if len(frames) == 1:
            return self._decoder.decode(frames[0])
        ctx = self._ctx
        ctx.aux = frames
        try:
            return self._decoder.decode(frames[0])
        finally:
            ctx.aux = _EMPTY

    def _dec_hook(self, type_: type, obj: Any) -> Any:
        if type_ is WireTensor:
            if not isinstance(obj, list) or len(obj) != 3:
                raise ValueError("a tensor must be [dtype, shape, data]")
            dtype, shape, data = obj
            if not isinstance(dtype, str) or not isinstance(shape, list):
                raise ValueError("a tensor must be [dtype: str, shape: array, data]")
            if isinstance(data, int) and not isinstance(data, bool):
                aux = self._ctx.aux
                if not 0 < data < len(aux):
                    raise ValueError(f"tensor data refers to frame {data}, the message has {len(aux)} frames")
                data = aux[data]
            elif not isinstance(data, bytes):
                # A map here is vLLM's same-host multimodal tensor IPC, which a remote front
                # end can never resolve.
                raise ValueError(f"unsupported tensor data of type {type(data).__name__}")
            return WireTensor(dtype, shape, data)
        raise NotImplementedError(f"no decoder for {type_!r}")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == CUSTOM_TYPE_RAW_VIEW:
        return bytes(data)
    # Raised as DecodeError so callers handle every malformed message with one except clause.
    if code in (CUSTOM_TYPE_PICKLE, CUSTOM_TYPE_CLOUDPICKLE):
        raise msgspec.DecodeError("pickled payloads (msgpack ext 1/2) are refused")
    raise msgspec.DecodeError(f"unknown msgpack ext type {code}")


# --------------------------------------------------------------------------------------
# Message-level helpers. Module-level codecs: msgspec objects are thread-safe and ours keep
# per-call state in thread-locals.
# --------------------------------------------------------------------------------------

_ENCODER = Encoder()
_OUTPUTS_DECODER: Decoder[EngineCoreOutputs] = Decoder(EngineCoreOutputs)
_REQUEST_DECODER: Decoder[EngineCoreRequest] = Decoder(EngineCoreRequest)
_ABORT_DECODER: Decoder[list[str]] = Decoder(list[str])
_UTILITY_DECODER: Decoder[UtilityCall] = Decoder(UtilityCall)
_WAVE_DECODER: Decoder[StartDpWave] = Decoder(StartDpWave)
_HANDSHAKE_DECODER = msgpack.Decoder(EngineHandshakeMessage)
_INIT_DECODER = msgpack.Decoder(EngineHandshakeMetadata)
_READY_RESPONSE_DECODER = msgpack.Decoder(EngineCoreReadyResponse)
_PLAIN_ENCODER = msgpack.Encoder()

_FEH_HEADER = b"\xdc\x00" + bytes([STOCK_REQUEST_FIELDS + 1])
_NIL = 0xC0


# ---- front end -> engine (input socket) ------------------------------------------------


def encode_add(request: EngineCoreRequest, *, block_hashes: bool) -> list[Buffer]:
    """Frames ``[b"\\x00", payload, aux...]`` of an ADD (the socket layer prepends the identity).

    ``block_hashes=True`` (engine advertised a matching ``native_frontend_hash_config``) sends
    all 23 elements, ``prompt_block_hashes`` at index 22 (nil when the request has none).
    ``block_hashes=False`` sends exactly the 22 stock elements and never the hashes, as for an
    engine without FEH: a stock engine would ignore the extra element, but a fork engine that
    reads index 21/22 must not be handed hashes it did not ask for.
    """
    if block_hashes:
        return [REQUEST_TYPE_ADD, *_ENCODER.encode(request)]
    if request.prompt_block_hashes is not None:
        request = msgspec.structs.replace(request, prompt_block_hashes=None)
    payload = bytearray()
    frames = _ENCODER.encode_into(request, payload)
    # 23 elements always take an array16 header, and a nil last element is one 0xc0 byte:
    # rewriting the count and dropping that byte yields exactly msgspec's 22-element encoding.
    if payload[:3] != _FEH_HEADER or payload[-1] != _NIL:  # pragma: no cover - invariant
        raise AssertionError("unexpected EngineCoreRequest encoding")
    payload[2] = STOCK_REQUEST_FIELDS
    del payload[-1]
    return [REQUEST_TYPE_ADD, *frames]


def encode_abort(request_ids: Sequence[str]) -> list[Buffer]:
    """Frames ``[b"\\x01", payload]`` aborting these internal ids (no reply will come)."""
    return [REQUEST_TYPE_ABORT, _PLAIN_ENCODER.encode(list(request_ids))]


def encode_utility(client_index: int, call_id: int, method: str, args: Sequence[Any] = ()) -> list[Buffer]:
    """Frames ``[b"\\x03", payload]`` calling ``method(*args)`` on the engine.

    The reply arrives on ``outputs[client_index]`` as ``EngineCoreOutputs.utility_output``
    with this ``call_id``. Struct args (e.g. LoRARequest) are sent in their normal encoding.
    """
    return [REQUEST_TYPE_UTILITY, *_ENCODER.encode(UtilityCall(client_index, call_id, method, list(args)))]


class EngineInput(NamedTuple):
    """One decoded front-end -> engine message (engine side)."""

    request_type: bytes
    """One of the ``REQUEST_TYPE_*`` bytes."""
    message: EngineCoreRequest | list[str] | UtilityCall | StartDpWave
    """ADD -> EngineCoreRequest, ABORT -> list of ids, UTILITY -> UtilityCall, wave -> StartDpWave."""


def decode_request(frames: Sequence[Buffer] | Buffer) -> EngineCoreRequest:
    """An ADD payload ``[payload, aux...]`` (type frame already stripped) -> EngineCoreRequest.

    Accepts the stock 22 elements (``prompt_block_hashes`` is then None), pyfront's 23, and
    anything between 9 and 22 like vLLM; extra trailing elements are ignored.
    """
    return _REQUEST_DECODER.decode(frames)


def decode_input(frames: Sequence[Buffer]) -> EngineInput:
    """What an engine's input DEALER received, ``[type, payload, aux...]``, decoded by type.

    Raises ValueError for a type byte a front end must not send (a real engine's input thread
    dies on those, docs/engine-protocol.md#inputs-that-break-an-engine) and msgspec errors for malformed payloads.
    """
    if len(frames) < 2:
        raise ValueError(f"an input message has a type frame and a payload, got {len(frames)} frame(s)")
    kind = bytes(frames[0])
    body = frames[1:]
    if kind == REQUEST_TYPE_ADD:
        return EngineInput(kind, _REQUEST_DECODER.decode(body))
    if kind == REQUEST_TYPE_ABORT:
        return EngineInput(kind, _ABORT_DECODER.decode(body))
    if kind == REQUEST_TYPE_UTILITY:
        return EngineInput(kind, _UTILITY_DECODER.decode(body))
    if kind == REQUEST_TYPE_START_DP_WAVE:
        return EngineInput(kind, _WAVE_DECODER.decode(body))
    raise ValueError(f"unexpected request type frame {kind!r}")


# ---- engine -> front end (output socket) ----------------------------------------------


def encode_outputs(outputs: EngineCoreOutputs) -> list[Buffer]:
    """Frames ``[payload, aux...]`` of one EngineCoreOutputs (engine side)."""
    return _ENCODER.encode(outputs)


def is_engine_core_dead(frames: Sequence[Buffer]) -> bool:
    """True when ``frames`` is the single ``ENGINE_CORE_DEAD`` sentinel frame."""
    if len(frames) != 1:
        return False
    frame = frames[0]
    return len(frame) == len(ENGINE_CORE_DEAD) and bytes(frame) == ENGINE_CORE_DEAD


def decode_outputs(frames: Sequence[Buffer]) -> EngineCoreOutputs:
    """What the output PULL received, ``[payload, aux...]`` -> EngineCoreOutputs.

    Raises :class:`EngineCoreDeadError` for the ``ENGINE_CORE_DEAD`` sentinel (it is not
    msgpack). Newer engines' extra trailing elements and unknown stats keys are ignored.
    """
    if is_engine_core_dead(frames):
        raise EngineCoreDeadError("engine sent ENGINE_CORE_DEAD")
    return _OUTPUTS_DECODER.decode(frames)


# ---- handshake and registration ---------------------------------------------------------


def encode_handshake(message: EngineHandshakeMessage) -> bytes:
    """HELLO/READY payload (engine side)."""
    return _PLAIN_ENCODER.encode(message)


def decode_handshake(payload: Buffer) -> EngineHandshakeMessage:
    """HELLO/READY payload (front end side; the ROUTER identity is the previous frame)."""
    return _HANDSHAKE_DECODER.decode(payload)


def encode_init(metadata: EngineHandshakeMetadata) -> bytes:
    """INIT payload, the front end's reply to HELLO."""
    return _PLAIN_ENCODER.encode(metadata)


def decode_init(payload: Buffer) -> EngineHandshakeMetadata:
    """INIT payload (engine side); unknown keys are ignored."""
    return _INIT_DECODER.decode(payload)


def encode_ready_response(response: EngineCoreReadyResponse) -> bytes:
    """Registration payload an engine sends first on each input socket."""
    return _PLAIN_ENCODER.encode(response)


def decode_ready_response(payload: Buffer) -> EngineCoreReadyResponse:
    """Registration payload (front end side); unknown keys ignored, the 17 required keys enforced."""
    return _READY_RESPONSE_DECODER.decode(payload)
