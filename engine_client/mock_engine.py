"""A mock vLLM EngineCore: the engine side of the real wire protocol, for tests, demos and benchmarks.

    python -m pyfront.engine_client.mock_engine --handshake-address tcp://127.0.0.1:62100 --ranks 0 1

It handshakes as an external headless engine (one thread per rank; one process may run several ranks),
registers on every front-end input socket, and serves ADD / ABORT / UTILITY exactly as
docs/engine-protocol.md#mock-engine describes, so vLLM's own front end can serve through it as well as pyfront.

Generation is deterministic: the k-th token of a request is a function of its prompt, its seed and k,
drawn from a list of whole-word token ids (so text reads as words, not as lone UTF-8 bytes). Requests
end on max_tokens (LENGTH), on a configured output length (then the request's EOS token, STOP), or on a
sampled stop token id (STOP, stop_reason = the id). Scripted outputs (utility `mock_script`, or
`--script-file`) replace the generated tokens for the next requests, one token per step: a script is a
list of token ids, or (in `--script-file`, with `--tokenizer`) a text, tokenized as the model would
write it, so a test can have the engine write an exact tool call (Hermes JSON, Qwen3-Coder XML)
token by token.

Front-end block hashing: with `--advertise-feh` the registration carries `native_frontend_hash_config`,
and every ADD's `prompt_block_hashes` is checked against the mock's own recomputation; the counts
(used / missing / mismatched / unexpected) are readable with the utility `mock_stats`.

Faults: `--die-after-requests N` (then `--die-mode sentinel` sends ENGINE_CORE_DEAD first, `silent`
just exits), and the utilities `mock_die(mode)` and `mock_stall(seconds)`. A process killed and started
again with the same `--ranks` is a restarted engine, as a real one: it says HELLO again and registers again
(docs/engine-protocol.md#engines-that-come-back).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from msgspec import UNSET

from pyfront.engine_client import codec, protocol
from pyfront.engine_client.negotiation import feh_eligible
from pyfront.engine_client.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineHandshakeMessage,
    LogprobsLists,
    LogprobsTensors,
    NativeFrontendHashConfig,
    SchedulerStats,
    UtilityCall,
    UtilityOutput,
    WireTensor,
)
from pyfront.hashing import HashConfig, block_hashes, default_none_hash, unpack_block_hashes

logger = logging.getLogger("pyfront.mock_engine")

RECENT_REQUESTS = 64
"""How many received requests each rank keeps (``MockEngineRank.recent``)."""

# Whole-word tokens of the Qwen2/Qwen3 vocabulary (" the", " model", ...): used when no tokenizer is
# given, so the mock's text reads as words with the bundled tokenizer. Any list works for other models.
DEFAULT_WORD_IDS: tuple[int, ...] = (
    279,
    1614,
    323,
    264,
    311,
    315,
    304,
    374,
    429,
    369,
    389,
    448,
    438,
    4285,
    553,
    518,
    1446,
    498,
    504,
    1052,
    646,
    1380,
    892,
    1231,
    3880,
    1083,
    1045,
    3204,
    1156,
    1660,
    1101,
    1008,
    1075,
    1246,
    1614,
    4128,
    1467,
    1882,
    2038,
    1879,
    6236,
    2222,
    3409,
    2115,
    4226,
    3405,
    5486,
    3119,
    1584,
)

KNOWN_UTILITIES_RETURNING_NONE = frozenset(
    {
        "reset_mm_cache", "reset_encoder_cache", "sleep", "release_kv_cache_memory", "pause_scheduler",
        "resume_scheduler", "profile", "save_sharded_state", "execute_dummy_batch", "set_weight_version",
        "collective_rpc", "add_lora", "remove_lora", "pin_lora",
    }
)  # fmt: skip


_INPUT_TYPES = frozenset(
    (
        protocol.REQUEST_TYPE_ADD,
        protocol.REQUEST_TYPE_ABORT,
        protocol.REQUEST_TYPE_UTILITY,
        protocol.REQUEST_TYPE_START_DP_WAVE,
    )
)
"""The type frames a front end may send; the engine-internal sentinels and anything else are refused."""


@dataclass(slots=True)
class MockConfig:
    handshake_address: str
    ranks: Sequence[int] = (0,)
    step_interval_s: float = 0.02
    tokens_per_step: int = 1
    output_len: int | None = None
    """Emit EOS (finish STOP) after this many tokens; None: run to max_tokens."""
    word_ids: Sequence[int] = DEFAULT_WORD_IDS
    max_model_len: int = 32768
    block_size: int = 16
    num_gpu_blocks: int = 8192
    max_num_seqs: int = 1024
    advertise_feh: bool = False
    feh_block_size: int | None = None
    """Block size advertised for FEH; defaults to block_size."""
    feh_none_hash: bytes | None = None
    verify_hashes: bool = True
    die_after_requests: int | None = None
    die_mode: str = "sentinel"
    arrival_log: str | None = None
    vllm_version: str = "0.32.0"
    scripts: Sequence[Sequence[int]] = ()
    """Outputs for the first requests, in arrival order (see the utility mock_script)."""
    step_on_arrival: bool = False
    """Benchmarks: a request arriving at an idle engine is stepped at once, not on the next step tick."""


@dataclass(slots=True)
class _Running:
    request: EngineCoreRequest
    output: list[int] = field(default_factory=list)
    script: list[int] | None = None
    seed: int = 0
    prompt_logprobs_sent: bool = False


@dataclass(slots=True)
class HashCounts:
    used: int = 0
    missing: int = 0
    mismatched: int = 0
    unexpected: int = 0


def _tensor(dtype: str, shape: Sequence[int], fmt: str, values: Sequence[Any]) -> WireTensor:
    return WireTensor(dtype, tuple(shape), struct.pack(f"<{len(values)}{fmt}", *values))


class MockEngineRank:
    """One engine rank: its handshake, sockets and step loop, on its own thread."""

    def __init__(self, config: MockConfig, rank: int, ctx: zmq.Context, stop: threading.Event) -> None:
        self.config = config
        self.rank = rank
        self.identity = protocol.engine_identity(rank)
        self.ctx = ctx
        self.stop = stop
        self.running: dict[str, _Running] = {}
        self.scripts: list[list[int]] = [list(tokens) for tokens in config.scripts]
        self.hash_counts = HashCounts()
        self.requests_received = 0
        self.recent: deque[EngineCoreRequest] = deque(maxlen=RECENT_REQUESTS)
        """The last ADDs as received (bounded), for in-process tests that check what the front end sent."""
        self.aborts_received = 0
        self.finished = 0
        self.stall_until = 0.0
        self.inputs: list[zmq.Socket] = []
        self.outputs: list[zmq.Socket] = []
        block = config.feh_block_size or config.block_size
        self.hash_config = (
            HashConfig.default(block)
            if config.feh_none_hash is None
            else HashConfig(HashConfig.default(block).algorithm, block, config.feh_none_hash)
        )
        self._arrivals = open(config.arrival_log, "a", buffering=1) if config.arrival_log else None  # noqa: SIM115

    # ------------------------------------------------------------------ handshake

    def registration(self) -> EngineCoreReadyResponse:
        """What this rank registers with on every input socket: every field a vLLM 0.32 engine sends."""
        cfg = self.config
        return EngineCoreReadyResponse(
            max_model_len=cfg.max_model_len,
            num_gpu_blocks=cfg.num_gpu_blocks,
            block_size=cfg.block_size,
            dp_stats_address=None,
            dtype="bfloat16",
            vllm_version=cfg.vllm_version,
            world_size=1,
            data_parallel_size=1,
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            data_parallel_rank=self.rank,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=8192,
            instance_id=f"pyfront-mock-{os.getpid()}-{self.rank}",
            supports_lora=False,
            max_loras=0,
            mamba_block_size=None,
            kv_cache_size_tokens=cfg.num_gpu_blocks * cfg.block_size,
            kv_cache_max_concurrency=float(cfg.num_gpu_blocks * cfg.block_size) / cfg.max_model_len,
            kv_events_config=None,
            weight_transfer_backend=None,
            enable_sleep_mode=False,
            supports_draft_weight_updates=False,
            effective_attention_block_size=cfg.block_size,
            native_frontend_hash_config=(
                NativeFrontendHashConfig.from_hash_config(self.hash_config) if cfg.advertise_feh else UNSET
            ),
        )

    def handshake(self) -> None:
        """HELLO, INIT, registration on every input socket, READY: what a headless vLLM engine does."""
        hs = self.ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, self.identity)
        hs.setsockopt(zmq.LINGER, 5000)
        hs.connect(self.config.handshake_address)
        hs.send(codec.encode_handshake(EngineHandshakeMessage.hello()))
        while not hs.poll(100):
            if self.stop.is_set():
                hs.close(0)
                return
        addresses = codec.decode_init(hs.recv()).addresses
        registration = codec.encode_ready_response(self.registration())
        for input_address, output_address in zip(addresses.inputs, addresses.outputs, strict=True):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(input_address)
            sock.send(registration)
            self.inputs.append(sock)
            push = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 4000)
            push.setsockopt(zmq.SNDHWM, 0)
            push.connect(output_address)
            self.outputs.append(push)
        hs.send(codec.encode_handshake(EngineHandshakeMessage.ready()))
        hs.close()
        logger.info("rank %d admitted by %d front-end process(es)", self.rank, len(self.inputs))

    # ------------------------------------------------------------------ inputs

    def handle_input(self, frames: list[bytes]) -> None:
        """Decode one input message with the protocol's codec and act on it.

        A malformed payload raises out of the rank's loop and ends it, as a real engine's input thread dies
        (docs/engine-protocol.md#inputs-that-break-an-engine); an unknown type byte is only logged, so a test
        sees the mistake without losing the rank.
        """
        if bytes(frames[0]) not in _INPUT_TYPES:
            logger.error("rank %d: unknown request type %r", self.rank, bytes(frames[0]))
            return
        kind, message = codec.decode_input(frames)
        if isinstance(message, EngineCoreRequest):
            self.handle_add(message)
        elif isinstance(message, UtilityCall):
            self.handle_utility(message.client_index, message.call_id, message.method_name, message.args)
        elif kind == protocol.REQUEST_TYPE_ABORT:
            assert isinstance(message, list)
            for request_id in message:
                self.aborts_received += 1
                self.running.pop(request_id, None)
        # START_DP_WAVE: a dense engine has nothing to do.

    def handle_add(self, request: EngineCoreRequest) -> None:
        if self._arrivals is not None:
            self._arrivals.write(f"{time.time():.6f} {self.rank} {request.request_id}\n")
        if request.request_id in self.running:
            logger.error("rank %d: duplicate request id %s: a real engine dies here", self.rank, request.request_id)
            self.die("sentinel")
        self.requests_received += 1
        self.recent.append(request)
        self.check_hashes(request)
        sp = request.sampling_params
        seed_source = f"{len(request.prompt_token_ids or ())}:{sum(request.prompt_token_ids or ())}"
        if sp is not None and sp.seed is not None:
            seed_source += f":{sp.seed}"
        seed = int.from_bytes(hashlib.blake2b(seed_source.encode(), digest_size=4).digest(), "little")
        script = self.scripts.pop(0) if self.scripts else None
        self.running[request.request_id] = _Running(request, script=script, seed=seed)
        limit = self.config.die_after_requests
        if limit is not None and self.requests_received >= limit:
            self.die(self.config.die_mode)

    def check_hashes(self, request: EngineCoreRequest) -> None:
        blob = request.prompt_block_hashes
        prompt = request.prompt_token_ids or []
        if not self.config.advertise_feh:
            if blob is not None:
                self.hash_counts.unexpected += 1
            return
        block = self.hash_config.block_size
        eligible = feh_eligible(request)
        if blob is None:
            if eligible and len(prompt) >= block:
                self.hash_counts.missing += 1
            return
        if not self.config.verify_hashes:
            self.hash_counts.used += 1
            return
        try:
            received = unpack_block_hashes(blob, block, len(prompt))
        except ValueError as exc:
            logger.warning("rank %d: bad prompt_block_hashes for %s: %s", self.rank, request.request_id, exc)
            self.hash_counts.mismatched += 1
            return
        if received == block_hashes(prompt, self.hash_config, request.cache_salt):
            self.hash_counts.used += 1
        else:
            logger.warning("rank %d: prompt_block_hashes of %s differ from the recipe", self.rank, request.request_id)
            self.hash_counts.mismatched += 1

    def stats(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "requests": self.requests_received,
            "aborts": self.aborts_received,
            "finished": self.finished,
            "running": len(self.running),
            "hashes_used": self.hash_counts.used,
            "hashes_missing": self.hash_counts.missing,
            "hashes_mismatched": self.hash_counts.mismatched,
            "hashes_unexpected": self.hash_counts.unexpected,
            "feh_advertised": self.config.advertise_feh,
        }

    def handle_utility(self, client_index: int, call_id: int, method: str, args: list[Any]) -> None:
        result: Any = None
        failure: str | None = None
        if method == "is_sleeping" or method == "is_scheduler_paused":
            result = False
        elif method == "get_supported_tasks":
            result = ["generate"]
        elif method in ("reset_prefix_cache", "wake_up"):
            result = True
        elif method == "list_loras":
            result = []
        elif method == "mock_stats":
            result = self.stats()
        elif method == "mock_script":
            self.scripts.extend([list(map(int, tokens)) for tokens in args[0]])
        elif method == "mock_stall":
            self.stall_until = time.monotonic() + float(args[0])
        elif method == "mock_die":
            self.die(args[0] if args else "sentinel")
        elif method in KNOWN_UTILITIES_RETURNING_NONE:
            result = None
        else:
            failure = f"Call to {method} method failed: 'EngineCore' object has no attribute '{method}'"
        reply = UtilityOutput(call_id, failure, None) if failure else UtilityOutput.success(call_id, result)
        self.send(
            client_index,
            EngineCoreOutputs(engine_index=self.rank, utility_output=reply, timestamp=time.monotonic()),
        )

    def die(self, mode: str) -> None:
        logger.error("rank %d dies (%s)", self.rank, mode)
        if mode == "sentinel":
            for push in self.outputs:
                push.send(protocol.ENGINE_CORE_DEAD)
            time.sleep(0.2)  # let the sentinel leave before the process goes
        os._exit(1)

    # ------------------------------------------------------------------ outputs

    def send(self, client_index: int, outputs: EngineCoreOutputs) -> None:
        if 0 <= client_index < len(self.outputs):
            self.outputs[client_index].send_multipart(codec.encode_outputs(outputs), copy=False)

    def next_token(self, state: _Running, position: int) -> int:
        if state.script is not None:
            return state.script[position]
        words = self.config.word_ids
        return words[(state.seed + position * 7919) % len(words)]

    def step(self) -> None:
        by_client: dict[int, list[EngineCoreOutput]] = {}
        done: list[str] = []
        cfg = self.config
        for request_id, state in self.running.items():
            request = state.request
            sp = request.sampling_params
            assert sp is not None
            max_tokens = sp.max_tokens or 16
            stop_ids = set(sp.stop_token_ids or ())
            new: list[int] = []
            finish: int | None = None
            stop_reason: int | str | None = None
            for _ in range(cfg.tokens_per_step):
                position = len(state.output)
                limit = len(state.script) if state.script is not None else cfg.output_len
                if limit is not None and position >= limit and not sp.ignore_eos and sp.eos_token_id is not None:
                    token = sp.eos_token_id
                    finish = protocol.FinishReason.STOP
                else:
                    token = (
                        self.next_token(state, position)
                        if limit is None or position < limit
                        else (
                            self.next_token(state, position % max(limit, 1))
                            if limit
                            else self.next_token(state, position)
                        )
                    )
                state.output.append(token)
                new.append(token)
                if finish is None and token in stop_ids and len(state.output) > sp.min_tokens:
                    finish, stop_reason = protocol.FinishReason.STOP, token
                if finish is None and len(state.output) >= max_tokens:
                    finish = protocol.FinishReason.LENGTH
                if finish is not None:
                    break
            output = EngineCoreOutput(request_id, new, finish_reason=finish, stop_reason=stop_reason)
            if sp.logprobs is not None:
                output.new_logprobs = self.sample_logprobs(new, sp.logprobs, len(state.output) - len(new))
            if sp.prompt_logprobs is not None and not state.prompt_logprobs_sent:
                state.prompt_logprobs_sent = True
                output.new_prompt_logprobs_tensors = self.prompt_logprobs(
                    request.prompt_token_ids or [], sp.prompt_logprobs
                )
            by_client.setdefault(request.client_index, []).append(output)
            if finish is not None:
                done.append(request_id)
        for request_id in done:
            del self.running[request_id]
        self.finished += len(done)
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=0,
            kv_cache_usage=min(1.0, len(self.running) / max(1, cfg.max_num_seqs)),
        )
        now = time.monotonic()
        for client_index, outputs in by_client.items():
            self.send(client_index, EngineCoreOutputs(self.rank, outputs, stats, now))

    def _top(self, token: int, k: int) -> list[int]:
        words = self.config.word_ids
        start = token % len(words)
        return [words[(start + j + 1) % len(words)] for j in range(k)]

    def sample_logprobs(self, tokens: list[int], k: int, start: int) -> LogprobsLists:
        k = 5 if k < 0 else k
        ids: list[int] = []
        values: list[float] = []
        ranks: list[int] = []
        for offset, token in enumerate(tokens):
            position = start + offset
            top = self._top(token, k)
            ids += [token, *top]
            values += [-0.25 - 0.01 * (position % 10), *(-0.5 - 0.5 * j for j in range(k))]
            ranks.append(1 + position % 3)
        rows = len(tokens)
        return LogprobsLists(
            _tensor("<i4", (rows, k + 1), "i", ids),
            _tensor("<f4", (rows, k + 1), "f", values),
            _tensor("<i8", (rows,), "q", ranks),
        )

    def prompt_logprobs(self, prompt: list[int], k: int) -> LogprobsTensors:
        k = 5 if k < 0 else k
        rows = max(0, len(prompt) - 1)
        ids: list[int] = []
        values: list[float] = []
        for i in range(rows):
            token = prompt[i + 1]
            ids += [token, *self._top(token, k)]
            values += [-1.0 - 0.001 * i, *(-0.5 - 0.5 * j for j in range(k))]
        return LogprobsTensors(
            _tensor("int32", (rows, k + 1), "i", ids),
            _tensor("float32", (rows, k + 1), "f", values),
            _tensor("int32", (rows,), "i", [1 + i % 4 for i in range(rows)]),
        )

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        self.handshake()
        if not self.inputs:
            return
        poller = zmq.Poller()
        for sock in self.inputs:
            poller.register(sock, zmq.POLLIN)
        interval = self.config.step_interval_s
        next_step = time.monotonic() + interval
        while not self.stop.is_set():
            now = time.monotonic()
            if now < self.stall_until:
                time.sleep(min(0.05, self.stall_until - now))
                next_step = time.monotonic() + interval
                continue
            timeout_ms = int(max(0.0, (next_step - now) * 1000)) if self.running else 100  # as Poller.poll truncates
            was_idle = not self.running
            for sock, _ in poller.poll(timeout_ms):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.handle_input(frames)
            now = time.monotonic()
            if not self.running:
                next_step = now + interval
            elif was_idle and self.config.step_on_arrival:
                self.step()
                next_step = now + interval
            elif now >= next_step:
                self.step()
                next_step = max(next_step + interval, now)
        for sock in self.inputs + self.outputs:
            sock.close(0)


class MockEngine:
    """Every configured rank on its own thread; `start()`, then `stop()` (or run until killed)."""

    def __init__(self, config: MockConfig) -> None:
        self.stop_event = threading.Event()
        self.ctx = zmq.Context()
        self.ranks = [MockEngineRank(config, rank, self.ctx, self.stop_event) for rank in config.ranks]
        self.threads = [threading.Thread(target=r.run, name=f"mock-rank-{r.rank}", daemon=True) for r in self.ranks]

    def start(self) -> MockEngine:
        for thread in self.threads:
            thread.start()
        return self

    def stats(self) -> list[dict[str, Any]]:
        return [rank.stats() for rank in self.ranks]

    def script(self, *token_lists: Sequence[int]) -> None:
        """The next requests (one list each, in arrival order on each rank) emit exactly these tokens."""
        for rank in self.ranks:
            rank.scripts.extend(list(tokens) for tokens in token_lists)

    def join(self) -> None:
        for thread in self.threads:
            while thread.is_alive():
                thread.join(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(5)
        self.ctx.term()


def run_mock_engine(config: MockConfig, stop: threading.Event | None = None) -> None:
    """Run every configured rank until `stop` is set or the process is killed."""
    engine = MockEngine(config)
    if stop is not None:
        engine.stop_event = stop
        for rank in engine.ranks:
            rank.stop = stop
    engine.start()
    try:
        engine.join()
    finally:
        engine.stop()


def _load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer (the bundled names resolved), imported only when asked (slow)."""
    from transformers import AutoTokenizer

    from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name

    return AutoTokenizer.from_pretrained(resolve_tokenizer_name(name))


def load_scripts(entries: Sequence[Any], tokenizer_name: str | None) -> list[list[int]]:
    """`--script-file` entries as token lists: a list of ids as is, a text tokenized with `tokenizer_name`.

    A text must come back unchanged from its tokens (a script that decodes differently would test
    something else than it says): ValueError otherwise, and for a text without a tokenizer.
    """
    tokenizer = None
    out: list[list[int]] = []
    for entry in entries:
        if not isinstance(entry, str):
            out.append([int(t) for t in entry])
            continue
        if tokenizer_name is None:
            raise ValueError("a text script needs --tokenizer")
        if tokenizer is None:
            tokenizer = _load_tokenizer(tokenizer_name)
        ids = tokenizer.encode(entry, add_special_tokens=False)
        if tokenizer.decode(ids) != entry:
            raise ValueError(f"script text does not round-trip through the tokenizer: {entry[:60]!r}")
        out.append(ids)
    return out


def load_word_ids(tokenizer_path: str) -> list[int]:
    """Whole-word token ids of a tokenizer (a directory or a bundled tokenizer's name)."""
    from pyfront.server.text.bundled_tokenizer import whole_word_token_ids

    return whole_word_token_ids(_load_tokenizer(tokenizer_path), 512)


def parse_args(argv: Sequence[str] | None = None) -> MockConfig:
    p = argparse.ArgumentParser(
        prog="python -m pyfront.engine_client.mock_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--handshake-address", required=True, help="front end's handshake ROUTER, tcp://HOST:PORT")
    p.add_argument("--ranks", type=int, nargs="+", default=[0], help="global DP ranks this process serves")
    p.add_argument("--step-interval", type=float, default=0.02, help="seconds per engine step")
    p.add_argument("--tokens-per-step", type=int, default=1)
    p.add_argument("--output-len", type=int, default=None, help="emit EOS after this many tokens")
    p.add_argument("--tokenizer", default=None, help="emit whole-word tokens of this tokenizer")
    p.add_argument("--word-ids", default=None, help="comma-separated token ids to emit")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--advertise-feh", action="store_true", help="advertise native_frontend_hash_config")
    p.add_argument("--feh-block-size", type=int, default=None)
    p.add_argument("--feh-none-hash", default=None, help="hex; default: the recipe's default none_hash")
    p.add_argument("--no-verify-hashes", action="store_true", help="count hashes without recomputing them")
    p.add_argument("--die-after-requests", type=int, default=None)
    p.add_argument("--die-mode", choices=("sentinel", "silent"), default="sentinel")
    p.add_argument("--arrival-log", default=None, help="append 'wall_time rank request_id' per ADD")
    p.add_argument(
        "--script-file",
        default=None,
        help="JSON list of the first requests' outputs: token-id lists, or texts (tokenized with --tokenizer)",
    )
    p.add_argument(
        "--step-on-arrival",
        action="store_true",
        help="benchmarks: step at once when a request reaches an idle engine (default: on the step tick)",
    )
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s mock-engine %(levelname)s %(message)s")
    if a.word_ids:
        words: Sequence[int] = [int(x) for x in a.word_ids.split(",")]
    elif a.tokenizer:
        words = load_word_ids(a.tokenizer)
    else:
        words = DEFAULT_WORD_IDS
    none_hash = bytes.fromhex(a.feh_none_hash) if a.feh_none_hash else None
    return MockConfig(
        handshake_address=a.handshake_address, ranks=a.ranks, step_interval_s=a.step_interval,
        tokens_per_step=a.tokens_per_step, output_len=a.output_len, word_ids=words,
        max_model_len=a.max_model_len, block_size=a.block_size, max_num_seqs=a.max_num_seqs,
        advertise_feh=a.advertise_feh, feh_block_size=a.feh_block_size, feh_none_hash=none_hash,
        verify_hashes=not a.no_verify_hashes, die_after_requests=a.die_after_requests, die_mode=a.die_mode,
        arrival_log=a.arrival_log, step_on_arrival=a.step_on_arrival,
        scripts=load_scripts(json.loads(Path(a.script_file).read_text()), a.tokenizer) if a.script_file else (),
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    if config.feh_none_hash is None and config.advertise_feh:
        config.feh_none_hash = default_none_hash()
    run_mock_engine(config)


if __name__ == "__main__":
    main(sys.argv[1:])
