"""The opt-in docker tier: docker/Dockerfile built and run on a real Docker engine, and docker/compose.yaml run with
pyfront against an engine started outside it.

Run with ``tools/docker/run_tier.sh``: it installs Debian's Docker engine, starts a private dockerd and imports a
base image made by debootstrap (no registry is reachable here), then runs this file with ``DOCKER_HOST``,
``PYFRONT_DOCKER`` (the CLI) and ``PYFRONT_DOCKER_BASE_IMAGE`` set. With a Docker engine of your own:
``PYFRONT_DOCKER_BASE_IMAGE=python:3.11-slim python -m pytest -q -rP --docker -m docker_tier
tests/tiers/test_docker.py``.
Nothing here tags or removes anything but the tier's own image and containers.

Every container uses the host's network (the tier's daemon has no bridge), so each gets free host ports for its
HTTP server and its engine handshake. What is checked and printed:

- the build: the host's wheelhouse (``pip wheel`` of the project), then ``docker build --network none`` (the install
  is offline); build time, the build context's size (the .dockerignore allow-list: no more than the wheelhouse)
  and the image's size; the image runs as uid 10001 and carries neither the wheels nor the test extra;
- a container of ``pyfront serve --mock-engine`` with ``VLLM_API_KEY``: time until /health answers and until
  Docker's own HEALTHCHECK says healthy; /health, a chat completion and a streamed one, each without, with a
  wrong and with the right key;
- SIGTERM: streams in flight when ``docker stop -t <compose's stop_grace_period>`` is sent end whole
  (finish_reason and ``[DONE]``, no error event), and the container exits 0 well within the grace period;
- compose: ``docker-compose -f docker/compose.host.yaml up pyfront`` (compose.yaml's pyfront on the host's network),
  against the bundled mock engine running on the host; healthy, a chat completion through it, ``stop`` exits 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.docker_tier

DOCKER = os.environ.get("PYFRONT_DOCKER", "docker")
BASE_IMAGE = os.environ.get("PYFRONT_DOCKER_BASE_IMAGE", "python:3.11-slim")
IMAGE = "pyfront:docker-tier"
"""Not compose.yaml's default `pyfront:latest`, so a run on someone's own engine never replaces their image."""
WHEELHOUSE = REPO_ROOT / "docker" / "wheelhouse"
COMPOSE_FILES = ["-f", "docker/compose.host.yaml"]
COMPOSE_PROJECT = f"pyfront-docker-tier-{os.getpid()}"
API_KEY = "sk-docker-tier"
MODEL = "pyfront/qwen3-tokenizer"
SETUP_HINT = "run tools/docker/run_tier.sh (it starts a Docker engine and imports a base image)"
# The mock engine paces its tokens so a stream lasts long enough to be in flight at SIGTERM: 60 tokens, 3 a step
# every 0.1 s, about 2 s (pyfront's --shutdown-timeout is 30 s); no output length of its own below max_tokens.
MOCK_ENGINE_ARGS = "--step-interval 0.1 --tokens-per-step 3 --output-len 1000"
DRAIN_TOKENS = 60
HEALTHY_TIMEOUT_S = 120.0  # the HEALTHCHECK's first probe is 15 s after the start, and a failed one waits 15 s more
COMPOSE = yaml.safe_load((REPO_ROOT / "docker" / "compose.yaml").read_text())


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def inspect(name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(docker("inspect", name).stdout)[0]
    return value


def grace_seconds() -> int:
    """compose.yaml's stop_grace_period for pyfront ("40s"): what `docker stop -t` gets here too."""
    period = COMPOSE["services"]["pyfront"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", period)
    assert match, f"stop_grace_period {period!r}: write it in seconds"
    return int(match.group(1))


def request(
    port: int, method: str, path: str, body: dict[str, Any] | None = None, key: str | None = None
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""  # nothing listens yet (or any more)


def chat(max_tokens: int, stream: bool = False, model: str = MODEL) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hello from a container!"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@dataclass
class Stream:
    """One streamed chat completion read to its end on a thread: its chunks and how it ended."""

    port: int
    max_tokens: int
    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    """Ended with `data: [DONE]`."""
    error: str | None = None
    first_chunk: threading.Event = field(default_factory=threading.Event)
    last_chunk_at = 0.0
    """time.monotonic() of the last chunk."""
    thread: threading.Thread | None = None

    def start(self) -> Stream:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        body = json.dumps(chat(self.max_tokens, stream=True)).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        self.done = True
                        break
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        self.error = json.dumps(chunk["error"])
                    self.chunks.append(chunk)
                    self.last_chunk_at = time.monotonic()
                    self.first_chunk.set()
        except Exception as exc:  # the stream's end is judged by the test: keep what happened
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.first_chunk.set()

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"stream still open after {timeout} s"

    @property
    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c.get("choices"))

    @property
    def finish_reason(self) -> str | None:
        reasons = [c["choices"][0].get("finish_reason") for c in self.chunks if c.get("choices")]
        return next((r for r in reversed(reasons) if r), None)


# ------------------------------------------------------------------------------------------------- the build


@dataclass
class Build:
    seconds: float
    wheelhouse_seconds: float
    wheelhouse_bytes: int
    context_bytes: int
    size_bytes: int
    config: dict[str, Any]


def _context_bytes(output: str) -> int:
    """The build context's size as the builder reports it (the classic builder's line, or BuildKit's)."""
    match = re.search(r"Sending build context to Docker daemon\s+([\d.]+)([kMG]?B)", output) or re.search(
        r"transferring context: ([\d.]+)([kMG]?B)", output
    )
    assert match, f"the build output does not say the context's size:\n{output[-2000:]}"
    return int(float(match.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[match.group(2)])


@pytest.fixture(scope="module")
def build() -> Iterator[Build]:
    """The host's wheelhouse, then the image from the repository root as a user builds it (tag IMAGE)."""
    version = docker("version", "-f", "{{.Server.Version}}", check=False)
    if version.returncode != 0:
        pytest.fail(
            f"no Docker engine answers ({os.environ.get('DOCKER_HOST', 'default socket')}): {SETUP_HINT}\n"
            f"{version.stderr[-500:]}",
            pytrace=False,
        )
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        pytest.fail(f"the base image {BASE_IMAGE} is not on the Docker engine: {SETUP_HINT}", pytrace=False)
    # The wheels of msgspec, pyzmq, ... are the building interpreter's: it must be the image's Python.
    assert sys.version_info[:2] == (3, 11), f"build the wheelhouse with Python 3.11, not {sys.version.split()[0]}"
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    started = time.monotonic()
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(WHEELHOUSE), "."],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert wheel.returncode == 0, f"pip wheel failed:\n{wheel.stdout[-3000:]}{wheel.stderr[-3000:]}"
    wheelhouse_seconds = time.monotonic() - started
    wheels = list(WHEELHOUSE.glob("*.whl"))
    wheelhouse_bytes = sum(w.stat().st_size for w in wheels)
    started = time.monotonic()
    built = docker(
        "build",
        "--network",
        "none",
        "--build-arg",
        f"BASE_IMAGE={BASE_IMAGE}",
        "-f",
        "docker/Dockerfile",
        "-t",
        IMAGE,
        str(REPO_ROOT),
        timeout=900,
    )
    seconds = time.monotonic() - started
    config = inspect(IMAGE)
    result = Build(
        seconds,
        wheelhouse_seconds,
        wheelhouse_bytes,
        _context_bytes(built.stdout + built.stderr),
        int(config["Size"]),
        config,
    )
    print(
        f"build: wheelhouse of {len(wheels)} wheels ({wheelhouse_bytes / 1e6:.1f} MB) in {wheelhouse_seconds:.1f} s; "
        f"docker build on {BASE_IMAGE} in {seconds:.1f} s, context {result.context_bytes / 1e6:.1f} MB; "
        f"image {IMAGE} {result.size_bytes / 1e6:.0f} MB"
    )
    yield result
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)


