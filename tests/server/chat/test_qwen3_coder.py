"""The ``qwen3_coder`` tool-call parser (server/chat/parsers/qwen3_coder.py), against vLLM 0.32.

Two kinds of checks, as for Hermes in test_parsers.py:

* streaming any chunking of an output (a split at every index, one character at a time, one token
  at a time with the bundled Qwen3 tokenizer, random chunks and token groups) gives the same
  content and calls as the non-streaming parse, with OpenAI's delta shape and argument fragments
  that concatenate to valid JSON;
* the results are vLLM 0.32's: tests/data/qwen3-coder-vectors.json holds, for every output of the
  corpus, what vLLM's own ``Qwen3EngineToolParser`` returns non-streamed and streamed token by token
  (written by tools/real_engine/qwen3_coder_oracle.py, whose docstring has the command; this suite
  does not need vLLM). pyfront must equal vLLM's non-streamed result except in the cases listed
  in OURS_WHERE_DIFFERENT, each with its reason; where vLLM's own stream disagrees with its
  non-streamed result, pyfront gives the non-streamed result in both modes unless listed.

Content is compared stripped when there are calls: vLLM's non-streamed result strips content
around calls (``strip_content_whitespace_with_tools``) and its stream does not; pyfront follows
the tagged-format rules (whitespace-only text next to a call dropped, other content kept as
written), the same in both modes.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfront.engine_client.protocol import StructuredOutputsParams
from pyfront.server.chat.parsers import (
    TOOL_PARSER_CLASSES,
    HermesToolParser,
    OutputParser,
    Qwen3CoderToolParser,
    Qwen3ReasoningParser,
    ToolCallDelta,
    detect_tool_parser,
    get_tool_parser,
)
from pyfront.server.chat.parsers.qwen3_coder import coerce_value, schema_types
from pyfront.server.errors import RequestValidationError
from pyfront.server.generate.structured_outputs import resolve_structured_outputs

VECTORS = json.loads((Path(__file__).parents[2] / "data" / "qwen3-coder-vectors.json").read_text(encoding="utf-8"))
TOOLSETS: dict[str, list[dict[str, Any]] | None] = VECTORS["toolsets"]
CASES: dict[str, dict[str, Any]] = VECTORS["cases"]
TOOLS = TOOLSETS["typed"]

Calls = list[tuple[str, str]]
Result = tuple[str | None, Calls]

# Deliberate differences from vLLM 0.32's non-streamed result: (ours, why). "vLLM's stream" is what
# its extract_tool_calls_streaming sends (in the vectors file as vllm_stream).
OURS_WHERE_DIFFERENT: dict[str, tuple[Result, str]] = {
    "content_after": (
        ("\nDone.", [("get_weather", '{"city": "Paris", "days": 3}')]),
        "text after a call is content (vLLM's stream keeps it; its non-streamed result drops all text after the "
        "first call)",
    ),
    "content_between": (
        ("\nand\n", [("get_weather", '{"city": "Paris", "days": 3}'), ("get_weather", '{"city": "Rome"}')]),
        "text between calls is content (as vLLM's stream; its non-streamed result drops it)",
    ),
    "function_end_in_value": (
        (None, [("run_code", '{"code": "a"}')]),
        "a value the function ends in (no </parameter>) keeps what was read (vLLM: the parameter is dropped; "
        'its stream: the invalid \'{"code": "a\')',
    ),
    "missing_param_end": (
        (None, [("get_weather", '{"city": "Paris"}')]),
        'a value without </parameter> before </function> is kept (vLLM: dropped; its stream: \'{"city": "Paris\')',
    ),
    "cut_in_value": (
        (None, [("get_weather", '{"city": "Par"}')]),
        "output cut off in a value: the value so far, closed into valid JSON (vLLM: dropped; its stream: the "
        'invalid \'{"city": "Par\')',
    ),
    "cut_in_typed_value": (
        (None, [("typed", '{"i": 4}')]),
        "the same for a converted value: converted as it stands (vLLM: dropped; its stream: '{\"i\": ')",
    ),
    "missing_function_end_then_call": (
        (None, [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')]),
        "</tool_call> ends a call missing </function>, so the next block is the next call (vLLM reads the rest "
        "of the output as this call's arguments: one call, the second city overwriting the first)",
    ),
    "repeated_param": (
        (None, [("get_weather", '{"city": "Paris", "days": 1, "city": "Rome"}')]),
        "a repeated parameter is written again (a stream cannot move a value it sent); read by any "
        "last-duplicate-wins JSON parser it is vLLM's {'city': 'Rome', 'days': 1}, keys in the same order",
    ),
    "typed_nulls": (
        (None, [("typed", '{"sn": null, "nul": null, "s": "null", "sn": "text"}')]),
        "a repeated parameter, as repeated_param (json.loads gives vLLM's object)",
    ),
    "cut_in_function_name": (
        ("<tool_call>\n<function=get_wea", []),
        "a function name is complete only at its '>': one cut off is no call, so the block is content (vLLM: a "
        "call named 'get_wea')",
    ),
    "cut_after_tool_start": (
        ("Hi <tool_call>", []),
        "a block that names no function is content, tags included (vLLM drops it)",
    ),
    "hermes_json_in_block": (
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', []),
        "the same: a block that names no function is content (vLLM drops it)",
    ),
    "think_tags_in_content": (
        ("a <think>b</think> c\n", [("get_weather", '{"city": "Paris", "days": 3}')]),
        "</think> in content is the reasoning parser's business: pyfront's qwen3 reasoning parser drops a second "
        "</think> from the content, as vLLM's composed parser does (see test_parsers.py, think_in_content); the "
        "tool parser alone keeps it, as vLLM's does when no reasoning parser is configured",
    ),
    "empty_function_name": (
        ("<tool_call>\n<function=>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>", []),
        "the same: an empty name names no function (vLLM drops the block)",
    ),
}


# -- helpers --------------------------------------------------------------------------------


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def parser(tools: Sequence[Any] | None = TOOLS) -> Qwen3CoderToolParser:
    return Qwen3CoderToolParser(tools=tools, id_factory=counter_ids())


def check_tool_deltas(deltas: Iterable[ToolCallDelta]) -> list[tuple[str, str]]:
    """Assert OpenAI's delta shape; return (name, concatenated arguments) per call."""
    calls: list[list[str]] = []
    for delta in deltas:
        if delta.index == len(calls):
            assert delta.id and delta.type == "function" and delta.name, delta
            assert delta.arguments == "", delta
            calls.append([delta.name, ""])
        else:
            assert delta.index < len(calls), delta
            assert delta.id is None and delta.type is None and delta.name is None, delta
            assert delta.arguments, delta
            calls[delta.index][1] += delta.arguments
    return [(n, a) for n, a in calls]


