"""The opt-in hostile-input tier: ~470 hand-written bad inputs against real `pyfront serve` processes.

Run with ``python -m pytest -q -rP --hostile -m hostile tests/tiers/test_hostile.py`` (or
``tools/hostile/run_tier.sh``). Two servers run as subprocesses, each `pyfront serve` against one mock engine
rank in its own process (``benchmarks/soak.py mock-rank``: the bundled mock engine plus a loopback endpoint
serving the rank's `mock_stats` counters, so the engine's running count can be read from outside):

- "open": no API key, the hermes tool parser and the qwen3 reasoning parser, a 1 MiB body limit,
  ``--max-num-seqs-in-flight 16`` and ``--request-read-timeout 3``;
- "keyed": the same with ``--api-key``, for the auth tricks.

The cases are organised by class (`CLASSES`, in the order they run): malformed JSON, wrong types in every field,
huge values, deep nesting, bad unicode and request ids, unknown fields, negative and huge numbers, invalid output
constraints, auth tricks, HTTP-level abuse, disconnect storms, slow clients, overload, and the engine dying last.
Every case is sent over a raw socket (so bytes no HTTP library would send can be sent) and its answer judged
clean only if it is what the API promises: a response with the expected status (a 4xx in the `{"error": {...}}`
shape for a bad request; a well-formed JSON body or SSE stream ending in ``[DONE]`` for an accepted one), never a
5xx, a dropped connection (unless closing is the right answer, after a 4xx with ``Connection: close``) or a hang.
After every class the engine's running count must come back to 0 (requests still running are leaked engine
requests); after the battery /health must answer 200.

Printed (``-rP``): cases tried, unclean answers and leaked engine requests per class, and every unclean case with
a minimal reproduction. Cases that guard one of issue 13's findings carry it (`KNOWN`) and are listed apart
from new ones; both count: the tier passes only when every case is clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.hostile

MODEL = "hostile"
KEY = "sk-hostile-test-key"
BODY_LIMIT = 1024 * 1024
READ_TIMEOUT_S = 3.0
MAX_IN_FLIGHT = 16
CASE_TIMEOUT_S = 20.0
"""A case that has no complete answer by then hangs."""
SETTLE_S = 8.0
"""After a class, how long the engine's running count may take to come back to 0."""
LATE_ARRIVAL_S = 2.0
"""After clients left, how long their requests may take to reach the engine (see `Server.settle`)."""

KNOWN = {
    "deep-json": "issue 13 item 5: JSON nested ~1000 levels gave 500 RecursionError",
    "chunked-413": "issue 13 item 6: a chunked body over the limit gave 500 on the completion routes",
    "request-id": "issue 13 item 4: a CR/LF/NUL/non-Latin-1 request_id must be a 400 up front",
    "constraints": "issue 13 item 7: invalid output constraints must be a 400",
    "nonstream-abort": "issue 13 item 2: a non-streaming client that leaves must abort its engine request",
    "ready-dead": "issue 13 item 8: /ready said 'starting' for a dead engine",
    "options": "issue 13 item 8: OPTIONS revealed which routes exist",
}
"""The issue findings some cases guard against: an unclean case is reported with the finding it brings back."""


# ---------------------------------------------------------------------------------------------- the servers


@dataclass
class Server:
    name: str
    port: int
    stats_port: int
    proc: subprocess.Popen
    mock: subprocess.Popen
    log: Path

    def running(self) -> int:
        """The mock engine's running count: requests it is still generating for."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/", timeout=5) as response:
            return sum(rank["running"] for rank in json.loads(response.read()))

    def settle(self, timeout: float = SETTLE_S, at_least: float = 0.0) -> int:
        """Wait for the running count to reach 0; what it is at the end (0, or the leaked requests).

        `at_least`: look for that long in any case, for requests that clients left before they reached the
        engine (rendering runs on a worker thread): a count of 0 before they arrive would prove nothing.
        """
        started = time.monotonic()
        while True:
            running = self.running()
            elapsed = time.monotonic() - started
            if (not running and elapsed >= at_least) or elapsed >= timeout:
                return running
            time.sleep(0.1)


def _stop(proc: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM the process group, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _start(name: str, tmp: Path, extra: list[str]) -> Server:
    port, rpc_port = free_port(), free_port()
    env = {**os.environ, "VLLM_NATIVE_FEH": "1", "PYTHONPATH": str(REPO_ROOT)}
    log = tmp / f"{name}.log"
    stats_file = tmp / f"{name}-mock.port"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyfront.server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--served-model-name", MODEL, "--data-parallel-rpc-port", str(rpc_port),
             "--max-num-seqs-in-flight", str(MAX_IN_FLIGHT), "--request-read-timeout", str(READ_TIMEOUT_S),
             "--max-request-body-bytes", str(BODY_LIMIT), "--tool-call-parser", "hermes",
             "--enable-auto-tool-choice", "--reasoning-parser", "qwen3", "--uvicorn-log-level", "warning",
             "--disable-uvicorn-access-log", "--engine-startup-timeout", "60", *extra],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    mock_args = ["--handshake-address", f"tcp://127.0.0.1:{rpc_port}", "--ranks", "0", "--step-interval", "0.005",
                 "--output-len", "24", "--advertise-feh", "--log-level", "WARNING"]  # fmt: skip
    with open(tmp / f"{name}-mock.log", "wb") as out:
        mock = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "benchmarks" / "soak.py"), "mock-rank", str(stats_file), "--", *mock_args],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (stats_file.exists() and _health(port) == 200):
        if time.monotonic() > deadline or proc.poll() is not None or mock.poll() is not None:
            _stop(proc, 5)
            _stop(mock, 5)
            pytest.fail(f"server {name} did not become healthy:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return Server(name, port, int(stats_file.read_text()), proc, mock, log)


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    tmp = tmp_path_factory.mktemp("hostile")
    started: dict[str, Server] = {}
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {"open": pool.submit(_start, "open", tmp, []),
                       "keyed": pool.submit(_start, "keyed", tmp, ["--api-key", KEY])}  # fmt: skip
            for name, future in futures.items():
                started[name] = future.result()
        yield started
    finally:
        for server in started.values():
            _stop(server.proc)
            _stop(server.mock, 5)


# ---------------------------------------------------------------------------------------------- raw HTTP


@dataclass
class Answer:
    status: int | None = None
    """None: no status line (the connection was dropped, or the case hung)."""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    hung: bool = False
    closed: bool = False
    """The server closed the connection after (or instead of) answering."""
    error: str = ""


def _recv_until(sock: socket.socket, buffer: bytearray, marker: bytes) -> int:
    while (index := buffer.find(marker)) < 0:
        piece = sock.recv(65536)
        if not piece:
            raise EOFError
        buffer += piece
    return index


def _recv_exactly(sock: socket.socket, buffer: bytearray, size: int) -> None:
    while len(buffer) < size:
        piece = sock.recv(65536)
        if not piece:
            raise EOFError
        buffer += piece


def read_answer(sock: socket.socket, head_only: bool = False) -> Answer:
    """One HTTP response off `sock` (by Content-Length, chunked, or up to the close); with `head_only` the status
    line and headers, and for anything but a 200 the body too."""
    answer = Answer()
    buffer = bytearray()
    try:
        while answer.status is None or 100 <= answer.status < 200:  # interim answers (100 Continue) are skipped
            end = _recv_until(sock, buffer, b"\r\n\r\n")
            lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
            del buffer[: end + 4]
            answer.status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            answer.headers[name.strip().lower()] = value.strip()
        if head_only and answer.status == 200:
            return answer
        if "content-length" in answer.headers:
            length = int(answer.headers["content-length"])
            _recv_exactly(sock, buffer, length)
            answer.body = bytes(buffer[:length])  # a refusal of what followed the request may come next
        elif answer.headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                end = _recv_until(sock, buffer, b"\r\n")
                size = int(bytes(buffer[:end]).split(b";")[0], 16)
                del buffer[: end + 2]
                _recv_exactly(sock, buffer, size + 2)
                body += buffer[:size]
                del buffer[: size + 2]
                if size == 0:
                    break
            answer.body = bytes(body)
        else:
            while piece := sock.recv(65536):
                buffer += piece
            answer.body = bytes(buffer)
            answer.closed = True
        if answer.headers.get("connection", "").lower() == "close":
            answer.closed = True
    except (EOFError, ConnectionResetError, BrokenPipeError):
        answer.closed = True
        answer.body = bytes(buffer)
    except TimeoutError:
        answer.hung = True
    return answer


def exchange(port: int, raw: bytes, timeout: float = CASE_TIMEOUT_S) -> Answer:
    """Send `raw` on a fresh connection and read one answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
        except (ConnectionResetError, BrokenPipeError) as exc:  # refused mid-send: the answer may still be there
            answer = read_answer(sock)
            answer.error = answer.error or type(exc).__name__
            return answer
        if raw.startswith(b"HEAD "):
            sock.settimeout(2)  # a HEAD answer has a Content-Length but no body: read the head, then stop
            answer = read_answer(sock)
            answer.hung = answer.status is None and answer.hung
            return answer
        return read_answer(sock)