def test_image_builds_offline_from_a_context_of_the_wheels_alone(build: Build) -> None:
    # .dockerignore lets docker/wheelhouse/ alone in: .git, virtualenvs and caches would add far more.
    assert build.context_bytes <= build.wheelhouse_bytes * 1.02 + 1e6, (
        f"build context {build.context_bytes} bytes for a wheelhouse of {build.wheelhouse_bytes}: see .dockerignore"
    )
    assert build.config["Config"]["Entrypoint"] == ["pyfront", "serve"], build.config["Config"]
    base_layers = inspect(BASE_IMAGE)["RootFS"]["Layers"]
    assert build.config["RootFS"]["Layers"][: len(base_layers)] == base_layers, f"not built on {BASE_IMAGE}"


def test_image_runs_as_non_root_without_wheels_or_the_test_extra(build: Build) -> None:
    assert build.config["Config"]["User"] == "pyfront"
    uid = docker("run", "--rm", "--network", "none", "--entrypoint", "id", IMAGE, "-u").stdout.strip()
    assert uid == "10001", f"the container runs as uid {uid}"
    probe = (
        "import glob, importlib.util as u, json;"
        " roots = ('/wheelhouse', '/opt', '/home', '/tmp');"  # where an install could leave wheels (not /proc)
        " print(json.dumps({'wheels': [w for d in roots for w in glob.glob(d + '/**/*.whl', recursive=True)],"
        " 'test extra': [m for m in ('pytest', 'hypothesis', 'openai', 'ruff', 'mypy') if u.find_spec(m)],"
        " 'pyfront': bool(u.find_spec('pyfront.server'))}))"
    )
    found = json.loads(docker("run", "--rm", "--network", "none", "--entrypoint", "python", IMAGE, "-c", probe).stdout)
    print(f"image contents: {found}")
    assert found == {"wheels": [], "test extra": [], "pyfront": True}, found
    assert build.config["Config"]["Healthcheck"]["Test"][:2] == ["CMD", "python"]


