"""Settings from the CLI and from PYFRONT_* environment variables (the uvicorn --factory path)."""

from __future__ import annotations

import pytest

from pyfront.server.cli import build_parser, config_from_args, parse_args
from pyfront.server.config import ServerConfig


def test_from_env_parses_every_kind_of_field() -> None:
    config = ServerConfig.from_env(
        {
            "PYFRONT_MODEL": "/models/qwen",
            "PYFRONT_PORT": "9000",
            "PYFRONT_API_KEY": "a, b",
            "PYFRONT_MAX_MODEL_LEN": "4096",
            "PYFRONT_REQUEST_TIMEOUT": "2.5",
            "PYFRONT_MOCK_ENGINE": "true",
            "PYFRONT_DATA_PARALLEL_SIZE": "2",
        }
    )
    assert config.model == "/models/qwen" and config.port == 9000
    assert config.api_key == ["a", "b"]
    assert config.max_model_len == 4096 and config.request_timeout == 2.5
    assert config.mock_engine is True and config.data_parallel_size == 2
    assert ServerConfig.from_env({"VLLM_API_KEY": "k"}).api_key == ["k"]


def test_cli_maps_vllm_serve_flags() -> None:
    args = build_parser().parse_args(
        ["serve", "/m", "--port", "8001", "--api-key", "k1", "--served-model-name", "a", "b",
         "--data-parallel-size", "2", "--max-model-len", "1024", "--allowed-origins", "http://x"]
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.model, config.port, config.api_key) == ("/m", 8001, ["k1"])
    assert config.model_names == ["a", "b"] and config.data_parallel_size == 2
    assert config.max_model_len == 1024 and config.allowed_origins == ["http://x"]


def test_unknown_and_engine_side_flags_fail_fast(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["serve", "--no-such-flag"])
    assert "pyfront serve: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="configure\\(s\\) the engine"):
        config_from_args(build_parser().parse_args(["serve", "--tensor-parallel-size", "2"]))