def request_bytes(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    key: str | None = None,
    content_type: str | None = "application/json",
) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body is not None and content_type:
        head += f"Content-Type: {content_type}\r\n"
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode("utf-8", "surrogateescape") + b"\r\n" + (body or b"")


# ---------------------------------------------------------------------------------------------- cases

ANY_4XX = frozenset(range(400, 500))
OK = frozenset({200})
OK_OR_400 = frozenset({200, 400})


@dataclass
class Case:
    cls: str
    name: str
    raw: bytes = b""
    expect: frozenset[int] = ANY_4XX
    server: str = "open"
    known: str | None = None
    repro: str = ""
    """A minimal reproduction; by default a curl line made from the request (bodies over 300 bytes described)."""
    run: Callable[[dict[str, Server]], list[str]] | None = None
    """A scenario instead of one request: returns the reasons it was unclean (empty: clean)."""


@dataclass
class Outcome:
    case: Case
    reasons: list[str]


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}


def body_case(
    cls: str,
    name: str,
    path: str,
    body: Any,
    expect: frozenset[int] = frozenset({400}),
    *,
    known: str | None = None,
    server: str = "open",
) -> Case:
    """A POST of `body`: bytes as they are, anything else as JSON."""
    raw_body = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Case(cls, name, request_bytes("POST", path, raw_body), expect, server, known)


def _nest(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _nest_obj(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def malformed_json() -> list[Case]:
    bodies = {
        "empty": b"",
        "open brace": b"{",
        "close brace": b"}",
        "open bracket": b"[",
        "null": b"null",
        "true": b"true",
        "number": b"1",
        "string": b'"x"',
        "array": b"[]",
        "single quotes": b"{'model': 'hostile'}",
        "trailing comma": b'{"model": "hostile",}',
        "NaN": b'{"model": "hostile", "temperature": NaN}',
        "comment": b'{"model": "hostile" /* c */}',
        "two objects": b'{"model": "hostile"}{"model": "hostile"}',
        "truncated string": b'{"model": "host',
        "bad escape": b'{"model": "\\x41"}',
        "raw control char": b'{"model": "a\x01b"}',
        "invalid utf-8": b'{"model": "\xff\xfe"}',
        "utf-16": '{"model": "hostile"}'.encode("utf-16"),
        "bom": b'\xef\xbb\xbf{"model": "hostile"}',
        "garbage": b"\x00\x01\x02\x03",
    }
    cases = []
    for path in (CHAT, COMPLETIONS, "/tokenize", "/detokenize"):
        for name, body in bodies.items():
            cases.append(body_case("malformed JSON", f"{path} {name}", path, body))
    return cases


def wrong_types() -> list[Case]:
    """Every field of the chat and completion requests with a value of a type it cannot be."""
    chat_fields: dict[str, Any] = {
        "model": 5, "messages": "x", "frequency_penalty": "x", "presence_penalty": [], "logit_bias": [],
        "seed": "x", "stop": 5, "stream": "x", "stream_options": 5, "temperature": "x", "top_p": {}, "user": 5,
        "response_format": "json", "use_beam_search": "x", "top_k": "x", "min_p": [], "repetition_penalty": "x",
        "length_penalty": "x", "stop_token_ids": "x", "include_stop_str_in_output": "x", "ignore_eos": "x",
        "min_tokens": "x", "skip_special_tokens": "x", "spaces_between_special_tokens": "x",
        "truncate_prompt_tokens": "x", "prompt_logprobs": "x", "allowed_token_ids": "x", "bad_words": 5,
        "structured_outputs": "x", "guided_json": 5, "guided_regex": 5, "guided_choice": "x", "guided_grammar": 5,
        "priority": "x", "request_id": 5, "cache_salt": 5, "return_tokens_as_token_ids": "x", "vllm_xargs": 5,
        "logprobs": "x", "top_logprobs": "x", "max_tokens": "x", "max_completion_tokens": [], "n": "x",
        "tools": "x", "tool_choice": 5, "parallel_tool_calls": "x", "reasoning_effort": 5, "echo": "x",
        "add_generation_prompt": "x", "continue_final_message": "x", "documents": "x", "chat_template_kwargs": 5,
        "thinking_token_budget": "x", "truncation_side": "middle",
    }  # fmt: skip
    completion_fields: dict[str, Any] = {
        "prompt": 5, "echo": "x", "logprobs": "x", "max_tokens": "x", "n": "x", "suffix": 5, "seed": [],
        "stop": {}, "stream": [], "temperature": {}, "logit_bias": "x", "add_special_tokens": "x",
    }  # fmt: skip
    cases = [body_case("wrong types", f"chat {name}={value!r}", CHAT, chat(**{name: value}))
             for name, value in chat_fields.items()]  # fmt: skip
    cases += [body_case("wrong types", f"completion {name}={value!r}", COMPLETIONS, completion(**{name: value}))
              for name, value in completion_fields.items()]  # fmt: skip
    messages: dict[str, Any] = {
        "message not an object": [1],
        "role missing": [{"content": "x"}],
        "role a number": [{"role": 5, "content": "x"}],
        "content a number": [{"role": "user", "content": 5}],
        "content part not an object": [{"role": "user", "content": [5]}],
        "content part type a number": [{"role": "user", "content": [{"type": 5, "text": "x"}]}],
        "tool call without function": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]}],
        "tool call arguments a number": [
            {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": 5}}]}
        ],
    }
    cases += [body_case("wrong types", f"chat messages: {name}", CHAT, chat(messages=value))
              for name, value in messages.items()]  # fmt: skip
    tools: dict[str, Any] = {
        "tool not an object": ["x"],
        "tool without function": [{"type": "function"}],
        "function name a number": [{"type": "function", "function": {"name": 5}}],
        "parameters a string": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
    }
    cases += [body_case("wrong types", f"chat tools: {name}", CHAT, chat(tools=value))
              for name, value in tools.items()]  # fmt: skip
    cases += [
        body_case("wrong types", "completion prompt list of mixed types", COMPLETIONS, completion(prompt=[1, "a"])),
        body_case("wrong types", "completion prompt list of objects", COMPLETIONS, completion(prompt=[{}])),
        body_case("wrong types", "completion prompt float ids", COMPLETIONS, completion(prompt=[1.5, 2.5])),
        body_case("wrong types", "tokenize prompt a number", "/tokenize", {"model": MODEL, "prompt": 5}),
        body_case("wrong types", "tokenize messages a string", "/tokenize", {"model": MODEL, "messages": "x"}),
        body_case("wrong types", "detokenize tokens a string", "/detokenize", {"model": MODEL, "tokens": "x"}),
        body_case("wrong types", "detokenize tokens strings", "/detokenize", {"model": MODEL, "tokens": ["a"]}),
        body_case("wrong types", "detokenize tokens missing", "/detokenize", {"model": MODEL}),
        body_case("wrong types", "chat messages missing", CHAT, {"model": MODEL}),
        body_case("wrong types", "completion prompt missing", COMPLETIONS, {"model": MODEL}),
    ]
    return cases


