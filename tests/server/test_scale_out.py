"""Scale-out: two API server processes on one port against two mock engines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port


def _get(url: str) -> httpx.Response | None:
    try:
        with httpx.Client(timeout=5) as http:  # a new connection each time: the kernel picks a process
            return http.get(url)
    except httpx.HTTPError:
        return None


def _complete(base: str, prompt: str) -> httpx.Response:
    with httpx.Client(timeout=30) as http:
        return http.post(
            f"{base}/v1/completions",
            json={"model": BUNDLED_TOKENIZER_NAME, "prompt": prompt, "max_tokens": 3},
        )


def _metric(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_two_api_servers_two_engines(tmp_path) -> None:
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    env = {**os.environ, "VLLM_NATIVE_FEH": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--mock-engine", "--api-server-count", "2",
         "--data-parallel-size", "2", "--port", str(port), "--mock-engine-args", "--step-interval 0.005"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 90
        while len(pids) < 2 and time.monotonic() < deadline:
            response = _get(f"{base}/health")
            if response is not None and response.status_code == 200:
                pids.add(response.json()["pid"])
            else:
                time.sleep(0.2)
        assert len(pids) == 2, (tmp_path / "server.log").read_text()[-3000:]

        prompt = "a prompt long enough to fill at least one block of sixteen tokens, hashed by each API server"
        for i in range(20):
            response = _complete(base, f"{prompt} {i}")
            assert response.status_code == 200, response.text
        metrics = _get(f"{base}/metrics").text
        # Counted by both processes, reported as one total by whichever answers the scrape.
        assert _metric(metrics, "vllm:request_success_total") == 20
        assert _metric(metrics, 'pyfront:feh_requests_total{hashed="true"') == 20
        assert _metric(metrics, "vllm:prompt_tokens_total") > 20 * 16

        # One API server dies: the other keeps serving on the same port.
        victim = pids.pop()
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        for i in range(10):
            response = _complete(base, f"after {i}")
            assert response.status_code == 200, response.text
        survivors = {r.json()["pid"] for r in (_get(f"{base}/health") for _ in range(10)) if r is not None}
        assert survivors == pids

        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    # Nothing left behind (multiprocessing's resource tracker takes a moment to notice its parent left).
    deadline = time.monotonic() + 10
    leftovers = "?"
    while leftovers and time.monotonic() < deadline:
        leftovers = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.strip()
        time.sleep(0.2)
    assert leftovers == "", subprocess.run(
        ["ps", "-o", "pid,args", "-g", str(proc.pid)], capture_output=True, text=True
    ).stdout
