"""Shared test setup: the project root on sys.path and the opt-in tiers."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the one helper every test file uses)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--real-engine", action="store_true", help="run tests against a real vLLM engine")
    parser.addoption("--soak", action="store_true", help="run the long soak tests")
    parser.addoption(
        "--real-clients", action="store_true", help="run third-party clients (openai SDK, lm-eval, guidellm)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, option in (("real_engine", "--real-engine"), ("soak", "--soak"), ("real_clients", "--real-clients")):
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"opt-in tier: pass {option} to run")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def protocol_vectors() -> dict:
    return json.loads((DATA_DIR / "engine-protocol-vectors.json").read_text())
