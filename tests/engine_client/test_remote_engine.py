"""An engine on another host: the mock engine in its own network namespace, reached over a veth pair.

The test makes the namespace and the veth pair itself and removes them after; it skips where it lacks
the rights (not root, no `ip`, no netns support). Addresses are the test's own, on its own link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port

FRONT_ADDR = "10.213.77.1"
ENGINE_ADDR = "10.213.77.2"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def engine_namespace():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"pf-{uuid.uuid4().hex[:6]}"
    host_if, ns_if = f"{name}-h", f"{name}-n"
    if _ip("netns", "add", name).returncode != 0:
        pytest.skip("cannot create network namespaces here")
    try:
        steps = [
            ("link", "add", host_if, "type", "veth", "peer", "name", ns_if),
            ("link", "set", ns_if, "netns", name),
            ("addr", "add", f"{FRONT_ADDR}/30", "dev", host_if),
            ("link", "set", host_if, "up"),
            ("-n", name, "addr", "add", f"{ENGINE_ADDR}/30", "dev", ns_if),
            ("-n", name, "link", "set", ns_if, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ]
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot set up the veth pair: ip {' '.join(step)}: {result.stderr.strip()}")
        yield name
    finally:
        _ip("link", "del", host_if)
        _ip("netns", "del", name)


def test_engine_in_another_namespace_over_tcp(engine_namespace, tmp_path) -> None:
    rpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "VLLM_NATIVE_FEH": "1"}
    engine_log = open(tmp_path / "engine.log", "w")  # noqa: SIM115
    server_log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    engine = subprocess.Popen(
        ["ip", "netns", "exec", engine_namespace, sys.executable, "-m", "pyfront.engine_client.mock_engine",
         "--handshake-address", f"tcp://{FRONT_ADDR}:{rpc_port}", "--ranks", "0", "--advertise-feh"],
        stdout=engine_log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--port", str(http_port),
         "--data-parallel-address", FRONT_ADDR, "--data-parallel-rpc-port", str(rpc_port)],
        stdout=server_log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and not ready:
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"{base}/ready", timeout=2).status_code == 200
            time.sleep(0.2)
        assert ready, (tmp_path / "server.log").read_text()[-2000:] + (tmp_path / "engine.log").read_text()[-2000:]
        health = httpx.get(f"{base}/health").json()
        assert "prompts are hashed by pyfront" in health["front_end_block_hashing"]
        prompt = "the engine runs on another host and this prompt is long enough to be hashed by pyfront"
        response = httpx.post(
            f"{base}/v1/completions",
            json={"model": BUNDLED_TOKENIZER_NAME, "prompt": prompt, "max_tokens": 4},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        # The engine's sockets really cross the veth: its connections go to the front end's address.
        connections = subprocess.run(
            ["ip", "netns", "exec", engine_namespace, "ss", "-tn"], capture_output=True, text=True
        ).stdout
        assert f"{FRONT_ADDR}:" in connections
    finally:
        for proc in (server, engine):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        engine_log.close()
        server_log.close()