def stream_result(p: Qwen3CoderToolParser, pieces: Sequence[str]) -> Result:
    stream = p.stream()
    content: list[str] = []
    deltas: list[ToolCallDelta] = []
    for step in [*(stream.feed(piece) for piece in pieces), stream.finish()]:
        content.append(step.content)
        deltas.extend(step.tool_calls)
    calls = check_tool_deltas(deltas)
    for _name, arguments in calls:
        json.loads(arguments)
    result = stream.result()
    assert result.content == ("".join(content) or None)
    assert [(c.name, c.arguments_json) for c in result.calls] == calls
    return result.content, calls


def parse_result(p: Qwen3CoderToolParser, text: str) -> Result:
    parsed = p.parse(text)
    for call in parsed.calls:
        json.loads(call.arguments_json)
    return parsed.content, [(c.name, c.arguments_json) for c in parsed.calls]


def vllm_result(case: str, key: str = "vllm") -> Result:
    r = CASES[case][key]
    return r["content"], [(name, arguments) for name, arguments in r["calls"]]


def comparable(result: Result) -> tuple[str | None, list[tuple[str, Any]]]:
    """Content stripped when there are calls (see the module docstring); arguments as JSON values."""
    content, calls = result
    if calls and content is not None:
        content = content.strip() or None
    values: list[tuple[str, Any]] = []
    for name, arguments in calls:
        try:
            values.append((name, json.loads(arguments)))
        except ValueError:  # vLLM's stream sends invalid JSON in some cases
            values.append((name, ("invalid JSON", arguments)))
    return content, values


