"""pyfront.server.openai_types: decoding, vLLM-compatible request validation, error messages and params."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfront.server.errors import RequestValidationError
from pyfront.server.openai.decode import (
    decode_chat_request,
    decode_completion_request,
    decode_detokenize_request,
    decode_tokenize_request,
)
from pyfront.server.openai.schema import chat_request_json_schema, completion_request_json_schema, openapi_components
from pyfront.server.openai.types import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    completion_prompts,
    message_text,
)
from pyfront.server.openai.validate import merged_structured_outputs, parse_logit_bias

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return decode_chat_request(json.dumps({"messages": MESSAGES, **fields}).encode())


def completion(**fields: Any) -> CompletionRequest:
    return decode_completion_request(json.dumps({"prompt": "hello", **fields}).encode())


def chat_error(**fields: Any) -> RequestValidationError:
    with pytest.raises(RequestValidationError) as info:
        chat(**fields)
    return info.value


def completion_error(**fields: Any) -> RequestValidationError:
    with pytest.raises(RequestValidationError) as info:
        completion(**fields)
    return info.value


# --------------------------------------------------------------------------------------
# Decoding basics
# --------------------------------------------------------------------------------------


def test_minimal_chat_request_resolves_defaults() -> None:
    r = chat()
    assert r.messages[0].role == "user" and r.messages[0].content == "hi"
    assert r.n == 1 and r.top_logprobs == 0 and r.logprobs is False
    assert r.tool_choice == "none" and r.add_generation_prompt is True
    assert r.max_tokens is None and r.max_completion_tokens is None
    assert r.stream is False and r.stop is None and r.skip_special_tokens is True


def test_minimal_completion_request_defaults() -> None:
    r = completion()
    assert r.prompt == "hello" and r.max_tokens == 16 and r.n == 1 and r.add_special_tokens is True
    assert completion(max_tokens=None).max_tokens == 16  # vLLM's normalize_null_max_tokens


def test_unknown_fields_are_ignored() -> None:
    r = chat(
        foo={"bar": [1, 2]},
        best_of=3,
        guided_decoding_backend="outlines",
        kv_transfer_params={"x": 1},
        mm_processor_kwargs={},
        messages=[{"role": "user", "content": "x", "unknown": 1}],
    )
    assert r.messages[0].content == "x"
    assert completion(best_of=5, something_else=None).n == 1


def test_lenient_scalars_like_pydantic_lax_mode() -> None:
    assert chat(max_tokens="5").max_tokens == 5
    assert chat(max_tokens=5.0).max_tokens == 5
    assert chat(temperature="0.5").temperature == 0.5
    assert chat(temperature=1).temperature == 1.0 and type(chat(temperature=1).temperature) is float
    assert chat(stream="true").stream is True
    assert chat(logprobs=1, top_logprobs=2).logprobs is True
    e = chat_error(max_tokens=5.5)
    assert e.param == "max_tokens" and "expected int" in e.message


def test_null_means_unset() -> None:
    r = chat(temperature=None, top_logprobs=None, n=None, stop=None, frequency_penalty=None)
    assert r.temperature is None and r.top_logprobs == 0 and r.n == 1


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{x", None, "not valid JSON"),
        (b"", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b"{}", "messages", "Missing required parameter: 'messages'"),
        (b'{"messages": [{"content": "a"}]}', "messages[0].role", "Missing required parameter"),
        (b'{"messages": "hi"}', "messages", "Invalid type for 'messages'"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content", "Invalid type"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}',
            "messages[0].content[0].text",
            "",
        ),
        (b'{"messages": [{"role": "user"}], "max_tokens": "x"}', "max_tokens", "expected int | null, got str"),
        (b'{"messages": [{"role": "user"}], "stop": 5}', "stop", "Invalid type for 'stop'"),
        (b'{"messages": [{"role": "user"}], "logit_bias": {"1": "a"}}', "logit_bias", "Invalid type for 'logit_bias'"),
        (b'{"messages": [{"role": "user"}], "tool_choice": "sometimes"}', "tool_choice", "Invalid enum value"),
        (b'{"messages": [{"role": "user"}], "response_format": {"type": "xml"}}', "response_format.type", "Invalid"),
        (b'{"messages": [{"role": "user"}], "temperature": 1e400}', "temperature", "out of range"),
    ],
)
def test_malformed_bodies_name_the_field(body: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(RequestValidationError) as info:
        decode_chat_request(body)
    assert info.value.param == param
    assert fragment in info.value.message
    assert info.value.status_code == 400


def test_error_body_shape() -> None:
    e = chat_error(temperature=3)
    assert e.to_dict() == {
        "error": {
            "message": "temperature must be in [0, 2], got 3.0.",
            "type": "BadRequestError",
            "param": "temperature",
            "code": 400,
        }
    }
    assert isinstance(e, ValueError)


# --------------------------------------------------------------------------------------
# Request-level validation (vLLM's pydantic validators and the request-only _verify_args checks)
# --------------------------------------------------------------------------------------

CHAT_ERRORS = [
    ({"temperature": 3}, "temperature", "temperature must be in [0, 2], got 3.0."),
    ({"temperature": -0.1}, "temperature", "temperature must be non-negative, got -0.1."),
    ({"temperature": "nan"}, "temperature", "temperature must be a finite number, got nan."),
    ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
    ({"top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5."),
    ({"top_k": -2}, "top_k", "top_k must be 0 (disable), or at least 1, got -2."),
    ({"min_p": 1.5}, "min_p", "min_p must be in [0, 1], got 1.5."),
    ({"presence_penalty": 3}, "presence_penalty", "presence_penalty must be in [-2, 2], got 3.0."),
    ({"frequency_penalty": -2.5}, "frequency_penalty", "frequency_penalty must be in [-2, 2], got -2.5."),
    ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be greater than zero, got 0.0."),
    ({"repetition_penalty": "inf"}, "repetition_penalty", "repetition_penalty must be a finite number, got inf."),
    ({"n": 0}, "n", "n must be at least 1, got 0."),
    ({"n": 20000}, "n", "n must be at most 16384, got 20000."),
    ({"max_tokens": -1}, "max_tokens", "max_tokens must be at least 1, got -1."),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
    ({"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens", "max_tokens must be at least 1, got 0."),
    ({"min_tokens": -1}, "min_tokens", "min_tokens must be greater than or equal to 0, got -1."),
    ({"seed": 2**63}, "seed", "seed must be a 64-bit signed integer"),
    ({"priority": -(2**63) - 1}, "priority", "priority must be a 64-bit signed integer"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "stop may contain at most 4 strings, got 5."),
    ({"stop": ["a", ""]}, "stop", "stop cannot contain an empty string."),
    ({"stop": ""}, "stop", "stop cannot contain an empty string."),
    ({"bad_words": ["x", ""]}, "bad_words", "bad_words cannot contain an empty string. Got bad_words=['x', '']"),
    ({"top_logprobs": 5}, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."),
    ({"top_logprobs": -2, "logprobs": True}, "top_logprobs", "`top_logprobs` must be a positive value or -1."),
    (
        {"top_logprobs": 21, "logprobs": True},
        "top_logprobs",
        "Requested sample logprobs of 21, which is greater than max allowed: 20",
    ),
    (
        {"logprob_token_ids": [1]},
        "logprob_token_ids",
        "when using `logprob_token_ids`, `logprobs` must be set to true.",
    ),
    (
        {"prompt_logprobs": 2, "stream": True},
        "prompt_logprobs",
        "`prompt_logprobs` are not available when `stream=True`.",
    ),
    ({"prompt_logprobs": -3}, "prompt_logprobs", "`prompt_logprobs` must be a positive value or -1."),
    (
        {"prompt_logprobs": 21},
        "prompt_logprobs",
        "Requested prompt logprobs of 21, which is greater than max allowed: 20",
    ),
    (
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "Stream options can only be defined when `stream=True`.",
    ),
    ({"stream_options": {"include_usage": False}}, "stream_options", "Stream options can only be defined"),
    ({"logit_bias": {"a": 1, "5": 2}}, "logit_bias", "cannot be converted to integer token IDs: ['a']"),
    ({"cache_salt": ""}, "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided."),
    ({"cache_salt": "a@b"}, "cache_salt", "must be at most 128 characters and must not contain"),
    ({"cache_salt": "x" * 129}, "cache_salt", "must be at most 128 characters"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or a non-negative"),
    ({"stream_interval": 0}, "stream_interval", "stream_interval must be at least 1, got 0."),
    ({"stream_interval": 2**64}, "stream_interval", "stream_interval must be a 64-bit signed integer"),
    ({"top_k": 2**63}, "top_k", "top_k must be a 64-bit integer"),
    ({"min_tokens": 2**63}, "min_tokens", "min_tokens must be a 64-bit signed integer"),
    ({"routed_experts_prompt_start": -1}, "routed_experts_prompt_start", "must be non-negative"),
    ({"thinking_token_budget": -5}, "thinking_token_budget", "must be a non-negative integer or -1"),
    ({"vllm_xargs": {"a": 2**64}}, "vllm_xargs", "extra_args integers must be between -2**63 and 2**64 - 1."),
    ({"repetition_detection": {"max_pattern_size": 3}}, "repetition_detection", "min_count must be >= 2"),
    ({"repetition_detection": {"min_pattern_size": 2}}, "repetition_detection", "max_pattern_size, min_pattern_size"),
    ({"use_beam_search": True}, "use_beam_search", "Beam search is not supported"),
    ({"tools": []}, "tools", "`tools` must not be an empty array."),
    ({"tool_choice": "auto"}, "tool_choice", "When using `tool_choice`, `tools` must be set."),
    (
        {"continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
    ),
    ({"chat_template": "{{ x }}"}, "chat_template", "--trust-request-chat-template is not set"),
    (
        {"chat_template_kwargs": {"chat_template": "x"}},
        "chat_template",
        "Refused request with untrusted chat template.",
    ),
    ({"messages": []}, "messages", "messages must contain at least one message."),
    ({"messages": [{"role": ""}]}, "messages[0].role", "non-empty string"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0].type",
        "Only text content parts are supported, got type 'image_url'.",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "Missing"),
    (
        {"response_format": {"type": "json_schema"}},
        "response_format",
        "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema.name",
        "",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
        "You must use one kind of structured outputs constraint but none are specified.",
    ),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "Invalid response_format structural_tag"),
    ({"structured_outputs": {}}, "structured_outputs", "You must use one kind of structured outputs constraint"),
    (
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        "structured_outputs",
        "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
    ),
    (
        {"structured_outputs": {"regex": "a", "grammar": 'root ::= "a"'}},
        "structured_outputs",
        "You can only use one kind of structured outputs constraint but multiple are specified",
    ),
    (
        {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
        "structured_outputs",
        "multiple are specified: ['regex', 'json_object']",
    ),
    (
        {"structured_outputs": {"structural_tag": "not json"}},
        "structured_outputs",
        "Invalid structured_outputs structural_tag",
    ),
    (
        {"structured_outputs": {"structural_tag": "{}"}},
        "structured_outputs",
        "Invalid structured_outputs structural_tag",
    ),
]


@pytest.mark.parametrize(("fields", "param", "message"), CHAT_ERRORS)
def test_chat_validation_errors(fields: dict[str, Any], param: str, message: str) -> None:
    e = chat_error(**fields)
    assert e.param == param
    assert message in e.message


COMPLETION_ERRORS = [
    ({"prompt": ""}, "prompt", "Either prompt or prompt_embeds must be provided and non-empty."),
    ({"prompt": None}, "prompt", "Either prompt or prompt_embeds must be provided and non-empty."),
    ({"prompt": []}, "prompt", "prompt must not be an empty list."),
    ({"prompt": [1, "a"]}, "prompt[1]", "prompt must be a string, a list of strings"),
    ({"prompt": [[1], 2]}, "prompt[1]", "prompt must be a string"),
    ({"prompt": [-1]}, "prompt[0]", "non-negative"),
    ({"prompt": [[0], []]}, "prompt[1]", "must not be empty"),
    ({"prompt": [[0, -5]]}, "prompt[0]", "non-negative"),
    ({"prompt": ["a", ""]}, "prompt[1]", "must not be empty"),
    ({"prompt": ["a"] * 1025}, "prompt", "prompt list length 1025 exceeds the maximum allowed count of 1024."),
    ({"prompt": [{"a": 1}]}, "prompt[0]", "Invalid type"),
    ({"prompt_embeds": "AAAA"}, "prompt_embeds", "prompt_embeds are not supported"),
    ({"suffix": "x"}, "suffix", "suffix is only supported for models with FIM completion rendering"),
    ({"suffix": "x", "echo": True}, "suffix", "Echo is unsupported with suffix."),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
    ({"max_tokens": -3, "echo": True}, "max_tokens", "max_tokens must be at least 1, got -3."),
    ({"n": None}, "n", "Invalid type for 'n'"),
    ({"logprobs": -2}, "logprobs", "`logprobs` must be a positive value or -1."),
    ({"logprobs": 21}, "logprobs", "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"logprobs": True}, "logprobs", "Invalid type"),
    ({"logprob_token_ids": [3]}, "logprob_token_ids", "when using `logprob_token_ids`, `logprobs` must be set."),
    (
        {"logprob_token_ids": [3], "logprobs": 1, "echo": True, "max_tokens": 0},
        "logprob_token_ids",
        "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0`",
    ),
    ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2], got 2.5."),
]


@pytest.mark.parametrize(("fields", "param", "message"), COMPLETION_ERRORS)
def test_completion_validation_errors(fields: dict[str, Any], param: str, message: str) -> None:
    e = completion_error(**fields)
    assert e.param == param
    assert message in e.message


def test_accepted_edge_values() -> None:
    assert chat(stream_options={}).stream_options is not None  # vLLM tests the raw dict's truthiness
    assert chat(stream=True, stream_options={"include_usage": True}).stream_options.include_usage is True
    assert not chat(stream=True, stream_options={}).stream_options.include_usage  # UNSET is falsy
    assert chat(seed=-(2**63)).seed == -(2**63)
    assert chat(top_k=-1).top_k == -1
    assert chat(logprobs=True, top_logprobs=-1).top_logprobs == -1  # refused later, against the vocabulary
    assert chat(logprobs=True, top_logprobs=50, logprob_token_ids=[1]).top_logprobs == 50
    assert chat(continue_final_message=True).add_generation_prompt is True  # default, not "both set"
    assert chat(continue_final_message=True, add_generation_prompt=False).add_generation_prompt is False
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {"enable_thinking": False}
    allowed = decode_chat_request(
        json.dumps({"messages": MESSAGES, "chat_template": "{{ x }}"}).encode(), allow_request_chat_template=True
    )
    assert allowed.chat_template == "{{ x }}"
    assert completion(max_tokens=0, echo=True).max_tokens == 0
    assert completion(logprobs=-1).logprobs == -1  # refused later, against the vocabulary
    assert chat(thinking_token_budget=-1).thinking_token_budget == -1


def test_messages_roles_parts_tools_and_reasoning() -> None:
    r = chat(
        messages=[
            {"role": "system", "content": "s"},
            {"role": "developer", "content": [{"type": "text", "text": "d1"}, {"type": "input_text", "text": "d2"}]},
            {"role": "user", "content": "u", "name": "bob"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "thinking",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "ipython", "content": "custom roles are allowed"},
        ]
    )
    assert [m.role for m in r.messages] == ["system", "developer", "user", "assistant", "tool", "ipython"]
    assert message_text(r.messages[1]) == "d1\nd2"
    assert message_text(r.messages[0]) == "s" and message_text(r.messages[3]) is None
    assistant = r.messages[3]
    assert assistant.reasoning == "thinking"  # deprecated spelling copied over
    assert assistant.tool_calls[0].function.arguments == '{"a": 1}'
    assert r.messages[4].tool_call_id == "c1" and r.messages[2].name == "bob"
    both = chat(messages=[{"role": "assistant", "content": "x", "reasoning": "a", "reasoning_content": "b"}])
    assert both.messages[0].reasoning == "a"


def test_tools_and_tool_choice() -> None:
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
    assert chat(tools=tools).tool_choice == "auto"
    assert chat(tools=tools, tool_choice="required").tool_choice == "required"
    assert chat(tools=tools, tool_choice="none").tool_choice == "none"
    assert chat(tool_choice="none").tool_choice == "none"
    named = chat(tools=tools, tool_choice={"type": "function", "function": {"name": "get"}}).tool_choice
    assert isinstance(named, NamedToolChoice) and named.function.name == "get"
    e = chat_error(tools=tools, tool_choice={"type": "function", "function": {"name": "other"}})
    assert e.param == "tool_choice" and "does not match any of the specified `tools`" in e.message
    e = chat_error(
        tools=tools, tool_choice={"type": "function", "function": {"name": "get"}}, structured_outputs={"regex": "a"}
    )
    assert e.message == "You can only either use constraints for structured outputs or tools, not both."
    e = chat_error(tools=[{"type": "retrieval", "function": {"name": "x"}}])
    assert e.param == "tools[0].type"
    assert chat(tools=tools, parallel_tool_calls=False).parallel_tool_calls is False


def test_parse_logit_bias() -> None:
    assert parse_logit_bias({"5": 1.5, " 7": -200.0, "9": 1e300, "1_0": 3}) == {5: 1.5, 7: -100.0, 9: 100.0, 10: 3.0}
    assert parse_logit_bias({}) == {}
    with pytest.raises(RequestValidationError) as info:
        parse_logit_bias({"a": 1.0, "b": 2.0, "3": 1.0})
    assert info.value.param == "logit_bias" and "['a', 'b']" in info.value.message
    with pytest.raises(RequestValidationError):
        parse_logit_bias({"1": float("nan")})
    assert chat(logit_bias={"5": "inf"}).logit_bias == {"5": float("inf")}  # clamped when building params


def test_completion_prompt_forms() -> None:
    assert completion_prompts(completion(prompt="a")) == ["a"]
    assert completion_prompts(completion(prompt=["a", "b"])) == ["a", "b"]
    assert completion_prompts(completion(prompt=[1, 2, 3])) == [[1, 2, 3]]
    assert completion_prompts(completion(prompt=[[1], [2, 3]])) == [[1], [2, 3]]
    assert len(completion_prompts(completion(prompt=list(range(2000))))[0]) == 2000  # token lists are not capped


def test_merged_structured_outputs() -> None:
    assert merged_structured_outputs(chat()) is None
    assert merged_structured_outputs(chat(response_format={"type": "text"})) is None
    so = merged_structured_outputs(chat(response_format={"type": "json_object"}))
    assert so is not None and so.json_object is True
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    so = merged_structured_outputs(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    )
    assert so is not None and so.json == schema
    e = chat_error(structured_outputs={"json": {"type": "string"}}, response_format={"type": "json_object"})
    assert "multiple are specified" in e.message
    # response_format json_schema replaces structured_outputs.json, keeping the other options (dataclass replace)
    so = merged_structured_outputs(
        chat(
            structured_outputs={"json": {"type": "string"}, "disable_any_whitespace": True},
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )
    )
    assert so is not None and so.json == schema and so.disable_any_whitespace is True
    tag = merged_structured_outputs(
        chat(
            response_format={
                "type": "structural_tag",
                "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}],
                "triggers": ["<a"],
            }
        )
    )
    assert tag is not None
    assert tag.structural_tag == (
        '{"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}], '
        '"triggers": ["<a"]}'
    )
    tag = merged_structured_outputs(
        chat(response_format={"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})
    )
    assert (
        tag is not None
        and tag.structural_tag == '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}'
    )


def test_legacy_guided_fields_are_honoured() -> None:
    so = merged_structured_outputs(completion(guided_json={"type": "object"}, guided_whitespace_pattern=r"\s*"))
    assert so is not None and so.json == {"type": "object"} and so.whitespace_pattern == r"\s*"
    so = merged_structured_outputs(chat(guided_choice=["a", "b"]))
    assert so is not None and so.choice == ["a", "b"]
    so = merged_structured_outputs(chat(guided_regex="x+", structured_outputs={"grammar": 'root ::= "a"'}))
    assert so is not None and so.grammar is not None and so.regex is None  # structured_outputs wins
    e = chat_error(guided_regex="a", guided_choice=["a"])
    assert e.param == "guided_regex" and "multiple are specified: ['regex', 'choice']" in e.message
    e = chat_error(guided_json={"type": "object"}, response_format={"type": "json_object"})
    assert e.param == "guided_json"


def test_json_schemas_for_openapi() -> None:
    chat_schema = chat_request_json_schema()
    defs = chat_schema["$defs"]
    props = defs["ChatCompletionRequest"]["properties"]
    assert {
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "logit_bias",
        "response_format",
        "structured_outputs",
    } <= set(props)
    assert defs["ChatCompletionRequest"]["required"] == ["messages"]
    assert "ChatMessage" in defs and "ResponseFormat" in defs
    comp = completion_request_json_schema()["$defs"]["CompletionRequest"]["properties"]
    assert {"prompt", "echo", "logprobs", "suffix", "max_tokens"} <= set(comp)
    json.dumps(chat_schema)  # JSON-serialisable for FastAPI's openapi()
    assert chat_request_json_schema() is chat_schema  # cached


def test_openapi_components() -> None:
    components = openapi_components()
    assert {"ChatCompletionRequest", "CompletionRequest", "TokenizeRequest", "DetokenizeRequest", "ChatMessage"} <= set(
        components
    )
    text = json.dumps(components)
    assert '"$ref": "#/components/schemas/ChatMessage"' in text and "#/$defs/" not in text


def test_tokenize_and_detokenize_requests() -> None:
    r = decode_tokenize_request(b'{"prompt": "hi"}')
    assert r.prompt == "hi" and r.messages is None and r.add_special_tokens is True and r.return_token_strs is False
    r = decode_tokenize_request(b'{"messages": [{"role": "user", "content": "x"}], "return_token_strs": true}')
    assert r.add_special_tokens is False and r.add_generation_prompt is True and r.return_token_strs is True
    r = decode_tokenize_request(b'{"prompt": "hi", "add_special_tokens": false}')
    assert r.add_special_tokens is False
    for body, param in (
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "user"}], "continue_final_message": true, "add_generation_prompt": true}',
         "continue_final_message"),
        (b'{"messages": [{"role": "user"}], "chat_template": "x"}', "chat_template"),
        (b'{"prompt": 5}', "prompt"),
    ):  # fmt: skip
        with pytest.raises(RequestValidationError) as info:
            decode_tokenize_request(body)
        assert info.value.param == param
    trusted = decode_tokenize_request(b'{"prompt": "a", "chat_template": "x"}', allow_request_chat_template=True)
    assert trusted.chat_template == "x"
    assert decode_detokenize_request(b'{"tokens": [1, 2, 3], "model": "m"}').tokens == [1, 2, 3]
    for body, param in ((b'{"tokens": [1, -1]}', "tokens[1]"), (b"{}", "tokens"), (b'{"tokens": ["a"]}', "tokens[0]")):
        with pytest.raises(RequestValidationError) as info:
            decode_detokenize_request(body)
        assert info.value.param == param


# --------------------------------------------------------------------------------------
# Property: decoding never fails with anything but RequestValidationError
# --------------------------------------------------------------------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
_field_names = st.sampled_from(
    sorted(
        {f.encode_name for f in msgspec.structs.fields(ChatCompletionRequest)}
        | {f.encode_name for f in msgspec.structs.fields(CompletionRequest)}
    )
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(_field_names, _json_values, max_size=6),
    kind=st.sampled_from(["chat", "completion"]),
    raw=st.binary(max_size=40),
)
def test_decoding_only_raises_request_validation_error(fields: dict[str, Any], kind: str, raw: bytes) -> None:
    decode = decode_chat_request if kind == "chat" else decode_completion_request
    base = {"messages": MESSAGES} if kind == "chat" else {"prompt": "x"}
    for body in (json.dumps({**base, **fields}).encode(), raw):
        try:
            decode(body)
        except RequestValidationError as exc:
            assert exc.message
