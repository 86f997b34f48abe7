"""The command line as a newcomer meets it: `pyfront serve ...` run as a process, its exit code, its one-line
errors, its banner, its flags' behaviour, its shutdown; and the uvicorn factory path."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pyfront.server.cli import ENGINE_SIDE_FLAGS, config_from_args, parse_args
from pyfront.server.config import ServerConfig, resolve_api_keys
from pyfront.server.launcher import banner
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from tests.conftest import free_port

PYFRONT = [sys.executable, "-m", "pyfront.server.cli"]
CHAT = {"model": BUNDLED_TOKENIZER_NAME, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYFRONT, *args], capture_output=True, text=True, timeout=60, env=env)


class Served:
    """A `pyfront serve` process: its banner (stdout), its stderr in a file, and a way to stop it."""

    def __init__(self, args: list[str], tmp: Path, env: dict[str, str] | None = None, cmd: list[str] | None = None):
        self.stderr_path = tmp / f"stderr-{time.monotonic_ns()}.txt"
        self.stderr_file = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            (cmd or [*PYFRONT, "serve"]) + args,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.stdout: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))

    def wait_for_banner(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith("  curl ") for line in self.stdout):
                return next(line for line in self.stdout if line.startswith("  curl ")).strip()
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr()}"
            time.sleep(0.05)
        raise AssertionError(f"no banner: {self.stderr()}")

    def wait_for_stderr(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            assert time.monotonic() < deadline, f"{text!r} not in stderr: {self.stderr()}"
            time.sleep(0.05)

    def stderr(self) -> str:
        self.stderr_file.flush()
        return self.stderr_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.stderr_file.close()
        return self.proc.returncode


def wait_ready(base_url: str, transport: httpx.BaseTransport | None = None, **kwargs) -> None:
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=base_url, transport=transport, timeout=5, **kwargs) as http:
        while time.monotonic() < deadline:
            try:
                if http.get("/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise AssertionError("server never became ready")


# ---------------------------------------------------------------- flags and their errors (no server)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "99999"], "argument --port: 99999 is out of range: must be an integer in 0-65535"),
        (["--port", "http"], "argument --port: 'http' is not an integer"),
        (["--data-parallel-rpc-port", "0"], "must be an integer in 1-65535"),
        (
            ["--data-parallel-size", "0"],
            "argument --data-parallel-size/-dp: 0 is out of range: must be an integer >= 1",
        ),
        (["--max-model-len", "-5"], "argument --max-model-len: -5 is out of range"),
        (["--api-server-count", "0"], "argument --api-server-count/-asc: 0 is out of range"),
        (["--max-request-body-bytes", "0"], "argument --max-request-body-bytes: 0 is out of range"),
        (
            ["--max-header-bytes", "0"],
            "argument --max-header-bytes/--h11-max-incomplete-event-size: 0 is out of range: must be an integer >= 1",
        ),
        (["--h11-max-header-count", "0"], "argument --max-header-count/--h11-max-header-count: 0 is out of range"),
        (["--request-read-timeout", "-1"], "argument --request-read-timeout: -1 is out of range"),
        (["--max-num-seqs-in-flight", "-1"], "argument --max-num-seqs-in-flight: -1 is out of range"),
        (["--shutdown-timeout", "-1"], "argument --shutdown-timeout: -1 is out of range: must be a number >= 0"),
        (["--request-timeout", "nan"], "argument --request-timeout: nan is out of range"),
        (["--sse-keep-alive-interval", "inf"], "argument --sse-keep-alive-interval: inf is out of range"),
        (["--engine-startup-timeout", "0"], "must be a number > 0"),
        (["--engine-stall-timeout", "0"], "must be a number > 0"),
        (["--engine-ping-interval", "0"], "must be a number > 0"),
        (["--ssl-cert-reqs", "3"], "argument --ssl-cert-reqs: invalid choice: 3"),
        (["--max-model-length", "5"], "unrecognized arguments: --max-model-length (did you mean --max-model-len?)"),
    ],
)
def test_bad_flag_values_are_argparse_errors_with_the_serve_usage(capsys, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["serve", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("usage: pyfront serve ")  # the sub-command's usage, not the top-level one


def test_serve_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 8000)" in out and "(default: 30.0)" in out and "(default: 127.0.0.1)" in out


def test_port_zero_and_edge_values_are_accepted() -> None:
    args = parse_args(["serve", "--port", "0", "--shutdown-timeout", "0", "--max-num-seqs-in-flight", "0"])
    assert (args.port, args.shutdown_timeout, args.max_num_seqs_in_flight) == (0, 0.0, 0)
    assert parse_args(["serve", "--port", "65535", "-dpp", "65535"]).data_parallel_rpc_port == 65535


@pytest.mark.parametrize("flags", ENGINE_SIDE_FLAGS, ids=lambda f: f[0])
def test_every_engine_side_flag_and_alias_is_refused_with_where_it_belongs(flags: tuple[str, ...]) -> None:
    for spelling in flags:
        with pytest.raises(SystemExit, match=r"vllm serve MODEL --headless") as exit_info:
            config_from_args(parse_args(["serve", spelling, "2"]))
        assert "/".join(flags) in str(exit_info.value.code)


def test_common_vllm_engine_flags_are_in_the_refusal_list() -> None:
    refused = {spelling for flags in ENGINE_SIDE_FLAGS for spelling in flags}
    common = {"-tp", "--tensor-parallel-size", "-pp", "--seed", "--trust-remote-code", "--max-num-seqs",
              "--kv-cache-dtype", "--enforce-eager", "--gpu-memory-utilization", "--dtype"}  # fmt: skip
    assert common <= refused


def test_data_parallel_size_local_zero_means_external_engines() -> None:
    assert config_from_args(parse_args(["serve", "--data-parallel-size-local", "0"])).data_parallel_size == 1
    assert config_from_args(parse_args(["serve", "-dpl", "0"])).data_parallel_size == 1
    with pytest.raises(SystemExit, match=r"never starts engines.*vllm serve MODEL --headless"):
        config_from_args(parse_args(["serve", "--data-parallel-size-local", "2"]))


def test_frontend_flags_reach_the_config() -> None:
    args = parse_args(
        ["serve", "--enable-log-requests", "--enable-request-id-headers", "--enable-prompt-tokens-details",
         "--disable-fastapi-docs", "--root-path", "/api", "--uds", "/tmp/x.sock"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.enable_log_requests and config.enable_request_id_headers and config.enable_prompt_tokens_details
    assert config.disable_fastapi_docs and config.root_path == "/api" and config.uds == "/tmp/x.sock"
    timing = config_from_args(parse_args(["serve", "--engine-ping-interval", "0.5", "--engine-stall-timeout", "3"]))
    assert (timing.engine_ping_interval, timing.engine_stall_timeout) == (0.5, 3.0)
    with pytest.raises(SystemExit, match="need --ssl-certfile"):
        config_from_args(parse_args(["serve", "--ssl-keyfile", "k.pem"]))
    with pytest.raises(SystemExit, match="--uds serves one API server"):
        config_from_args(parse_args(["serve", "--uds", "/tmp/x.sock", "--api-server-count", "2", "--port", "1"]))


def test_vllm_spellings_of_front_end_flags() -> None:
    """vLLM's --no-... forms of its boolean flags, its short aliases, and its JSON list for --allowed-origins."""
    args = parse_args(["serve", "--no-enable-log-requests", "--no-disable-fastapi-docs", "-dp", "2", "-asc", "2",
                       "--port", "8000", "--allowed-origins", '["http://a", "http://b"]',
                       "--h11-max-incomplete-event-size", "4194304", "--h11-max-header-count", "100"])  # fmt: skip
    config = config_from_args(args)
    assert (config.max_header_bytes, config.max_header_count) == (4194304, 100)
    assert not config.enable_log_requests and not config.disable_fastapi_docs
    assert (config.data_parallel_size, config.api_server_count) == (2, 2)
    assert config.allowed_origins == ["http://a", "http://b"]
    assert config_from_args(parse_args(["serve", "--allowed-origins", "http://a", "http://b"])).allowed_origins == [
        "http://a",
        "http://b",
    ]
    with pytest.raises(SystemExit, match="not a JSON list of strings"):
        config_from_args(parse_args(["serve", "--allowed-origins", "[1, 2]"]))