def case_parser(case: str) -> Qwen3CoderToolParser:
    return parser(TOOLSETS[CASES[case]["tools"]])


@cache
def ours(case: str) -> Result:
    """pyfront's non-streamed result (pinned against vLLM by test_matches_vllm)."""
    return parse_result(case_parser(case), CASES[case]["text"])


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer

    return AutoTokenizer.from_pretrained(str(ensure_qwen3_tokenizer()), local_files_only=True)


def token_pieces(text: str) -> list[str]:
    """The text as an incremental detokenizer streams it, one token at a time."""
    tok = tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    pieces: list[str] = []
    previous = ""
    for i in range(1, len(ids) + 1):
        current = tok.decode(ids[:i])
        if current.endswith("\ufffd") and i < len(ids):
            continue
        pieces.append(current[len(previous) :])
        previous = current
    assert "".join(pieces) == text
    return pieces


# -- registry and template detection ---------------------------------------------------------


def test_registry() -> None:
    assert get_tool_parser("qwen3_coder") is Qwen3CoderToolParser
    assert get_tool_parser("qwen3_xml") is Qwen3CoderToolParser
    assert TOOL_PARSER_CLASSES.index(Qwen3CoderToolParser) < TOOL_PARSER_CLASSES.index(HermesToolParser)
    assert Qwen3CoderToolParser.structural_tag_model == "qwen_3_coder"
    with pytest.raises(ValueError, match=r"known: auto, hermes, qwen3_coder, qwen3_json, qwen3_xml$"):
        get_tool_parser("mistral")


# Excerpts of the tool-call parts of the official chat templates.
QWEN3_CODER_TEMPLATE = """{%- for tool in tools %}
{{- "\\n<function>\\n<name>" ~ tool.name ~ "</name>" }}{{- '"name"' }}
{%- endfor %}
{%- for tool_call in message.tool_calls %}
{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
{%- for args_name, args_value in tool_call.arguments|items %}
{{- '<parameter=' + args_name + '>\\n' }}{{- args_value }}{{- '\\n</parameter>\\n' }}
{%- endfor %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}"""
QWEN3_5_TEMPLATE = QWEN3_CODER_TEMPLATE.replace("{{- '\"name\"' }}", "")


def test_template_detection() -> None:
    assert detect_tool_parser(QWEN3_CODER_TEMPLATE) is Qwen3CoderToolParser
    assert detect_tool_parser(QWEN3_5_TEMPLATE) is Qwen3CoderToolParser
    assert HermesToolParser.matches_template(QWEN3_CODER_TEMPLATE)  # why ours is tried first
    template = json.loads((Path(str(_tokenizer_dir())) / "tokenizer_config.json").read_text())["chat_template"]
    assert detect_tool_parser(template) is HermesToolParser  # Qwen3's own template writes JSON calls
    assert not Qwen3CoderToolParser.matches_template(template)


def _tokenizer_dir() -> Path:
    from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer

    return Path(ensure_qwen3_tokenizer())


