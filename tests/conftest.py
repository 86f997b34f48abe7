"""Shared test setup: the opt-in tiers, the repository paths, free ports and the fixtures several modules use."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.harness import Harness

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "tests" / "data"


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
    parser.addoption("--hostile", action="store_true", help="run the hostile-input tier (hand-written bad inputs)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = (("real_engine", "--real-engine"), ("soak", "--soak"), ("real_clients", "--real-clients"),
             ("hostile", "--hostile"))  # fmt: skip
    for marker, option in tiers:
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"opt-in tier: pass {option} to run")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def protocol_vectors() -> dict:
    return json.loads((DATA_DIR / "engine-protocol-vectors.json").read_text())


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    """monkeypatch for module-scoped fixtures (pytest's own is function-scoped)."""
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def harness(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Harness]:
    """pyfront and a mock engine for the module, with front-end hashing on (VLLM_NATIVE_FEH=1)."""
    from tests.harness import running_harness

    monkeypatch_module.setenv("VLLM_NATIVE_FEH", "1")
    with running_harness() as running:
        yield running


@pytest.fixture
def anyio_backend() -> str:
    """`pytest.mark.anyio` tests run on asyncio, the loop uvicorn and the engine client use."""
    return "asyncio"