def test_api_keys_are_decided_in_one_place_as_vllm_does() -> None:
    """--api-key wins over VLLM_API_KEY (vLLM's --api-key defaults to it); either alone is enough."""
    assert resolve_api_keys([], {"VLLM_API_KEY": "env"}) == ["env"]
    assert resolve_api_keys(["flag"], {"VLLM_API_KEY": "env"}) == ["flag"]
    assert resolve_api_keys(["", ""], {}) == []
    env = {"VLLM_API_KEY": "env"}
    assert config_from_args(parse_args(["serve"]), env).api_key == ["env"]
    assert config_from_args(parse_args(["serve", "--api-key", "a", "--api-key", "b"]), env).api_key == ["a", "b"]
    assert ServerConfig.from_env(env).api_key == ["env"]
    assert ServerConfig.from_env({**env, "PYFRONT_API_KEY": "p"}).api_key == ["p"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("Qwen/Qwen3-0.6B", "does not download from the Hugging Face hub"),
        ("/no/such/dir", "no such directory: /no/such/dir"),
        ("EMPTY_DIR", "has no tokenizer files (tokenizer.json, tokenizer_config.json)"),
    ],
)
def test_a_model_that_cannot_load_is_one_line_and_no_banner(tmp_path: Path, model: str, expected: str) -> None:
    model = str(tmp_path) if model == "EMPTY_DIR" else model
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = run_cli("serve", model, "--mock-engine", "--port", str(free_port()), env=env)
    assert result.returncode == 1
    assert result.stdout == ""  # no "serving ... try: curl" banner
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pyfront: ") and expected in lines[0]
    assert "bundled 'pyfront/qwen3-tokenizer'" in lines[0]