def huge_values() -> list[Case]:
    c = "huge values"
    return [
        body_case(c, "max_tokens 10**12", CHAT, chat(max_tokens=10**12)),
        body_case(c, "max_tokens 2**64", COMPLETIONS, completion(max_tokens=2**64)),
        body_case(c, "max_completion_tokens 2**62", CHAT, chat(max_tokens=None, max_completion_tokens=2**62)),
        body_case(c, "n 10**6", CHAT, chat(n=10**6)),
        body_case(c, "n 1000 (more than --max-num-seqs-in-flight: never admissible)", COMPLETIONS, completion(n=1000)),
        body_case(c, "top_logprobs 10**6", CHAT, chat(logprobs=True, top_logprobs=10**6)),
        body_case(c, "logprobs 10**6", COMPLETIONS, completion(logprobs=10**6)),
        body_case(c, "prompt_logprobs 10**6", COMPLETIONS, completion(prompt_logprobs=10**6)),
        body_case(c, "prompt longer than the model", COMPLETIONS, completion(prompt="hello " * 150_000)),
        body_case(c, "chat longer than the model", CHAT, chat(messages=[{"role": "user", "content": "hi " * 150_000}])),
        body_case(c, "prompt ids longer than the model", COMPLETIONS, completion(prompt=[100] * 100_000)),
        body_case(c, "20000 messages", CHAT, chat(messages=[{"role": "user", "content": "a"}] * 20_000)),
        body_case(c, "10000 stop strings", CHAT, chat(stop=[f"s{i}" for i in range(10_000)]), OK_OR_400),
        body_case(c, "stop string of 200 KB", CHAT, chat(stop=["x" * 200_000]), OK_OR_400),
        body_case(c, "50000 logit_bias entries", CHAT, chat(logit_bias={str(i): 1 for i in range(50_000)}), OK_OR_400),
        body_case(c, "50000 stop_token_ids", CHAT, chat(stop_token_ids=list(range(50_000))), OK_OR_400),
        body_case(c, "seed 2**64", CHAT, chat(seed=2**64)),
        body_case(c, "temperature 1e308", CHAT, chat(temperature=1e308), OK_OR_400),
        body_case(c, "temperature 1e400 (inf)", CHAT, b'{"model": "hostile", "messages": [], "temperature": 1e400}'),
        body_case(c, "priority 2**70", CHAT, chat(priority=2**70)),
        body_case(c, "min_tokens 10**9", CHAT, chat(min_tokens=10**9)),
        body_case(c, "truncate_prompt_tokens 10**12", COMPLETIONS, completion(truncate_prompt_tokens=10**12)),
        body_case(c, "body over the limit (Content-Length)", CHAT, chat(pad="x" * (BODY_LIMIT + 10)), frozenset({413})),
        body_case(
            c, "body over the limit on /tokenize", "/tokenize", {"prompt": "x" * (BODY_LIMIT + 10)}, frozenset({413})
        ),
        body_case(
            c,
            "500 tools",
            CHAT,
            chat(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(500)]),
            OK_OR_400,
        ),
        body_case(c, "detokenize 100000 ids", "/detokenize", {"model": MODEL, "tokens": [100] * 100_000}, OK),
        body_case(c, "detokenize id 2**40", "/detokenize", {"model": MODEL, "tokens": [2**40]}),
    ]


def deep_nesting() -> list[Case]:
    """JSON nested 1,000 to 100,000 levels, in every kind of place a value can go."""
    c = "deep nesting"
    cases = []
    for depth in (1000, 10_000, 100_000):
        nested = _nest(depth)
        places = {
            f"chat content {depth}": f'{{"model": "hostile", "messages": [{{"role": "user", "content": {nested}}}]}}',
            f"chat unknown field {depth}": f'{{"model": "hostile", "messages": [], "x": {nested}}}',
            f"completion prompt {depth}": f'{{"model": "hostile", "prompt": {nested}}}',
            f"tokenize {depth}": f'{{"prompt": {nested}}}',
            f"detokenize {depth}": f'{{"tokens": {nested}}}',
        }  # fmt: skip
        paths = [CHAT, CHAT, COMPLETIONS, "/tokenize", "/detokenize"]
        for (name, body), path in zip(places.items(), paths, strict=True):
            cases.append(body_case(c, name, path, body.encode(), known="deep-json"))
    objects = {
        "tool parameters": chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "@"}}]),
        "guided_json": chat(guided_json="@"),
        "chat_template_kwargs": chat(chat_template_kwargs={"a": "@"}),
        "response_format schema": chat(response_format={"type": "json_schema",
                                                        "json_schema": {"name": "n", "schema": "@"}}),
        "vllm_xargs": chat(vllm_xargs={"a": "@"}),
        "top level array": "@",
    }  # fmt: skip
    for name, template in objects.items():
        body = json.dumps(template).replace('"@"', _nest_obj(2000)).encode()
        cases.append(body_case(c, f"{name} 2000", CHAT, body, known="deep-json"))
    return cases


def bad_unicode() -> list[Case]:
    """Lone surrogates, NUL, CR/LF and non-Latin-1 characters in strings, and in the request id above all."""
    c = "bad unicode"
    surrogate = '"\\ud800"'
    cases = [
        body_case(
            c,
            "lone surrogate in content",
            CHAT,
            f'{{"model": "hostile", "messages": [{{"role": "user", "content": {surrogate}}}]}}'.encode(),
            OK_OR_400,
        ),
        body_case(
            c,
            "lone surrogate in model",
            CHAT,
            f'{{"model": {surrogate}, "messages": [], "max_tokens": 4}}'.encode(),
            frozenset({400, 404}),
        ),
        body_case(
            c,
            "lone surrogate in stop",
            CHAT,
            f'{{"model": "hostile", "messages": [{{"role": "user", "content": "hi"}}], "stop": {surrogate}}}'.encode(),
            OK_OR_400,
        ),
        body_case(
            c,
            "lone surrogate in prompt",
            COMPLETIONS,
            f'{{"model": "hostile", "prompt": {surrogate}, "max_tokens": 4}}'.encode(),
            OK_OR_400,
        ),
        body_case(c, "lone surrogate in tokenize", "/tokenize", f'{{"prompt": {surrogate}}}'.encode(), OK_OR_400),
        body_case(
            c,
            "invalid utf-8 in content",
            CHAT,
            b'{"model": "hostile", "messages": [{"role": "user", "content": "\xc0\xaf"}]}',
        ),
        body_case(c, "NUL in content", CHAT, chat(messages=[{"role": "user", "content": "a\u0000b"}]), OK),
        body_case(c, "NUL in prompt", COMPLETIONS, completion(prompt="a\u0000b"), OK),
        body_case(c, "CR/LF in content", CHAT, chat(messages=[{"role": "user", "content": "a\r\nb"}]), OK),
        body_case(
            c, "U+2028 and RTL in content", CHAT, chat(messages=[{"role": "user", "content": "\u2028\u202e"}]), OK
        ),
        body_case(c, "emoji and combining marks", COMPLETIONS, completion(prompt="e\u0301\U0001f600" * 50), OK),
        body_case(
            c, "NUL in tool name", CHAT, chat(tools=[{"type": "function", "function": {"name": "a\u0000"}}]), OK_OR_400
        ),
        body_case(c, "CR/LF in model", CHAT, chat(model="a\r\nb"), frozenset({400, 404})),
        body_case(c, "non-Latin-1 model", CHAT, chat(model="模型"), frozenset({404})),
    ]
    request_ids = {"CR/LF": "a\r\nX-Injected: 1", "LF": "a\nb", "NUL": "a\u0000b", "non-Latin-1": "id-€",
                   "lone surrogate": "\ud800", "DEL": "a\u007fb"}  # fmt: skip
    cases.append(body_case(c, "request_id with a tab (a valid header value)", CHAT, chat(request_id="a\tb"), OK))
    for name, rid in request_ids.items():
        for stream in (False, True):
            for path, body in ((CHAT, chat(request_id=rid, stream=stream)),
                               (COMPLETIONS, completion(request_id=rid, stream=stream))):  # fmt: skip
                raw = json.dumps(body).encode()
                label = f"{'stream' if stream else 'non-stream'} {path} request_id with {name}"
                cases.append(Case(c, label, request_bytes("POST", path, raw), frozenset({400}), known="request-id"))
    cases.append(body_case(c, "request_id of 100 KB", CHAT, chat(request_id="r" * 100_000), OK_OR_400))
    for name, value in (("non-ASCII bytes", "id-\udce9"), ("very long", "r" * 8000)):
        cases.append(Case(c, f"X-Request-Id header {name}", request_bytes("POST", CHAT, json.dumps(chat()).encode(),
                                                                           {"X-Request-Id": value}), OK))  # fmt: skip
    return cases


