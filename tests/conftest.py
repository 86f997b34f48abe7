"""Shared test setup: the opt-in tiers, the repository paths, free ports and the fixtures several modules use."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on every interface a moment ago (vLLM offsets a KV events
    endpoint's port by the DP rank, so rank r publishes on P + r)."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for offset in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("", base + offset))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        return base
    raise RuntimeError(f"no run of {count} free ports")


@functools.cache
def transformers_tokenizer(name: str) -> Any:
    """transformers' own load of a tokenizer (a bundled name or a directory), as the reference to compare with: a
    server's tokenizer may be the lean one (server/text/lean.py), which has no apply_chat_template of its own."""
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name

    return AutoTokenizer.from_pretrained(resolve_tokenizer_name(name), local_files_only=True)


OPT_IN_TIERS = {
    "real_engine": ("--real-engine", "run tests against a real vLLM engine"),
    "soak": ("--soak", "run the long soak tests"),
    "real_clients": ("--real-clients", "run third-party clients (openai SDK, lm-eval, guidellm)"),
    "chaos": ("--chaos", "run the chaos tier (engines and API servers killed)"),
    "fuzz": ("--fuzz", "run schemathesis against the POST routes (fuzz venv)"),
    "hostile": ("--hostile", "run the hostile-input tier (hand-written bad inputs)"),
    "docker_tier": ("--docker", "build docker/Dockerfile and run the image and compose.yaml (a Docker engine)"),
}
"""Each opt-in tier's marker: its command-line option and what it runs (markers are registered in pyproject)."""


def pytest_configure(config: pytest.Config) -> None:
    """Tokenizer snapshots (server/text/lean.py) go to a directory of this run's own, for the servers the tests start
    in-process and as subprocesses: the first server of a run loads its tokenizer with transformers and writes the
    snapshot, later ones load it lean, whatever earlier runs left in ~/.cache."""
    import os
    import tempfile

    if "PYFRONT_TOKENIZER_SNAPSHOT_DIR" not in os.environ:
        os.environ["PYFRONT_TOKENIZER_SNAPSHOT_DIR"] = tempfile.mkdtemp(prefix="pyfront-test-snapshots-")
        config.stash[_SNAPSHOT_DIR] = os.environ["PYFRONT_TOKENIZER_SNAPSHOT_DIR"]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if directory := config.stash.get(_SNAPSHOT_DIR, None):
        shutil.rmtree(directory, ignore_errors=True)


_SNAPSHOT_DIR = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    for option, help_text in OPT_IN_TIERS.values():
        parser.addoption(option, action="store_true", help=help_text)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, (option, _) in OPT_IN_TIERS.items():
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