# -------------------------------------------------------------------------------------- a container serving


@dataclass
class Served:
    name: str
    port: int


@pytest.fixture(scope="module")
def served(build: Build) -> Iterator[Served]:
    """`pyfront serve --mock-engine` in a container on the host's network, VLLM_API_KEY set, once healthy."""
    port, rpc_port = free_port(), free_port()
    name = f"pyfront-docker-tier-{os.getpid()}"
    docker(
        "run",
        "-d",
        "--init",
        "--network",
        "host",
        "--name",
        name,
        "-e",
        f"VLLM_API_KEY={API_KEY}",
        "-e",
        f"PYFRONT_HEALTHCHECK_URL=http://127.0.0.1:{port}/health",
        IMAGE,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-parallel-rpc-port",
        str(rpc_port),
        "--mock-engine",
        "--mock-engine-args",
        MOCK_ENGINE_ARGS,
    )
    try:
        started = time.monotonic()
        answered: float | None = None
        while True:
            state = inspect(name)["State"]
            assert state["Running"], f"the container exited {state['ExitCode']}:\n{logs(name)}"
            if answered is None and request(port, "GET", "/health")[0] == 200:
                answered = time.monotonic() - started
            if state["Health"]["Status"] == "healthy":
                break
            assert state["Health"]["Status"] != "unhealthy", f"HEALTHCHECK failed: {state['Health']}\n{logs(name)}"
            assert time.monotonic() - started < HEALTHY_TIMEOUT_S, (
                f"not healthy in {HEALTHY_TIMEOUT_S} s:\n{logs(name)}"
            )
            time.sleep(0.5)
        healthy = time.monotonic() - started
        print(
            f"container {name}: /health 200 after {answered:.1f} s, Docker's HEALTHCHECK healthy after "
            f"{healthy:.1f} s (its first probe runs 15 s after the start)"
        )
        yield Served(name, port)
    finally:
        docker("rm", "-f", name, check=False)


def logs(name: str) -> str:
    done = docker("logs", name, check=False)
    return (done.stdout + done.stderr)[-3000:]