def unknown_fields() -> list[Case]:
    c = "unknown fields"
    return [
        body_case(c, "top-level unknown field", CHAT, chat(frobnicate=1), OK),
        body_case(c, "1000 unknown fields", CHAT, chat(**{f"x{i}": i for i in range(1000)}), OK),
        body_case(c, "__proto__ and constructor", CHAT, chat(__proto__={"admin": True}, constructor=1), OK),
        body_case(
            c, "unknown field in a message", CHAT, chat(messages=[{"role": "user", "content": "hi", "x": 1}]), OK
        ),
        body_case(
            c,
            "unknown field in a tool",
            CHAT,
            chat(tools=[{"type": "function", "x": 1, "function": {"name": "f", "y": 2}}]),
            OK,
        ),
        body_case(c, "unknown field in completions", COMPLETIONS, completion(frobnicate=[1, 2]), OK),
        body_case(c, "unknown field in tokenize", "/tokenize", {"prompt": "hi", "frobnicate": 1}, OK),
        body_case(
            c,
            "unknown role (vLLM takes custom roles)",
            CHAT,
            chat(messages=[{"role": "wizard", "content": "hi"}]),
            OK_OR_400,
        ),
        body_case(
            c, "unknown content part type", CHAT, chat(messages=[{"role": "user", "content": [{"type": "hologram"}]}])
        ),
        body_case(c, "unknown model", CHAT, chat(model="no-such-model"), frozenset({404})),
        body_case(c, "prompt_embeds", COMPLETIONS, completion(prompt_embeds="AAAA")),
    ]


def numbers() -> list[Case]:
    c = "numbers"
    bad_chat = {
        "max_tokens -1": {"max_tokens": -1}, "max_tokens 0": {"max_tokens": 0}, "temperature -1": {"temperature": -1},
        "top_p 0": {"top_p": 0}, "top_p 1.5": {"top_p": 1.5}, "top_k -2": {"top_k": -2}, "n 0": {"n": 0},
        "n -1": {"n": -1},
        "top_logprobs 21": {"logprobs": True, "top_logprobs": 21}, "presence_penalty 3": {"presence_penalty": 3},
        "frequency_penalty -3": {"frequency_penalty": -3}, "repetition_penalty 0": {"repetition_penalty": 0},
        "min_p 2": {"min_p": 2}, "min_tokens -1": {"min_tokens": -1},
        "min_tokens over max_tokens": {"min_tokens": 10, "max_tokens": 4},
        "allowed_token_ids out of vocab": {"allowed_token_ids": [10**9]},
        "logit_bias id out of vocab": {"logit_bias": {"1000000000": 1}},
        "logit_bias id not a number": {"logit_bias": {"a": 1}},
        "truncate_prompt_tokens -5": {"truncate_prompt_tokens": -5},
        "max_completion_tokens 0": {"max_tokens": None, "max_completion_tokens": 0},
    }  # fmt: skip
    cases = [body_case(c, f"chat {name}", CHAT, chat(**fields)) for name, fields in bad_chat.items()]
    bad_completion = {
        "logprobs -1": {"logprobs": -1}, "logprobs 21": {"logprobs": 21}, "prompt id -1": {"prompt": [-1]},
        "prompt id past vocab": {"prompt": [10**9]}, "n 0": {"n": 0}, "max_tokens -1": {"max_tokens": -1},
        "empty prompt list": {"prompt": []}, "empty id list": {"prompt": [[]]},
    }  # fmt: skip
    cases += [body_case(c, f"completion {name}", COMPLETIONS, completion(**fields))
              for name, fields in bad_completion.items()]  # fmt: skip
    cases += [
        body_case(c, "detokenize id -1", "/detokenize", {"model": MODEL, "tokens": [-1]}),
        body_case(c, "seed -1", CHAT, chat(seed=-1), OK_OR_400),
        body_case(
            c, "top_logprobs -1 (all the vocabulary in vLLM)", CHAT, chat(logprobs=True, top_logprobs=-1), OK_OR_400
        ),
        body_case(c, "prompt_logprobs -1", COMPLETIONS, completion(prompt_logprobs=-1), OK_OR_400),
        body_case(c, "stop_token_ids negative", CHAT, chat(stop_token_ids=[-1]), OK_OR_400),
        body_case(c, "thinking_token_budget -1", CHAT, chat(thinking_token_budget=-1), OK_OR_400),
        body_case(c, "priority -1", CHAT, chat(priority=-1), OK_OR_400),
        body_case(c, "temperature 0", CHAT, chat(temperature=0), OK),
        body_case(c, "max_tokens 1.0", CHAT, chat(max_tokens=1.0), OK_OR_400),
        body_case(c, "logit_bias 1000", CHAT, chat(logit_bias={"100": 1000}), OK_OR_400),
        body_case(c, "completion max_tokens 0 echo", COMPLETIONS, completion(max_tokens=0, echo=True), OK),
    ]
    return cases


def constraints() -> list[Case]:
    """Output constraints vLLM's front end refuses with 400 (its structured-output validation)."""
    c = "output constraints"
    bad_schema = {"type": 5}
    tool = {"type": "function", "function": {"name": "f", "parameters": bad_schema}}
    strict_tool = {"type": "function", "function": {"name": "f", "parameters": bad_schema, "strict": True}}
    known = [
        ("structured_outputs.grammar unbalanced", chat(structured_outputs={"grammar": "root ::= ("})),
        ("guided_grammar unbalanced", chat(guided_grammar="root ::= (")),
        ("guided_json type 5", chat(guided_json=bad_schema)),
        ("structured_outputs.json type 5", chat(structured_outputs={"json": bad_schema})),
        ("guided_json not JSON", chat(guided_json="{not json")),
        ("guided_regex unbalanced", chat(guided_regex="(")),
        ("structured_outputs.regex unbalanced", chat(structured_outputs={"regex": "[a-"})),
        ("response_format json_schema type 5",
         chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": bad_schema}})),
        ("response_format structural tag unknown type",
         chat(response_format={"type": "structural_tag", "format": {"type": "no_such_format"}})),
        ("strict tool invalid schema, tool_choice required", chat(tools=[strict_tool], tool_choice="required")),
        ("strict tool invalid schema, tool_choice named",
         chat(tools=[strict_tool], tool_choice={"type": "function", "function": {"name": "f"}})),
        ("completion guided_json type 5", completion(guided_json=bad_schema)),
        ("completion grammar unbalanced", completion(structured_outputs={"grammar": "root ::= ("})),
    ]  # fmt: skip
    cases = [body_case(c, name, COMPLETIONS if name.startswith("completion") else CHAT, body, known="constraints")
             for name, body in known]  # fmt: skip
    valid_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    # What vLLM 0.32 accepts although the schema is invalid, and so does pyfront (its verdict is vLLM's, checked
    # against vLLM's own code in the real-engine tier): a non-strict tool's arguments are left free under a forced
    # tool choice, and a legacy structural tag's schema is only compiled by llguidance, in the engine.
    cases += [
        body_case(c, "non-strict tool invalid schema, tool_choice required (vLLM accepts)", CHAT,
                  chat(tools=[tool], tool_choice="required"), OK),
        body_case(c, "non-strict tool invalid schema, tool_choice named (vLLM accepts)", CHAT,
                  chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}), OK),
        body_case(c, "legacy structural tag with an invalid schema (vLLM accepts)", CHAT,
                  chat(response_format={"type": "structural_tag", "triggers": ["<"],
                                        "structures": [{"begin": "<a>", "schema": bad_schema, "end": "</a>"}]}), OK),
    ]  # fmt: skip
    cases += [
        body_case(c, "two constraints at once", CHAT, chat(guided_json={"type": "object"}, guided_regex="a+"),
                  known="constraints"),
        body_case(c, "guided_choice empty", CHAT, chat(guided_choice=[]), known="constraints"),
        body_case(c, "named tool_choice not among the tools", CHAT,
                  chat(tools=[valid_tool], tool_choice={"type": "function", "function": {"name": "g"}})),
        body_case(c, "tool_choice required without tools", CHAT, chat(tool_choice="required")),
        body_case(c, "response_format unknown type", CHAT, chat(response_format={"type": "xml"}), known="constraints"),
        body_case(c, "valid json_schema (control)", CHAT,
                  chat(response_format={"type": "json_schema",
                                        "json_schema": {"name": "n", "schema": {"type": "object"}}}), OK),
        body_case(c, "valid required tool (control)", CHAT, chat(tools=[valid_tool], tool_choice="required"), OK),
    ]  # fmt: skip
    return cases


