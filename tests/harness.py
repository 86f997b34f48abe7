"""pyfront over HTTP for tests: the server in a thread of the test process, against the bundled mock engine.

`running_harness()` starts a mock engine (pyfront.engine_client.mock_engine, real ZMQ) and the real
application under uvicorn, and yields a `Harness` with clients for it; the `harness` fixture in
conftest.py is one of these per test module, with front-end hashing on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import uvicorn

from pyfront.engine_client.mock_engine import MockConfig, MockEngine
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port

MODEL = "qwen3-test"
API_KEY = "sk-test-key"


@dataclass
class Harness:
    base_url: str
    mock: MockEngine
    app: object

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0, **kwargs)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)

    def mock_totals(self) -> dict:
        totals: dict = {}
        for stats in self.mock.stats():
            for key, value in stats.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
        return totals


def start_server(config: ServerConfig, *, as_pyfront_serve: bool = False) -> tuple[uvicorn.Server, threading.Thread]:
    """The app on uvicorn's own HTTP protocol, or (`as_pyfront_serve`) on the one `pyfront serve` runs
    (launcher.build_uvicorn_config: server/http_limits.py's protocol, server/http_cycle.py's response cycle)."""
    app = create_app(config)
    if as_pyfront_serve:
        from pyfront.server.launcher import build_uvicorn_config

        config.uvicorn_log_level = "warning"
        uvicorn_config = build_uvicorn_config(app, config)
    else:
        uvicorn_config = uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning")
    server = uvicorn.Server(uvicorn_config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{config.port}/health", timeout=1).status_code == 200:
                return server, thread
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not become healthy")


@contextlib.contextmanager
def running_harness(
    config_overrides: dict | None = None, *, as_pyfront_serve: bool = False, **mock_options: object
) -> Iterator[Harness]:
    rpc_port, http_port = free_port(), free_port()
    options: dict = {"step_interval_s": 0.002, "output_len": 12, "max_model_len": 4096, "advertise_feh": True}
    options.update(mock_options)
    options.setdefault("ranks", [0])
    mock = MockEngine(MockConfig(handshake_address=f"tcp://127.0.0.1:{rpc_port}", **options)).start()
    settings: dict = {
        "model": BUNDLED_TOKENIZER_NAME,
        "served_model_name": [MODEL],
        "port": http_port,
        "api_key": [API_KEY],
        "data_parallel_rpc_port": rpc_port,
        "engine_startup_timeout": 20,
        "max_request_body_bytes": 1024 * 1024,
        "data_parallel_size": len(options["ranks"]),
    }
    config = ServerConfig(**{**settings, **(config_overrides or {})})
    server, thread = start_server(config, as_pyfront_serve=as_pyfront_serve)
    try:
        yield Harness(f"http://127.0.0.1:{http_port}", mock, server.config.app)
    finally:
        server.should_exit = True
        thread.join(10)
        mock.stop()