def test_container_serves_health_chat_and_a_stream_and_enforces_the_key(served: Served) -> None:
    port = served.port
    lines = []
    status, body = request(port, "GET", "/health")
    assert status == 200, body
    health = json.loads(body)
    lines.append(f"GET /health (no key) -> 200, front_end_block_hashing: {health['front_end_block_hashing'][:60]}...")
    for key, want in ((None, 401), ("sk-wrong", 401), (API_KEY, 200)):
        status, body = request(port, "POST", "/v1/chat/completions", chat(8), key=key)
        assert status == want, (key, status, body)
        shown = "no key" if key is None else "wrong key" if key != API_KEY else "VLLM_API_KEY"
        if status == 200:
            answer = json.loads(body)
            content = answer["choices"][0]["message"]["content"]
            assert content and answer["usage"]["completion_tokens"] == 8, answer
            lines.append(f"POST /v1/chat/completions ({shown}) -> 200: {content!r}, usage {answer['usage']}")
        else:
            assert json.loads(body)["error"]["code"] == 401, body
            lines.append(f"POST /v1/chat/completions ({shown}) -> {status}")
    status, _ = request(port, "POST", "/v1/chat/completions", chat(8, stream=True))
    assert status == 401
    lines.append("POST /v1/chat/completions stream (no key) -> 401")
    stream = Stream(port, 12).start()
    stream.join(60)
    assert stream.error is None and stream.done, (stream.error, stream.chunks[-2:])
    assert stream.finish_reason == "length" and stream.text, stream.chunks[-2:]
    lines.append(
        f"POST /v1/chat/completions stream (VLLM_API_KEY) -> {len(stream.chunks)} chunks, "
        f"finish_reason {stream.finish_reason}, [DONE]: {stream.text!r}"
    )
    status, body = request(port, "GET", "/v1/models", key=API_KEY)
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL, body
    lines.append(f"GET /v1/models (VLLM_API_KEY) -> 200: {MODEL}")
    print("requests served:", *lines, sep="\n  ")


def test_sigterm_drains_in_flight_streams_and_exits_0(served: Served) -> None:
    grace = grace_seconds()
    streams = [Stream(served.port, DRAIN_TOKENS).start() for _ in range(2)]
    for stream in streams:
        assert stream.first_chunk.wait(30) and stream.error is None, stream.error
    started = time.monotonic()
    stop = subprocess.run(
        [DOCKER, "stop", "-t", str(grace), served.name], capture_output=True, text=True, timeout=grace + 30
    )
    stopped = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    for stream in streams:
        stream.join(10)
    state = inspect(served.name)["State"]
    log = logs(served.name)
    results = [
        f"{len(s.chunks)} chunks, finish_reason {s.finish_reason}, [DONE] {s.done}, error {s.error}, "
        f"last chunk {s.last_chunk_at - started:.1f} s after SIGTERM"
        for s in streams
    ]
    print(
        f"drain: docker stop -t {grace} (SIGTERM) with {len(streams)} streams in flight; the container exited "
        f"{state['ExitCode']} after {stopped:.1f} s",
        *(f"  stream {i}: {r}" for i, r in enumerate(results)),
        sep="\n",
    )
    for stream in streams:
        assert stream.error is None and stream.done and stream.finish_reason == "length", results
        assert stream.last_chunk_at > started, "the stream had ended before SIGTERM: nothing was drained"
    assert state["ExitCode"] == 0 and not state["OOMKilled"], f"{state}\n{log}"
    assert stopped < grace, f"stopped after {stopped:.1f} s: Docker's SIGKILL came first"
    assert "Traceback" not in log, log


# ------------------------------------------------------------------------------------------------- compose