def auth() -> list[Case]:
    """Key tricks on the keyed server: nothing but `Authorization: Bearer KEY` may pass, on any path."""
    c = "auth"
    body = json.dumps(chat()).encode()
    variants: dict[str, tuple[dict[str, str], frozenset[int]]] = {
        "no Authorization": ({}, frozenset({401})),
        "Bearer, no key": ({"Authorization": "Bearer"}, frozenset({401})),
        "Bearer and a space": ({"Authorization": "Bearer "}, frozenset({401})),
        "wrong key": ({"Authorization": "Bearer sk-wrong"}, frozenset({401})),
        "key prefix": ({"Authorization": f"Bearer {KEY[:-1]}"}, frozenset({401})),
        "key plus a character": ({"Authorization": f"Bearer {KEY}x"}, frozenset({401})),
        "key with a trailing space": ({"Authorization": f"Bearer {KEY} "}, frozenset({200, 401})),
        "two spaces": ({"Authorization": f"Bearer  {KEY}"}, frozenset({401})),
        "lower-case scheme": ({"Authorization": f"bearer {KEY}"}, frozenset({200, 401})),
        "upper-case scheme": ({"Authorization": f"BEARER {KEY}"}, frozenset({200, 401})),
        "upper-case key": ({"Authorization": f"Bearer {KEY.upper()}"}, frozenset({401})),
        "Basic scheme": ({"Authorization": "Basic c2staG9zdGlsZTp4"}, frozenset({401})),
        "Token scheme": ({"Authorization": f"Token {KEY}"}, frozenset({401})),
        "bare key": ({"Authorization": KEY}, frozenset({401})),
        "key in X-API-Key": ({"X-API-Key": KEY}, frozenset({401})),
        "key in api-key": ({"api-key": KEY}, frozenset({401})),
        "key in Proxy-Authorization": ({"Proxy-Authorization": f"Bearer {KEY}"}, frozenset({401})),
        "garbled bytes": ({"Authorization": "Bearer \udcff\udcfe"}, frozenset({401})),
        "overlong (60 KB)": ({"Authorization": "Bearer " + "k" * 60_000}, frozenset({401})),
        "overlong (70 KB)": ({"Authorization": "Bearer " + "k" * 70_000}, frozenset({431})),
    }
    cases = []
    for name, (headers, expect) in variants.items():
        cases.append(Case(c, f"chat {name}", request_bytes("POST", CHAT, body, headers), expect, "keyed"))
        cases.append(Case(c, f"models {name}", request_bytes("GET", "/v1/models", None, headers), expect, "keyed"))
    twice = f"Authorization: Bearer sk-wrong\r\nAuthorization: Bearer {KEY}\r\n"
    cases.append(Case(c, "wrong key then the right one", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + twice.encode()
                      + b"\r\n", frozenset({200, 401}), "keyed"))  # fmt: skip
    cases.append(Case(c, "key in the query", request_bytes("GET", f"/v1/models?api_key={KEY}"), frozenset({401}),
                      "keyed"))  # fmt: skip
    for path in ("/v1/models/", "//v1/models", "/v1/../v1/models", "/health/../v1/models", "/V1/MODELS",
                 "/v1/models%2f", "/v1/models#/health", "/v1/models?/health", "/tokenize", "/detokenize",
                 "/openapi.json", "/docs", "/version", "/load"):  # fmt: skip
        cases.append(Case(c, f"GET {path} without a key", request_bytes("GET", path), frozenset({401, 404, 405}),
                          "keyed"))  # fmt: skip
    for path in ("/health", "/ready", "/metrics"):
        cases.append(Case(c, f"open route {path}", request_bytes("GET", path), OK, "keyed"))
    cases.append(Case(c, "HEAD /v1/models without a key", request_bytes("HEAD", "/v1/models"), frozenset({401, 405}),
                      "keyed"))  # fmt: skip
    for path in (CHAT, "/v1/models", "/tokenize", "/no-such-route"):
        cases.append(Case(c, f"OPTIONS {path} without a key", request_bytes("OPTIONS", path), frozenset({401}),
                          "keyed", known="options"))  # fmt: skip
    return cases


