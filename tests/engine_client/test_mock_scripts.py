"""The mock engine's scripts: token-id lists as given, texts tokenized as the model would write them."""

from __future__ import annotations

import json

import pytest

from pyfront.engine_client.mock_engine import load_scripts, parse_args
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, ensure_qwen3_tokenizer

XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_id_lists_pass_through_and_texts_are_tokenized() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_qwen3_tokenizer())
    scripts = load_scripts([[1, 2, 3], XML_CALL], BUNDLED_TOKENIZER_NAME)
    assert scripts[0] == [1, 2, 3]
    assert tok.decode(scripts[1]) == XML_CALL
    # token by token: <tool_call> and </tool_call> are single tokens, as a Qwen model writes them
    assert scripts[1][0] == tok.convert_tokens_to_ids("<tool_call>")
    assert scripts[1][-1] == tok.convert_tokens_to_ids("</tool_call>")
    assert len(scripts[1]) > 10


def test_a_text_needs_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="needs --tokenizer"):
        load_scripts(["hello"], None)


def test_script_file_with_texts(tmp_path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([XML_CALL, [7, 8]]))
    config = parse_args(
        ["--handshake-address", "tcp://127.0.0.1:1", "--tokenizer", BUNDLED_TOKENIZER_NAME, "--script-file", str(path)]
    )
    assert len(config.scripts) == 2 and list(config.scripts[1]) == [7, 8]