def compose(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", *COMPOSE_FILES, "-p", COMPOSE_PROJECT, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_compose_runs_pyfront_against_a_mock_engine_on_the_host(build: Build) -> None:
    port, rpc_port = free_port(), free_port()
    grace = grace_seconds()
    with tempfile.TemporaryDirectory(prefix="pyfront-docker-tier-") as tmp:
        model = Path(tmp) / "model"
        # The bundled tokenizer's files are all pyfront reads from a model directory.
        subprocess.run(
            [sys.executable, "-m", "pyfront.server.text.bundled_tokenizer", str(model)], check=True, capture_output=True
        )
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        # The container's user (uid 10001) reads the model and creates its ipc sockets in the shared run dir.
        for path in (Path(tmp), model):
            path.chmod(0o755)
        run_dir.chmod(0o1777)
        env = {
            **os.environ,
            "MODEL_DIR": str(model),
            "PYFRONT_RUN_DIR": str(run_dir),
            "PYFRONT_IMAGE": IMAGE,
            "PYFRONT_PORT": str(port),
            "PYFRONT_RPC_PORT": str(rpc_port),
            "SERVED_MODEL_NAME": "tier-model",
            "DOCKER_CLIENT_TIMEOUT": "120",
            "COMPOSE_HTTP_TIMEOUT": "120",
        }
        engine_log = open(Path(tmp) / "mock-engine.log", "wb")  # noqa: SIM115 (closed in the finally)
        # In pytest's process group (tools/docker/run_tier.sh ends that group if this test cannot).
        engine = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pyfront.engine_client.mock_engine",
                "--handshake-address",
                f"tcp://127.0.0.1:{rpc_port}",
                "--ranks",
                "0",
                "--tokenizer",
                str(model),
            ],
            stdout=engine_log,
            stderr=subprocess.STDOUT,
        )
        output = []
        try:
            up = compose("up", "-d", "--no-build", "pyfront", env=env)
            output.append(
                f"$ docker-compose {' '.join(COMPOSE_FILES)} up -d --no-build pyfront (exit {up.returncode})"
                f"\n{(up.stdout + up.stderr).strip()}"
            )
            assert up.returncode == 0, output[-1]
            container = compose("ps", "-q", "pyfront", env=env).stdout.strip()
            assert container, "compose started no pyfront container"
            config = inspect(container)
            assert config["HostConfig"]["NetworkMode"] == "host" and config["HostConfig"]["Init"], config["HostConfig"]
            started = time.monotonic()
            while (state := inspect(container)["State"])["Health"]["Status"] != "healthy":
                assert state["Running"], f"exited {state['ExitCode']}:\n{logs(container)}"
                assert engine.poll() is None, f"the mock engine exited:\n{Path(tmp, 'mock-engine.log').read_text()}"
                assert time.monotonic() - started < HEALTHY_TIMEOUT_S, f"not healthy:\n{logs(container)}"
                time.sleep(0.5)
            healthy = time.monotonic() - started
            status, body = request(port, "GET", "/health")
            assert status == 200, body
            ranks = [e.get("rank") for e in json.loads(body).get("engines", [])]
            status, body = request(port, "POST", "/v1/chat/completions", chat(6, model="tier-model"))
            assert status == 200, body
            content = json.loads(body)["choices"][0]["message"]["content"]
            assert content, body
            output.append(
                f"healthy after {healthy:.1f} s; /health engines (ranks) {ranks}; POST /v1/chat/completions"
                f" as tier-model -> 200 {content!r} (from the mock engine pid {engine.pid} on the host)"
            )
            started = time.monotonic()
            stop = compose("stop", env=env, timeout=grace + 60)
            stopped = time.monotonic() - started
            exit_code = inspect(container)["State"]["ExitCode"]
            output.append(
                f"$ docker-compose ... stop (exit {stop.returncode}, {stopped:.1f} s; stop_grace_period "
                f"{grace} s): pyfront exited {exit_code}\n{(stop.stdout + stop.stderr).strip()}"
            )
            assert stop.returncode == 0 and exit_code == 0, f"{output[-1]}\n{logs(container)}"
            assert stopped < grace, output[-1]
        finally:
            down = compose("down", "--remove-orphans", "-t", str(grace), env=env, timeout=grace + 60)
            output.append(f"$ docker-compose ... down (exit {down.returncode})\n{(down.stdout + down.stderr).strip()}")
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(10)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait(10)
            engine_log.close()
            print("compose run:", *output, sep="\n")
        assert down.returncode == 0, output[-1]