def http_abuse() -> list[Case]:
    c = "HTTP abuse"
    small = json.dumps(completion()).encode()
    cl_head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    cases = [
        Case(c, "1 MiB header", request_bytes("GET", "/v1/models", None, {"X-Big": "a" * (1 << 20)}),
             frozenset({431}), repro="a GET /v1/models with one 1 MiB header"),
        Case(c, "64 MiB header", request_bytes("GET", "/v1/models", None, {"X-Big": "a" * (64 << 20)}),
             frozenset({431}), repro="a GET /v1/models with one 64 MiB header"),
        Case(c, "1 MiB URL", request_bytes("GET", "/v1/models?" + "a" * (1 << 20)), frozenset({431}),
             repro="a GET with a 1 MiB query string"),
        Case(c, "1000 headers", request_bytes("GET", "/v1/models", None, {f"X-H{i}": "v" for i in range(1000)}),
             frozenset({431}), repro="a GET /v1/models with 1000 headers"),
        Case(c, "unknown method FOO", b"FOO /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", frozenset({400, 405, 501})),
        Case(c, "PUT /v1/models", request_bytes("PUT", "/v1/models", b"{}"), frozenset({405})),
        Case(c, "DELETE chat", request_bytes("DELETE", CHAT), frozenset({405})),
        Case(c, "PATCH completions", request_bytes("PATCH", COMPLETIONS, small), frozenset({405})),
        Case(c, "TRACE /", request_bytes("TRACE", "/"), frozenset({404, 405})),
        Case(c, "GET chat", request_bytes("GET", CHAT), frozenset({405})),
        Case(c, "POST /health", request_bytes("POST", "/health", b"{}"), frozenset({405})),
        Case(c, "POST unknown route", request_bytes("POST", "/v1/embeddings", small), frozenset({404})),
        Case(c, "CONNECT", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
             frozenset({400, 404, 405})),
        Case(c, "HTTP/0.9", b"GET /\r\n\r\n", frozenset({400, 404})),
        Case(c, "HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", frozenset({400, 505})),
        Case(c, "HTTP/9.9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", frozenset({400, 505})),
        Case(c, "no Host header", b"GET /health HTTP/1.1\r\n\r\n", frozenset({200, 400})),
        Case(c, "header name with a space", b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
             frozenset({400})),
        Case(c, "NUL in a header value", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", frozenset({400})),
        Case(c, "obs-fold header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
             frozenset({200, 400})),
        Case(c, "Content-Type text/plain", request_bytes("POST", CHAT, json.dumps(chat()).encode(),
                                                         content_type="text/plain"), frozenset({200, 400, 415})),
        Case(c, "Content-Type form", request_bytes("POST", CHAT, b"model=hostile",
                                                   content_type="application/x-www-form-urlencoded"),
             frozenset({400, 415})),
        Case(c, "Content-Type multipart", request_bytes("POST", COMPLETIONS, b"--b\r\n\r\nx\r\n--b--",
                                                        content_type="multipart/form-data; boundary=b"),
             frozenset({400, 415})),
        Case(c, "Content-Type utf-16 charset", request_bytes("POST", CHAT, json.dumps(chat()).encode(),
                                                             content_type="application/json; charset=utf-16"),
             frozenset({200, 400, 415})),
        Case(c, "Content-Encoding gzip, body plain", request_bytes("POST", CHAT, json.dumps(chat()).encode(),
                                                                   {"Content-Encoding": "gzip"}),
             frozenset({200, 400, 415})),
        Case(c, "Content-Length and Transfer-Encoding",
             cl_head + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", frozenset({400})),
        Case(c, "two different Content-Lengths", cl_head + b"Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
             frozenset({400})),
        Case(c, "negative Content-Length", cl_head + b"Content-Length: -1\r\n\r\n", frozenset({400})),
        Case(c, "non-numeric Content-Length", cl_head + b"Content-Length: abc\r\n\r\n", frozenset({400})),
        Case(c, "Transfer-Encoding gzip", cl_head + b"Transfer-Encoding: gzip\r\n\r\nxx", frozenset({400, 501})),
        Case(c, "bad chunk size", cl_head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
             frozenset({400})),
        Case(c, "Content-Length smaller than the body", cl_head + b"Content-Length: 10\r\n\r\n" + small,
             frozenset({400})),
        Case(c, "Expect: 100-continue", request_bytes("POST", COMPLETIONS, small, {"Expect": "100-continue"}), OK),
        Case(c, "Upgrade: websocket", request_bytes("GET", "/v1/models", None, {"Connection": "Upgrade",
             "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}),
             frozenset({200, 400, 403, 404, 426})),
        Case(c, "Upgrade: h2c", request_bytes("GET", "/v1/models", None, {"Connection": "Upgrade, HTTP2-Settings",
             "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQAAP__"}), frozenset({200, 400})),
    ]  # fmt: skip
    for path, known in ((CHAT, "chunked-413"), (COMPLETIONS, "chunked-413"), ("/tokenize", None)):
        chunk = b"x" * 65536
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(BODY_LIMIT // len(chunk) + 2))
        raw = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + body + b"0\r\n\r\n"  # fmt: skip
        cases.append(Case(c, f"chunked body over the limit on {path}", raw, frozenset({413}), known=known,
                          repro=f"a chunked POST {path} of {BODY_LIMIT // 65536 + 2} x 64 KiB chunks "
                          f"(limit {BODY_LIMIT})"))  # fmt: skip
        raw = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {BODY_LIMIT + 1}"
        cases.append(Case(c, f"Content-Length over the limit on {path}", raw.encode() + b"\r\n\r\n{",
                          frozenset({413})))  # fmt: skip
    return cases


# ---------------------------------------------------------------------------------------------- scenarios


def _stream_request(path: str, **fields: Any) -> bytes:
    body = (chat if path == CHAT else completion)(stream=True, **fields)
    return request_bytes("POST", path, json.dumps(body).encode())


def _abandon(port: int, raw: bytes, after_events: int | None, reset: bool) -> None:
    """Send `raw`, then close: at once (`after_events` None), after the response head (0), or after that many SSE
    events; with `reset`, by RST instead of FIN."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=CASE_TIMEOUT_S)
    try:
        sock.sendall(raw)
        if after_events is not None:
            seen = b""
            while b"\r\n\r\n" not in seen or seen.split(b"\r\n\r\n", 1)[1].count(b"\n\n") < after_events:
                piece = sock.recv(65536)
                if not piece:
                    break
                seen += piece
    finally:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()


def disconnect_scenario(name: str, raw: bytes, after_events: int | None, clients: int = 12) -> Case:
    """`clients` concurrent requests abandoned the same way (half by FIN, half by RST): no engine request may be
    left running."""

    def run(servers: dict[str, Server]) -> list[str]:
        server = servers["open"]
        threads = [threading.Thread(target=_abandon, args=(server.port, raw, after_events, i % 2 == 1))
                   for i in range(clients)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CASE_TIMEOUT_S)
        left = server.settle(at_least=LATE_ARRIVAL_S)
        return [f"{left} engine request(s) still running {SETTLE_S:g} s after the clients left"] if left else []

    return Case("disconnect storms", name, run=run, repro=f"{clients} clients: {name}")


def _quiet_mid_body_leave(path: str) -> Callable[[dict[str, Server]], list[str]]:
    """A client that leaves before its body is complete is the client's business: no traceback in the log."""

    def run(servers: dict[str, Server]) -> list[str]:
        server = servers["open"]
        before = server.log.read_text(errors="replace").count("Traceback")
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.port), timeout=CASE_TIMEOUT_S) as sock:
            sock.sendall(head.encode() + b'{"prompt":')
            time.sleep(0.3)
        time.sleep(1)
        after = server.log.read_text(errors="replace").count("Traceback")
        return [f"{after - before} traceback(s) in the server log"] if after > before else []

    return run


def disconnects() -> list[Case]:
    long = {"max_tokens": 3000, "ignore_eos": True}
    cases = []
    for path in (CHAT, COMPLETIONS):
        short = "chat" if path == CHAT else "completions"
        cases += [
            disconnect_scenario(f"{short} stream left right after sending", _stream_request(path, **long), None),
            disconnect_scenario(f"{short} stream left after the head", _stream_request(path, **long), 0),
            disconnect_scenario(f"{short} stream left after 5 events", _stream_request(path, **long), 5),
            disconnect_scenario(f"{short} stream n=3 left after 5 events", _stream_request(path, n=3, **long), 5),
            disconnect_scenario(f"{short} stream with logprobs left after 5 events",
                                _stream_request(path, **long, **({"logprobs": True, "top_logprobs": 2}
                                                                if path == CHAT else {"logprobs": 2})), 5),
        ]  # fmt: skip
    many = request_bytes("POST", COMPLETIONS, json.dumps(completion(prompt=["a", "b", "c"], stream=True, **long))
                         .encode())  # fmt: skip
    cases.append(disconnect_scenario("completions stream of 3 prompts left after 5 events", many, 5))
    tools = chat(stream=True, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                 tool_choice="required", max_tokens=3000)  # fmt: skip
    cases.append(disconnect_scenario("chat stream with tool_choice required left after 3 events",
                                     request_bytes("POST", CHAT, json.dumps(tools).encode()), 3))  # fmt: skip
    for path in ("/tokenize", "/detokenize", CHAT):
        cases.append(Case("disconnect storms", f"client leaves mid-body on {path}: no traceback in the log",
                          run=_quiet_mid_body_leave(path), repro=f"POST {path} with Content-Length: 1000, send 10 "
                          "bytes of body, close; look for a traceback in the server log"))  # fmt: skip
    half = request_bytes("POST", CHAT, json.dumps(chat(**long)).encode())
    cases.append(disconnect_scenario("body half sent, then left", half[: len(half) - 10], None))
    return cases


def nonstream_disconnects() -> list[Case]:
    """Run last: a leaked non-streaming request also keeps its --max-num-seqs-in-flight slot (issue 13 item 2)."""
    long = {"max_tokens": 30000, "ignore_eos": True}
    cases = [
        disconnect_scenario("chat non-stream left while generating",
                            request_bytes("POST", CHAT, json.dumps(chat(**long)).encode()), None, clients=4),
        disconnect_scenario("completions non-stream left while generating",
                            request_bytes("POST", COMPLETIONS, json.dumps(completion(**long)).encode()), None,
                            clients=4),
    ]  # fmt: skip
    for case in cases:
        case.known = "nonstream-abort"
    return cases


def _timed_case(name: str, send: Callable[[socket.socket], None], expect: frozenset[int]) -> Case:
    """A connection that never completes its request: the server must answer `expect` (or, for an empty set, just
    close) within the read timeout plus a margin, while /health keeps answering."""

    def run(servers: dict[str, Server]) -> list[str]:
        server = servers["open"]
        reasons: list[str] = []
        with socket.create_connection(("127.0.0.1", server.port), timeout=CASE_TIMEOUT_S) as sock:
            started = time.monotonic()
            feeder = threading.Thread(target=send, args=(sock,), daemon=True)
            feeder.start()
            answer = read_answer(sock)
            elapsed = time.monotonic() - started
        health = _health(server.port)
        if answer.hung:
            reasons.append(f"no answer and no close within {CASE_TIMEOUT_S:g} s")
        elif expect and answer.status not in expect:
            reasons.append(f"status {answer.status}, expected {sorted(expect)}")
        elif not expect and answer.status is not None:
            reasons.append(f"answered {answer.status}; expected a close")
        elif not answer.closed:
            reasons.append("the connection stayed open")
        elif elapsed > READ_TIMEOUT_S + 5:
            reasons.append(f"ended after {elapsed:.1f} s, read timeout {READ_TIMEOUT_S:g} s")
        if health != 200:
            reasons.append(f"/health answered {health} meanwhile")
        return reasons

    return Case("slow clients", name, run=run, repro=name)


def _dribble(prefix: bytes, piece: bytes, interval: float = 0.2) -> Callable[[socket.socket], None]:
    def send(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(prefix)
            for _ in range(int(CASE_TIMEOUT_S / interval)):
                time.sleep(interval)
                sock.sendall(piece)

    return send


def _non_reader(servers: dict[str, Server]) -> list[str]:
    """A client that starts a long stream and never reads it: the server must keep serving, and abort it when the
    client leaves."""
    server = servers["open"]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(_stream_request(CHAT, max_tokens=20000, ignore_eos=True, logprobs=True, top_logprobs=5))
    latencies = []
    for _ in range(20):
        started = time.monotonic()
        status = _health(server.port)
        latencies.append(time.monotonic() - started)
        if status != 200:
            sock.close()
            return [f"/health answered {status} while a client did not read its stream"]
        time.sleep(0.1)
    sock.close()
    left = server.settle(at_least=LATE_ARRIVAL_S)
    reasons = [f"{left} engine request(s) still running after the non-reading client left"] if left else []
    if max(latencies) > 2:
        reasons.append(f"/health took up to {max(latencies):.1f} s while a client did not read its stream")
    return reasons


def _idle_connections(servers: dict[str, Server]) -> list[str]:
    """200 connections that never send a byte: all closed by the server after the read timeout."""
    server = servers["open"]
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=CASE_TIMEOUT_S) for _ in range(200)]
    try:
        health = _health(server.port)
        open_after = 0
        deadline = time.monotonic() + READ_TIMEOUT_S + 5
        for sock in socks:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                if sock.recv(1) != b"":
                    open_after += 1
            except TimeoutError:
                open_after += 1
            except ConnectionResetError:
                pass
    finally:
        for sock in socks:
            sock.close()
    reasons = [f"{open_after} of 200 idle connections still open after {READ_TIMEOUT_S + 5:g} s"] if open_after else []
    if health != 200:
        reasons.append(f"/health answered {health} with 200 idle connections open")
    return reasons


def slow_clients() -> list[Case]:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return [
        _timed_case("slowloris: a header every 0.2 s",
                    _dribble(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n"),
                    frozenset({408})),
        _timed_case("slowloris: one byte of the URL every 0.2 s", _dribble(b"GET /v1/models?", b"a"), frozenset({408})),
        _timed_case("Content-Length larger than the body", _dribble(head + b"Content-Length: 1000\r\n\r\n{", b""),
                    frozenset({408})),
        _timed_case("body dribbled a byte every 0.2 s", _dribble(head + b"Content-Length: 1000\r\n\r\n", b" "),
                    frozenset({408})),
        _timed_case("chunked body that never ends (completions)",
                    _dribble(head + b"Transfer-Encoding: chunked\r\n\r\n", b"1\r\n \r\n"), frozenset({408})),
        _timed_case("chunked body that never ends (tokenize)",
                    _dribble(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                             b"1\r\n \r\n"), frozenset({408})),
        _timed_case("a connection that sends nothing", lambda sock: None, frozenset()),
        Case("slow clients", "a stream that is never read", run=_non_reader,
             repro="a streamed chat (max_tokens 20000, logprobs) on a socket with a 4 KiB receive buffer, never read"),
        Case("slow clients", "200 idle connections", run=_idle_connections, repro="200 connections that send nothing"),
    ]  # fmt: skip


def _overload(servers: dict[str, Server]) -> list[str]:
    """3x --max-num-seqs-in-flight long streams at once: those past the limit get 503 in the API shape with
    Retry-After; once all have left, the slots are free again."""
    server = servers["open"]
    raw = _stream_request(CHAT, max_tokens=3000, ignore_eos=True)
    socks: list[socket.socket] = []
    statuses: Counter[str] = Counter()
    reasons: list[str] = []
    try:
        for _ in range(3 * MAX_IN_FLIGHT):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=CASE_TIMEOUT_S)
            sock.sendall(raw)
            socks.append(sock)
        for sock in socks:
            answer = read_answer(sock, head_only=True)
            statuses[str(answer.status)] += 1
            if answer.status == 503:
                if "retry-after" not in answer.headers or not _error_shape(answer.body, 503):
                    reasons.append(
                        f"a 503 without Retry-After or the error shape: {answer.headers} {answer.body[:200]!r}"
                    )
            elif answer.status != 200:
                reasons.append(f"status {answer.status}")
        if statuses["200"] != MAX_IN_FLIGHT:
            reasons.append(f"{statuses['200']} streams admitted, expected {MAX_IN_FLIGHT}: {dict(statuses)}")
    finally:
        for sock in socks:
            sock.close()
    left = server.settle(at_least=LATE_ARRIVAL_S)
    if left:
        reasons.append(f"{left} engine request(s) still running after the overload")
    answer = exchange(server.port, request_bytes("POST", CHAT, json.dumps(chat()).encode()))
    if answer.status != 200:
        reasons.append(f"after the overload a new request got {answer.status}")
    return reasons


def _overload_nonstream(servers: dict[str, Server]) -> list[str]:
    """40 short non-streamed requests at once: each one a 200 or a 503 in the API shape."""
    server = servers["open"]
    raw = request_bytes("POST", COMPLETIONS, json.dumps(completion(max_tokens=20)).encode())
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: exchange(server.port, raw), range(40)))
    case = Case("overload", "one of 40", raw, frozenset({200, 503}))
    return [reason for answer in answers for reason in judge(case, answer)]


