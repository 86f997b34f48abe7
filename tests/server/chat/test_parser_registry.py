"""The parser registry: names, aliases, --tool-call-parser auto, and what each format owns."""

from __future__ import annotations

import json
import logging

import pytest

from pyfront.server.app import resolve_tool_parser
from pyfront.server.chat.parsers import (
    AUTO_TOOL_PARSER,
    TOOL_PARSER_CLASSES,
    TOOL_PARSERS,
    HermesToolParser,
    detect_tool_parser,
    get_tool_parser,
)
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, QWEN3_CHAT_TEMPLATE
from pyfront.server.text.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    }
]


def test_names_come_from_the_classes() -> None:
    names = [name for cls in TOOL_PARSER_CLASSES for name in (cls.name, *cls.aliases)]
    assert len(names) == len(set(names)), "a name is claimed twice"
    assert set(TOOL_PARSERS) == set(names) and AUTO_TOOL_PARSER not in TOOL_PARSERS
    assert get_tool_parser("qwen3_json") is HermesToolParser


@pytest.mark.parametrize("cls", TOOL_PARSER_CLASSES, ids=lambda c: c.name)
def test_each_format_constrains_forced_choices(cls) -> None:
    # A format with a structural tag forces required / named with it; one without gets vLLM's JSON schema.
    if cls.structural_tag_model is None:
        return
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        tag = cls.structural_tag(TOOLS, choice, None)
        assert tag is not None and tag["type"] == "structural_tag"
        json.dumps(tag)
    assert cls.structural_tag(TOOLS, "none", None) is None
    assert cls(tools=TOOLS).tools == TOOLS


def test_auto_picks_hermes_for_the_qwen3_template() -> None:
    assert detect_tool_parser(QWEN3_CHAT_TEMPLATE) is HermesToolParser


@pytest.mark.parametrize("template", [None, "", "{% for m in messages %}{{ m.content }}{% endfor %}"])
def test_auto_refuses_a_template_it_cannot_read(template) -> None:
    with pytest.raises(ValueError, match="--tool-call-parser auto"):
        detect_tool_parser(template)


def test_auto_at_start_up_logs_its_pick(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = Tokenizer(BUNDLED_TOKENIZER_NAME)
    with caplog.at_level(logging.INFO, logger="pyfront.server"):
        assert resolve_tool_parser("auto", tokenizer) is HermesToolParser
    assert "--tool-call-parser auto" in caplog.text and "'hermes'" in caplog.text
    assert resolve_tool_parser(None, tokenizer) is None
    assert resolve_tool_parser("hermes", tokenizer) is HermesToolParser


def test_auto_without_a_usable_template_stops_the_start_up(tmp_path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    tokenizer = Tokenizer(BUNDLED_TOKENIZER_NAME, chat_template=str(template))
    with pytest.raises(SystemExit, match="pyfront: --tool-call-parser auto: the chat template renders tool calls"):
        resolve_tool_parser("auto", tokenizer)


def test_the_cli_accepts_auto() -> None:
    from pyfront.server.cli import build_parser, config_from_args

    config = config_from_args(
        build_parser().parse_args(["serve", "--tool-call-parser", "auto", "--enable-auto-tool-choice"])
    )
    assert config.tool_call_parser == "auto"