# -- against vLLM ------------------------------------------------------------------------------


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert VECTORS["vllm"].startswith("0.32")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_vllm(case: str) -> None:
    ours = parse_result(case_parser(case), CASES[case]["text"])
    vllm, vllm_stream = comparable(vllm_result(case)), comparable(vllm_result(case, "vllm_stream"))
    if case in OURS_WHERE_DIFFERENT:
        assert ours == OURS_WHERE_DIFFERENT[case][0]
        listed_but_same = comparable(ours) == vllm and ours[1] == vllm_result(case)[1]
        assert not listed_but_same, f"{case} is listed as different but is vLLM's result"
    else:
        assert comparable(ours) == vllm
        # byte-equal arguments: json.dumps(arguments, ensure_ascii=False), as vLLM writes them
        assert ours[1] == vllm_result(case)[1]
    if vllm == vllm_stream:
        assert comparable(ours) == vllm or case in OURS_WHERE_DIFFERENT


def test_vllm_stream_disagreements_are_known() -> None:
    """Where vLLM's stream differs from its non-streamed result (the cases pyfront cannot be both)."""
    disagree = {c for c in CASES if comparable(vllm_result(c)) != comparable(vllm_result(c, "vllm_stream"))}
    assert disagree == {
        "content_after",  # its stream keeps text after calls
        "content_between",
        "spaced_open_in_value",  # its stream stops at a tag its lexer does not know
        "spaced_close",
        "function_end_in_value",  # unterminated values: its stream sent them, then stops
        "missing_param_end",
        "cut_in_value",
        "cut_in_typed_value",
        "missing_function_end_then_call",
        "typed_nulls",  # repeated parameters: its stream cannot rewrite the first
        "repeated_param",
        "spaced_function_name",  # its stream sends the name unstripped
    }
    # where we equal neither of vLLM's answers: only listed cases
    for case in disagree:
        ours = comparable(parse_result(case_parser(case), CASES[case]["text"]))
        if ours != comparable(vllm_result(case)):
            assert case in OURS_WHERE_DIFFERENT


# -- streaming equals non-streaming -----------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_stream_single_split_at_every_index(case: str) -> None:
    text = CASES[case]["text"]
    step = 1 if len(text) < 500 else 7
    for i in range(0, len(text) + 1, step):
        assert stream_result(case_parser(case), [text[:i], text[i:]]) == ours(case), i


@pytest.mark.parametrize("case", list(CASES))
def test_stream_character_by_character(case: str) -> None:
    assert stream_result(case_parser(case), list(CASES[case]["text"])) == ours(case)


@pytest.mark.parametrize("case", list(CASES))
def test_stream_token_by_token(case: str) -> None:
    assert stream_result(case_parser(case), token_pieces(CASES[case]["text"])) == ours(case)


def test_tags_are_single_tokens() -> None:
    tok = tokenizer()
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(list(CASES)), cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=25))
def test_stream_random_chunks(case: str, cuts: list[int]) -> None:
    text = CASES[case]["text"]
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert stream_result(case_parser(case), pieces) == ours(case)


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(list(CASES)), seed=st.integers(0, 2**32 - 1))
def test_stream_random_token_groups(case: str, seed: int) -> None:
    tokens = token_pieces(CASES[case]["text"])
    rng = random.Random(seed)
    pieces: list[str] = []
    i = 0
    while i < len(tokens):
        n = rng.randint(1, 6)
        pieces.append("".join(tokens[i : i + n]))
        i += n
    assert stream_result(case_parser(case), pieces) == ours(case)


PARTS = [
    "<tool_call>",
    "</tool_call>",
    "\n",
    "text ",
    "<function=get_weather>",
    "<function=typed>",
    "<function=",
    "</function>",
    "<parameter=city>",
    "<parameter=i>",
    "<parameter=o>",
    "< parameter =",
    "</parameter>",
    "</ parameter >",
    "</param",
    "<",
    ">",
    "5",
    '{"k": [1, "<"]}',
    'é\\"',
    " ",
]