def overload() -> list[Case]:
    return [
        Case("overload", "3x --max-num-seqs-in-flight streams", run=_overload,
             repro=f"{3 * MAX_IN_FLIGHT} concurrent streams, max_tokens 3000, limit {MAX_IN_FLIGHT}"),
        Case("overload", "40 concurrent non-streamed requests", run=_overload_nonstream,
             repro="40 concurrent POST /v1/completions, max_tokens 20"),
    ]  # fmt: skip


def _ready_for_a_dead_engine(servers: dict[str, Server]) -> list[str]:
    """Kill the open server's engine: /health and /ready must say so (503, not "starting"), and a request gets a
    clean error, not a hang."""
    server = servers["open"]
    _stop(server.mock, 1)
    deadline = time.monotonic() + 40  # --engine-stall-timeout is 30 s: the loss must be noticed by then
    while _health(server.port) == 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    reasons = []
    if _health(server.port) == 200:
        reasons.append("/health still 200 40 s after the engine was killed")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/ready", timeout=5) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    if status != 503 or json.loads(body).get("status") == "starting":
        reasons.append(f"/ready for a dead engine: {status} {body[:200]!r}")
    answer = exchange(server.port, request_bytes("POST", CHAT, json.dumps(chat()).encode()))
    if answer.hung or answer.status is None or answer.status < 500 or not _error_shape(answer.body, answer.status):
        reasons.append(f"a request to a dead engine: {answer.status} {answer.body[:200]!r}")
    return reasons