def test_a_taken_handshake_port_is_one_line_before_anything_loads(tmp_path: Path) -> None:
    """`pyfront serve` binds the engine handshake first (launcher.run_server): a port in use fails at once."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        rpc = taken.getsockname()[1]
        result = run_cli("serve", "--mock-engine", "--port", str(free_port()), "--data-parallel-rpc-port", str(rpc))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("20")]  # log lines
    assert lines == [f"pyfront: cannot bind the handshake socket tcp://127.0.0.1:{rpc}: Address already in use"]
    assert "tokenizer" not in result.stderr  # failed before the tokenizer load


def test_banner_quoting_survives_the_shell() -> None:
    config = ServerConfig(api_key=["k"], served_model_name=["it's"], host="0.0.0.0")
    command = banner(config, 8123).splitlines()[1].strip()
    words = shlex.split(command)
    assert words[words.index("-H", 4) + 1] == "Authorization: Bearer $KEY"  # expanded by the shell: in "..."
    assert '"Authorization: Bearer $KEY"' in command
    assert json.loads(words[-1])["model"] == "it's"
    assert words[1] == "http://127.0.0.1:8123/v1/chat/completions"


# ---------------------------------------------------------------- a served process


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """`VLLM_API_KEY=sk-env pyfront serve --mock-engine ...` with the request-log and request-id flags."""
    port = free_port()
    server = Served(
        ["--mock-engine", "--port", str(port), "--enable-log-requests", "--enable-request-id-headers",
         "--disable-fastapi-docs", "--root-path", "/api"],
        tmp_path_factory.mktemp("served"),
        env={"VLLM_API_KEY": "sk-env"},
    )  # fmt: skip
    try:
        server.wait_for_banner()
        wait_ready(f"http://127.0.0.1:{port}")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        assert server.stop() == 0


def test_vllm_api_key_guards_the_cli_path(served: tuple[Served, str]) -> None:
    _, url = served
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-env"}, timeout=30)
    assert ok.status_code == 200


def test_the_banner_curl_line_works_as_pasted(served: tuple[Served, str]) -> None:
    server, url = served
    line = server.wait_for_banner()
    assert line.startswith(f"curl {url}/v1/chat/completions")
    result = subprocess.run(
        ["bash", "-c", line + " --silent --fail-with-body"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "KEY": "sk-env"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["choices"][0]["message"]["role"] == "assistant"
    # Banner after start-up, once.
    assert sum(line.startswith("pyfront: serving") for line in server.stdout) == 1
    assert "Uvicorn running on" in server.stderr()


def test_request_id_headers_follow_vllm(served: tuple[Served, str]) -> None:
    _, url = served
    auth = {"Authorization": "Bearer sk-env"}
    with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
        given = http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "abc-1"})
        assert given.headers["x-request-id"] == "abc-1" and given.json()["id"] == "chatcmpl-abc-1"
        fresh = http.post("/v1/chat/completions", json=CHAT)
        assert fresh.json()["id"] == f"chatcmpl-{fresh.headers['x-request-id']}"
        from_body = http.post("/v1/completions", json={**CHAT, "prompt": "hi", "request_id": "body-7"})
        assert from_body.headers["x-request-id"] == "body-7" and from_body.json()["id"] == "cmpl-body-7"
        unsafe = http.post("/v1/completions", json={**CHAT, "prompt": "hi", "request_id": "a\r\nSet-Cookie: x=1"})
        # Refused up front (it could not go back as a header); the 400 carries a fresh uuid4 hex instead.
        assert unsafe.status_code == 400 and unsafe.json()["error"]["param"] == "request_id"
        assert "set-cookie" not in unsafe.headers and len(unsafe.headers["x-request-id"]) == 32
        other = http.get("/v1/models", headers={"X-Request-Id": "m-1"})
        assert other.headers["x-request-id"] == "m-1"
        assert len(http.get("/health").headers["x-request-id"]) == 32
        assert httpx.get(f"{url}/v1/models").headers["x-request-id"]  # a 401 carries one too


def test_log_requests_logs_one_line_per_request(served: tuple[Served, str]) -> None:
    server, url = served
    headers = {"Authorization": "Bearer sk-env", "X-Request-Id": "log-me"}
    body = {**CHAT, "temperature": 0.5, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30) as response:
        response.read()
    server.wait_for_stderr("request chatcmpl-log-me")
    [line] = [line for line in server.stderr().splitlines() if "request chatcmpl-log-me" in line]
    assert "POST /v1/chat/completions, 10 prompt tokens" in line
    assert "stream=True" in line and "max_tokens=3" in line and "temperature=0.5" in line
    assert "Hello" not in line  # never the prompt itself


def test_docs_disabled_and_root_path(served: tuple[Served, str]) -> None:
    _, url = served
    auth = {"Authorization": "Bearer sk-env"}
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(url + path, headers=auth).status_code == 404
    # Behind a proxy that keeps the prefix, and one that strips it: both reach the routes.
    assert httpx.get(f"{url}/api/v1/models", headers=auth).status_code == 200
    assert httpx.post(f"{url}/api/v1/chat/completions", json=CHAT, headers=auth, timeout=30).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200


def test_no_pytorch_notice_on_the_console(served: tuple[Served, str]) -> None:
    server, _ = served
    assert "PyTorch was not found" not in server.stderr()


# ---------------------------------------------------------------- TLS and unix sockets


def make_cert(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_tls_with_client_certificates(tmp_path: Path) -> None:
    key, cert = make_cert(tmp_path)
    port = free_port()
    server = Served(
        ["--mock-engine", "--port", str(port), "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
         "--ssl-ca-certs", str(cert), "--ssl-cert-reqs", "2"],
        tmp_path,
    )  # fmt: skip
    try:
        assert server.wait_for_banner().startswith(f"curl https://127.0.0.1:{port}/")
        trusted = ssl.create_default_context(cafile=str(cert))
        trusted.load_cert_chain(str(cert), str(key))
        wait_ready(f"https://127.0.0.1:{port}", verify=trusted)
        reply = httpx.post(f"https://127.0.0.1:{port}/v1/chat/completions", json=CHAT, verify=trusted, timeout=30)
        assert reply.status_code == 200 and reply.json()["object"] == "chat.completion"
        with pytest.raises(httpx.HTTPError):  # no client certificate: refused in the handshake
            httpx.get(f"https://127.0.0.1:{port}/health", verify=ssl.create_default_context(cafile=str(cert)))
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/health")
    finally:
        assert server.stop() == 0


def test_unreadable_tls_files_are_one_line(tmp_path: Path) -> None:
    result = run_cli("serve", "--ssl-certfile", str(tmp_path / "missing.pem"), "--port", str(free_port()))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"pyfront: --ssl-certfile {tmp_path / 'missing.pem'}: no such file"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    result = run_cli("serve", "--ssl-certfile", str(garbage), "--port", str(free_port()))
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("pyfront: cannot load the TLS key/certificate: ")


def test_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "pyfront.sock"
    server = Served(["--mock-engine", "--uds", str(path)], tmp_path)
    try:
        line = server.wait_for_banner()
        assert line.startswith(f"curl --unix-socket {path} http://localhost/v1/chat/completions")
        wait_ready("http://localhost", transport=httpx.HTTPTransport(uds=str(path)))
        result = subprocess.run(["bash", "-c", line + " --silent --fail-with-body"], capture_output=True, text=True)
        assert result.returncode == 0 and json.loads(result.stdout)["object"] == "chat.completion"
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------- shutdown


def _stream_in_background(url: str) -> tuple[threading.Thread, list[str]]:
    lines: list[str] = []
    body = {**CHAT, "max_tokens": 1000, "stream": True, "ignore_eos": True}

    def run() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                lines.append(line)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(line.startswith("data: {") for line in lines):
        assert time.monotonic() < deadline, "the stream never started"
        time.sleep(0.05)
    return thread, lines


def _slow_server(tmp_path: Path, shutdown_timeout: str) -> tuple[Served, str]:
    port = free_port()
    server = Served(
        ["--mock-engine", "--port", str(port), "--shutdown-timeout", shutdown_timeout,
         "--mock-engine-args", "--step-interval 0.1 --output-len 1000"],
        tmp_path,
    )  # fmt: skip
    server.wait_for_banner()
    wait_ready(f"http://127.0.0.1:{port}")
    return server, f"http://127.0.0.1:{port}"


def test_ctrl_c_drains_then_cuts_streams_quietly(tmp_path: Path) -> None:
    server, url = _slow_server(tmp_path, "1")
    try:
        thread, lines = _stream_in_background(url)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0
        thread.join(10)
        err = server.stderr()
        assert (
            "pyfront: shutting down: draining 1 in-flight request(s) for up to 1 s; Ctrl-C again to force exit" in err
        )
        assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in err  # the one line
        assert "Traceback" not in err and "Exception in ASGI application" not in err
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["error"]["message"] == "server shutting down: request cut (the shutdown drain timeout passed)"
        assert "data: [DONE]" in lines[-2:]
    finally:
        server.stop()


def test_second_ctrl_c_forces_exit(tmp_path: Path) -> None:
    server, url = _slow_server(tmp_path, "120")
    try:
        thread, lines = _stream_in_background(url)
        server.proc.send_signal(signal.SIGINT)
        server.wait_for_stderr("Ctrl-C again to force exit")
        time.sleep(0.5)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(20) == 0
        assert time.monotonic() - started < 10
        thread.join(10)
        err = server.stderr()
        assert "pyfront: forced exit (second Ctrl-C)" in err
        assert "Traceback" not in err and "Exception in ASGI application" not in err
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["error"]["message"] == "server shutting down: request cut (forced exit)"
    finally:
        server.stop()


# ---------------------------------------------------------------- the uvicorn factory


FACTORY = [sys.executable, "-m", "uvicorn", "pyfront.server.app:create_app", "--factory"]


def test_factory_without_engine_says_what_it_waits_for(tmp_path: Path) -> None:
    rpc = free_port()
    env = {"PYFRONT_DATA_PARALLEL_RPC_PORT": str(rpc), "PYFRONT_DATA_PARALLEL_SIZE": "2"}
    server = Served(["--port", str(free_port())], tmp_path, env=env, cmd=FACTORY)
    try:
        server.wait_for_stderr("waiting for 2 engine(s)")
        err = server.stderr()
        assert f"(ranks 0-1) to connect to the handshake address tcp://127.0.0.1:{rpc}" in err
        assert f"--data-parallel-rpc-port {rpc} --data-parallel-size 2" in err and "PYFRONT_MOCK_ENGINE=1" in err
        assert "PyTorch was not found" not in err
    finally:
        server.stop()


def test_factory_with_the_mock_engine_and_vllm_api_key(tmp_path: Path) -> None:
    port = free_port()
    env = {"PYFRONT_MOCK_ENGINE": "1", "PYFRONT_DATA_PARALLEL_RPC_PORT": str(free_port()), "VLLM_API_KEY": "k"}
    server = Served(["--port", str(port)], tmp_path, env=env, cmd=FACTORY)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url)
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).status_code == 401
        reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"}, timeout=30)
        assert reply.status_code == 200
    finally:
        server.stop()


def test_factory_with_a_bad_model_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYFRONT_MODEL": "/no/such/dir"}
    result = subprocess.run([*FACTORY, "--port", str(free_port())], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0
    assert "pyfront: no such directory: /no/such/dir" in result.stderr and "Traceback" not in result.stderr


def test_generation_config_flag(tmp_path, capsys) -> None:
    """vLLM's --generation-config: auto (default), vllm, or a directory holding generation_config.json."""
    assert config_from_args(parse_args(["serve"])).generation_config == "auto"
    assert config_from_args(parse_args(["serve", "--generation-config", "vllm"])).generation_config == "vllm"
    (tmp_path / "generation_config.json").write_text("{}")
    assert config_from_args(parse_args(["serve", "--generation-config", str(tmp_path)])).generation_config == str(
        tmp_path
    )
    with pytest.raises(SystemExit):
        parse_args(["serve", "--generation-config", str(tmp_path / "missing")])
    assert "neither auto, vllm nor a directory" in capsys.readouterr().err


