"""Operations: overload control, deadlines, SSE keep-alives, readiness, graceful shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from pyfront.engine_client.mock_engine import MockConfig, MockEngine
from pyfront.server.config import ServerConfig
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port
from tests.harness import API_KEY, MODEL, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def ops() -> Iterator[tuple[str, MockEngine]]:
    rpc_port, http_port = free_port(), free_port()
    mock = MockEngine(
        MockConfig(handshake_address=f"tcp://127.0.0.1:{rpc_port}", ranks=[0], step_interval_s=0.01)
    ).start()
    config = ServerConfig(
        model=BUNDLED_TOKENIZER_NAME,
        served_model_name=[MODEL],
        port=http_port,
        api_key=[API_KEY],
        data_parallel_rpc_port=rpc_port,
        max_num_seqs_in_flight=2,
        sse_keep_alive_interval=0.2,
    )
    server, thread = start_server(config)
    try:
        yield f"http://127.0.0.1:{http_port}", mock
    finally:
        server.should_exit = True
        thread.join(10)
        mock.stop()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def body(max_tokens: int, stream: bool = True, **extra) -> dict:
    return {"model": MODEL, "prompt": "go", "max_tokens": max_tokens, "stream": stream, "ignore_eos": True, **extra}


def test_overload_is_refused_with_503_and_nothing_leaks(ops) -> None:
    base, mock = ops
    stop = threading.Event()
    started = threading.Barrier(3)

    def long_stream() -> None:
        with (
            httpx.Client(base_url=base, headers=AUTH, timeout=30) as http,
            http.stream("POST", "/v1/completions", json=body(20_000)) as response,
        ):
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            started.wait()
            stop.wait(10)

    threads = [threading.Thread(target=long_stream) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(10)
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        refused = http.post("/v1/completions", json=body(5, stream=False))
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert "capacity" in refused.json()["error"]["message"]
        metrics = http.get("/metrics").text
        assert 'pyfront:requests_rejected_total{model_name="qwen3-test",reason="overload"} 1.0' in metrics
    stop.set()
    for t in threads:
        t.join(10)
    assert wait_for(lambda: mock.stats()[0]["running"] == 0)
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:  # capacity is back
        assert http.post("/v1/completions", json=body(3, stream=False)).status_code == 200


def test_deadline_expiry_aborts_the_engine_request(ops) -> None:
    base, mock = ops
    aborts = mock.stats()[0]["aborts"]
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        started = time.monotonic()
        response = http.post("/v1/completions", json=body(20_000, stream=False), headers={"X-Request-Timeout": "0.3"})
        assert response.status_code == 504
        assert time.monotonic() - started < 3
        assert "timed out" in response.json()["error"]["message"]
        with http.stream(
            "POST", "/v1/completions", json=body(20_000), headers={"X-Request-Timeout": "0.3"}
        ) as streamed:
            events = [line for line in streamed.iter_lines() if line.startswith("data:")]
        assert '"code":504' in events[-2] and events[-1] == "data: [DONE]"
        bad = http.post("/v1/completions", json=body(5, stream=False), headers={"X-Request-Timeout": "soon"})
        assert bad.status_code == 400
    assert wait_for(lambda: mock.stats()[0]["aborts"] == aborts + 2 and mock.stats()[0]["running"] == 0)


def test_idle_streams_get_keep_alive_comments(ops) -> None:
    base, mock = ops
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        mock.ranks[0].stall_until = time.monotonic() + 1.0  # a "long prefill": no output for a second
        with http.stream("POST", "/v1/completions", json=body(3)) as response:
            lines = [line for line in response.iter_lines() if line]
    assert ": keep-alive" in lines
    assert lines[-1] == "data: [DONE]"


def test_readiness_waits_for_the_engines() -> None:
    rpc_port, http_port = free_port(), free_port()
    config = ServerConfig(model=BUNDLED_TOKENIZER_NAME, port=http_port, data_parallel_rpc_port=rpc_port)
    import uvicorn

    from pyfront.server.app import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=http_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    mock = None
    try:
        url = f"http://127.0.0.1:{http_port}"
        assert wait_for(lambda: _status(f"{url}/ready") == 503)
        assert _status(f"{url}/health") == 503
        refused = httpx.post(f"{url}/v1/completions", json=body(2, stream=False, model=BUNDLED_TOKENIZER_NAME))
        assert refused.status_code == 503 and refused.json()["error"]["code"] == 503
        mock = MockEngine(MockConfig(handshake_address=f"tcp://127.0.0.1:{rpc_port}", ranks=[0])).start()
        assert wait_for(lambda: _status(f"{url}/ready") == 200, 10)
        assert _status(f"{url}/health") == 200
    finally:
        server.should_exit = True
        thread.join(10)
        if mock is not None:
            mock.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_sigterm_drains_streams_then_exits_cleanly(tmp_path) -> None:
    """A real `pyfront serve --mock-engine` process: SIGTERM lets in-flight streams finish, then exits 0."""
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyfront.server.cli", "serve", "--mock-engine", "--port", str(port),
         "--shutdown-timeout", "20",
         "--mock-engine-args", "--step-interval 0.02"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    results: list[list[str]] = [[], [], []]
    try:
        assert wait_for(lambda: _status(f"{url}/ready") == 200, 60), (tmp_path / "server.log").read_text()

        def stream(i: int) -> None:
            with (
                httpx.Client(base_url=url, timeout=30) as http,
                http.stream("POST", "/v1/completions", json=body(60, model=BUNDLED_TOKENIZER_NAME)) as response,
            ):
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        results[i].append(line)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        # SIGTERM once every stream is running (60 tokens x 20 ms = 1.2 s each).
        assert wait_for(lambda: all(len(lines) >= 2 for lines in results), 10)
        os.killpg(proc.pid, signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(30) == 0
        assert len(results) == 3
        for lines in results:
            assert lines[-1] == "data: [DONE]"
            assert '"finish_reason":"length"' in lines[-2]
        assert _status(f"{url}/health") == 0  # gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    # Nothing left behind: the mock engine subprocess went with the server.
    leftovers = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.strip()
    assert leftovers == ""


def test_the_collector_is_tuned_once_the_server_has_started(ops) -> None:
    """app.GC_YOUNG_THRESHOLD: the start-up heap frozen out of collections, young collections less often."""
    import gc

    from pyfront.server.app import GC_YOUNG_THRESHOLD

    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0