def engine_death() -> list[Case]:
    return [
        Case(
            "engine death",
            "/ready and a request after the engine was killed",
            run=_ready_for_a_dead_engine,
            known="ready-dead",
            repro="kill -9 the mock engine; GET /ready; POST /v1/chat/completions",
        )
    ]


CLASSES: list[tuple[str, Callable[[], list[Case]]]] = [
    ("malformed JSON", malformed_json),
    ("wrong types", wrong_types),
    ("huge values", huge_values),
    ("deep nesting", deep_nesting),
    ("bad unicode", bad_unicode),
    ("unknown fields", unknown_fields),
    ("numbers", numbers),
    ("output constraints", constraints),
    ("auth", auth),
    ("HTTP abuse", http_abuse),
    ("disconnect storms", disconnects),
    ("slow clients", slow_clients),
    ("overload", overload),
    ("disconnect storms (non-stream)", nonstream_disconnects),
]
"""In the order they run: the scenarios that can leave the server short of slots come last (and `engine_death`
after all of them)."""


# ---------------------------------------------------------------------------------------------- judging


def _error_shape(body: bytes, status: int) -> bool:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("code") == status


def _stream_problems(body: bytes) -> list[str]:
    events = [e for e in body.split(b"\n\n") if e.strip() and not e.startswith(b":")]
    if not events or events[-1] != b"data: [DONE]":
        return [f"stream does not end with [DONE]: ...{body[-200:]!r}"]
    for event in events[:-1]:
        if not event.startswith(b"data: "):
            return [f"malformed SSE event {event[:100]!r}"]
        try:
            chunk = json.loads(event[6:])
        except ValueError:
            return [f"SSE event is not JSON: {event[:100]!r}"]
        code = chunk.get("error", {}).get("code") if isinstance(chunk.get("error"), dict) else None
        if code is not None and code >= 500:
            return [f"error event {code} in the stream: {event[:200]!r}"]
    return []


def judge(case: Case, answer: Answer) -> list[str]:
    """Why `answer` is not the clean answer to `case` (empty: it is)."""
    if answer.hung:
        return [f"hung: no complete answer within {CASE_TIMEOUT_S:g} s"]
    if answer.status is None:
        return [f"connection dropped without an answer ({answer.error or 'closed'})"]
    if answer.status >= 500 and answer.status not in case.expect:
        return [f"{answer.status}: {answer.body[:300]!r}"]
    reasons = []
    if answer.status not in case.expect:
        reasons.append(f"status {answer.status}, expected {_statuses(case.expect)}: {answer.body[:300]!r}")
    if answer.status >= 400 and case.raw[:5] != b"HEAD " and not _error_shape(answer.body, answer.status):
        reasons.append(f"{answer.status} without the API's error shape: {answer.body[:200]!r}")
    if answer.status == 200 and case.raw[:5] != b"HEAD ":
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            reasons += _stream_problems(answer.body)
        elif answer.headers.get("content-type", "").startswith("application/json"):
            try:
                json.loads(answer.body)
            except ValueError:
                reasons.append(f"200 with a body that is not JSON: {answer.body[:200]!r}")
    return reasons


def _statuses(expect: frozenset[int]) -> str:
    return "any 4xx" if expect == ANY_4XX else "/".join(map(str, sorted(expect)))


def run_case(case: Case, servers: dict[str, Server]) -> Outcome:
    try:
        if case.run is not None:
            return Outcome(case, case.run(servers))
        return Outcome(case, judge(case, exchange(servers[case.server].port, case.raw)))
    except Exception as exc:  # a broken case is reported, not allowed to hide the others
        return Outcome(case, [f"the case itself failed: {type(exc).__name__}: {exc}"])


def repro(case: Case, servers: dict[str, Server]) -> str:
    if case.repro:
        return case.repro
    head, _, body = case.raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    headers = [line for line in lines[1:] if not line.lower().startswith(("host:", "content-length:"))]
    if len(body) > 300 or any(ord(ch) < 32 or ord(ch) > 126 for ch in "".join(headers)):
        return f"raw bytes: {case.raw[:300]!r}{'...' if len(case.raw) > 300 else ''} ({len(case.raw)} bytes)"
    port = servers[case.server].port
    parts = [f"curl -s -X {method} 'http://127.0.0.1:{port}{path}'"]
    parts += [f"-H '{h}'" for h in headers]
    if body:
        parts.append("--data-binary " + repr(body.decode("latin-1")))
    return " ".join(parts)


def run_class(name: str, build: Callable[[], list[Case]], servers: dict[str, Server]) -> list[Outcome]:
    """A class's single requests 4 at a time, then its scenarios one by one."""
    cases = build()
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda c: run_case(c, servers), [c for c in cases if c.run is None]))
    return outcomes + [run_case(c, servers) for c in cases if c.run is not None]


def test_hostile_inputs(servers: dict[str, Server]) -> None:
    started = time.monotonic()
    results: dict[str, list[Outcome]] = {}
    leaked: dict[str, int] = {}
    for name, build in CLASSES:
        results[name] = run_class(name, build, servers)
        leaked[name] = sum(server.settle() for server in servers.values())
    health = {name: _health(server.port) for name, server in servers.items()}
    results["engine death"] = run_class("engine death", engine_death, servers)  # last: it kills an engine
    failures = [outcome for outcomes in results.values() for outcome in outcomes if outcome.reasons]

    tried = sum(len(outcomes) for outcomes in results.values())
    print(f"\nhostile tier: {tried} cases in {time.monotonic() - started:.0f} s")
    print(f"{'class':32s} {'cases':>5s} {'unclean':>7s} {'leaked':>6s}")
    for name, outcomes in results.items():
        bad = sum(1 for outcome in outcomes if outcome.reasons)
        print(f"{name:32s} {len(outcomes):5d} {bad:7d} {leaked.get(name, 0):6d}")
    print(f"{'total':32s} {tried:5d} {len(failures):7d} {sum(leaked.values()):6d}")
    print(f"after the battery (before the engine death case): /health {health}")
    for title, selected in (
        ("unclean, new", [f for f in failures if not f.case.known]),
        ("unclean, an issue 13 finding come back", [f for f in failures if f.case.known]),
    ):
        print(f"\n{title}: {len(selected)}")
        for outcome in selected:
            tag = f" [{outcome.case.known}: {KNOWN[outcome.case.known]}]" if outcome.case.known else ""
            print(f"- {outcome.case.cls} / {outcome.case.name}{tag}: {'; '.join(outcome.reasons)}")
            print(f"    repro: {repro(outcome.case, servers)}")
    for server in servers.values():
        tracebacks = server.log.read_text(errors="replace").count("Traceback")
        print(f"{server.name} server log: {tracebacks} traceback(s) ({server.log})")

    assert all(status == 200 for status in health.values()), health
    assert not failures and not any(leaked.values()), (
        f"{len(failures)} unclean case(s), {sum(leaked.values())} leaked engine request(s); see the printed report"
    )