def test_parse_and_stream_agree_on_generated_outputs() -> None:
    """Random mixtures of tags, fragments of tags and text: parse == stream, every chunking."""
    rng = random.Random(4321)
    for _ in range(600):
        text = "".join(rng.choice(PARTS) for _ in range(rng.randint(0, 16)))
        tools = TOOLS if rng.random() < 0.7 else None
        want = parse_result(parser(tools), text)
        for pieces in (list(text), [text[: len(text) // 2], text[len(text) // 2 :]]):
            assert stream_result(parser(tools), pieces) == want, text
        bounds = sorted({0, len(text), *(rng.randint(0, len(text)) for _ in range(5))})
        assert stream_result(parser(tools), [text[a:b] for a, b in itertools.pairwise(bounds)]) == want, text


# -- with the qwen3 reasoning parser ------------------------------------------------------------------


def pipeline() -> OutputParser:
    return OutputParser(Qwen3ReasoningParser(starts_in_reasoning=True), parser())


W = CASES["one_call"]["text"]
PIPELINE_CASES = {
    "after_thinking": "<think>\nI need the weather.\n</think>\n\n" + W,
    "two_after_thinking": "<think>\nx\n</think>\n\nChecking.\n" + W + "\n" + W,
    "unclosed_thinking_with_call": "<think>\nI should call it.\n" + W,
    "call_in_closed_thinking": "<think>\nmaybe " + W + "\n</think>\n\nNo call.",
}


def _pipeline_stream(pieces: Sequence[str]) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    stream = pipeline().stream()
    deltas: list[ToolCallDelta] = []
    for step in [*(stream.feed(piece) for piece in pieces), stream.finish()]:
        deltas.extend(step.tool_calls)
    calls = check_tool_deltas(deltas)
    result = stream.result()
    return result.reasoning, result.content, calls


def _pipeline_parse(text: str) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    parsed = pipeline().parse(text)
    return parsed.reasoning, parsed.content, [(c.name, c.arguments_json) for c in parsed.calls]


def test_pipeline_calls_after_thinking() -> None:
    call = ("get_weather", '{"city": "Paris", "days": 3}')
    assert _pipeline_parse(PIPELINE_CASES["after_thinking"]) == ("\nI need the weather.\n", None, [call])
    assert _pipeline_parse(PIPELINE_CASES["two_after_thinking"]) == ("\nx\n", "\n\nChecking.\n", [call, call])


@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_pipeline_stream_equals_parse(case: str) -> None:
    """Whatever the reasoning parser makes of a <tool_call> in unclosed thinking, both modes agree."""
    text = PIPELINE_CASES[case]
    want = _pipeline_parse(text)
    for i in range(len(text) + 1):
        assert _pipeline_stream([text[:i], text[i:]]) == want, i
    assert _pipeline_stream(list(text)) == want
    assert _pipeline_stream(token_pieces(text)) == want


# -- streaming behaviour ---------------------------------------------------------------------------


def _feed_all(p: Qwen3CoderToolParser, pieces: Sequence[str]) -> list[tuple[str, list[dict[str, Any]]]]:
    stream = p.stream()
    out = []
    for piece in pieces:
        step = stream.feed(piece)
        out.append((step.content, [d.to_openai() for d in step.tool_calls]))
    return out


def test_string_values_stream_and_typed_values_come_whole() -> None:
    steps = _feed_all(
        parser(),
        [
            "<tool_call>\n<function=get_weather>",
            "\n<parameter=city>\nPa",
            "ris\n",
            "</parameter>\n<parameter=days>\n1",
            "2\n</parameter>\n",
            "</function>",
        ],
    )
    args = [[d["function"].get("arguments") for d in deltas] for _content, deltas in steps]
    assert steps[0][1][0]["function"] == {"name": "get_weather", "arguments": ""}  # the call begins at ">"
    assert args[1] == ['{"city": "Pa']  # a string streams as it comes
    assert args[2] == ["ris"]  # its last newline is held: it may be the wrapping one
    assert args[3] == ['", "days": ']  # an integer waits for its </parameter>
    assert args[4] == ["12"]
    assert args[5] == ["}"]


def test_escaping_and_unicode_stream_per_character() -> None:
    value = '"q"\\\t日本😀</'
    text = f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{value}\n</parameter>\n</function>\n</tool_call>"
    want = (None, [("get_weather", json.dumps({"city": value}, ensure_ascii=False))])
    assert parse_result(parser(), text) == want
    assert stream_result(parser(), list(text)) == want


def test_without_tools_every_value_is_a_string() -> None:
    text = CASES["typed_basic"]["text"]
    ((_name, arguments),) = parse_result(parser(None), text)[1]
    assert all(isinstance(v, str) for v in json.loads(arguments).values())
    assert parse_result(parser([{"type": "function", "function": {"name": "typed"}}]), text)[1][0][1] == arguments


def test_long_values_are_linear() -> None:
    value = ("a < b </para > \n" * 5000) + "x"
    text = f"<tool_call>\n<function=run_code>\n<parameter=code>\n{value}\n</parameter>\n</function>\n</tool_call>"
    start = time.perf_counter()
    content, calls = stream_result(parser(), list(text))
    elapsed = time.perf_counter() - start
    assert content is None and json.loads(calls[0][1]) == {"code": value}
    assert elapsed < 10, elapsed  # ~85k characters one at a time


def test_whitespace_in_tags_is_unbounded_but_read_once() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nA<" + " " * 20000 + "/parameter>\n</function>"
    start = time.perf_counter()
    assert stream_result(parser(), list(text)) == (None, [("get_weather", '{"city": "A"}')])
    assert time.perf_counter() - start < 10


# -- values by schema -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "text", "value"),
    [
        ({"type": "integer"}, " 5 ", 5),
        ({"type": "integer"}, "5.5", 5.5),  # not an integer: read as JSON
        ({"type": "integer"}, '"x"', "x"),
        ({"type": "integer"}, "abc", "abc"),
        ({"type": "number"}, "5.0", 5),
        ({"type": "number"}, "1e400", "1e400"),
        ({"type": "number"}, "nan", "nan"),
        ({"type": "boolean"}, " TRUE ", True),
        ({"type": "boolean"}, "0", False),
        ({"type": "boolean"}, "yes", "yes"),
        ({"type": "null"}, "Null", None),
        ({"type": "null"}, " null", None),  # not "null" unstripped, but JSON null
        ({"type": "null"}, "None", "None"),
        ({"type": ["string", "null"]}, "null", None),
        ({"type": "object"}, "[1]", [1]),
        ({"type": "array"}, "[1e999]", "[1e999]"),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "7", 7),
        ({"anyOf": [{"type": "integer"}, {"$ref": "#/x"}]}, "x", "x"),
        ({"enum": [1, 2]}, "2", 2),
        ({"enum": ["a", None]}, "null", None),
        ({"type": "LONG"}, "9", 9),
        ({"type": "whatever"}, "[1, 2]", [1, 2]),
        ({}, "5", "5"),
    ],
)
def test_coerce_value(schema: dict[str, Any], text: str, value: Any) -> None:
    result = coerce_value(text, schema_types(schema))
    assert result == value and type(result) is type(value)


# -- structural tags ---------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(VECTORS["structural_tags"]))
def test_structural_tag_matches_vllm(config: str) -> None:
    c = VECTORS["structural_tags"][config]
    tag = Qwen3CoderToolParser.structural_tag(c["tools"], c["tool_choice"], c["parallel_tool_calls"], c["strict_level"])
    assert (json.dumps(tag) if tag is not None else None) == c["structural_tag"]
    if tag is not None:  # pyfront's structured-outputs check accepts it, for xgrammar
        assert resolve_structured_outputs(StructuredOutputsParams(structural_tag=json.dumps(tag))).backend == "xgrammar"


def test_structural_tag_errors() -> None:
    tools = VECTORS["structural_tags"]["named"]["tools"]
    with pytest.raises(RequestValidationError, match="has not been passed"):
        Qwen3CoderToolParser.structural_tag(tools, {"type": "function", "function": {"name": "nope"}})
    assert Qwen3CoderToolParser.structural_tag(None, "required") is None