def test_mock_engine_gets_a_bundled_non_qwen3_tokenizer() -> None:
    """The mock's default words are Qwen3 ids: with another bundled vocabulary it is told which one."""
    mock_args = config_from_args(
        parse_args(["serve", "--mock-engine", "--tokenizer", "pyfront/qwen3.6"])
    ).mock_engine_args
    assert mock_args[mock_args.index("--tokenizer") + 1] == "pyfront/qwen3.6-tokenizer"
    as_model = config_from_args(parse_args(["serve", "pyfront/qwen3.6-tokenizer", "--mock-engine"])).mock_engine_args
    assert "--tokenizer" in as_model
    assert "--tokenizer" not in config_from_args(parse_args(["serve", "--mock-engine"])).mock_engine_args
    given = ["--mock-engine-args", "--word-ids 1,2", "--mock-engine", "--tokenizer", "pyfront/qwen3.6"]
    assert "--tokenizer" not in config_from_args(parse_args(["serve", *given])).mock_engine_args


def test_the_flags_default_to_the_config_defaults() -> None:
    """`pyfront serve` with no flags is `ServerConfig()`: the flags take their defaults from the config's fields
    (the one definition), which the `uvicorn --factory` path (PYFRONT_* variables) uses too."""
    assert config_from_args(parse_args(["serve"]), environ={}) == ServerConfig()


def test_a_flag_default_is_a_fresh_copy_of_a_list() -> None:
    """argparse keeps a flag's default object; a list default must not be the config's own."""
    first = parse_args(["serve", "--api-key", "k"])
    second = parse_args(["serve"])
    assert first.api_key == ["k"] and second.api_key == [] and ServerConfig().api_key == []
