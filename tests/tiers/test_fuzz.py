"""The opt-in fuzz tier: schemathesis against every POST route of `pyfront serve --mock-engine`, from its /openapi.json.

Run with ``python -m pytest -q -rP --fuzz -m fuzz tests/tiers/test_fuzz.py`` from the repo root (or
``tools/fuzz/run_tier.sh``, which builds the schemathesis venv first: ``tools/fuzz/setup_venv.sh``,
``$PYFRONT_FUZZ_VENV``, default ``~/.cache/pyfront/fuzz-venv``).

pyfront runs as a user runs it, ``pyfront serve --mock-engine`` in its own process group, with an API key, front-end
hashing on, ``--trust-request-chat-template`` (so fuzzed templates reach the renderer instead of a refusal),
``--enable-request-id-headers`` (so fuzzed request ids meet the header they are echoed in),
``--enable-prompt-tokens-details``, and a fast mock engine that ends a generation after 16 tokens unless
``ignore_eos`` says otherwise: the context is capped at 1024 tokens (``--max-model-len``), so the longest
generation a case can ask for is short too, while max_tokens, n and the rest stay as fuzzed. Schemathesis (its
CLI, from the fuzz venv) is configured by tools/fuzz/schemathesis.toml: derandomized generation (the same cases
every run), the examples, coverage and fuzzing phases, every applicable check, a dictionary of hostile strings
(CR/LF, NUL, special tokens, template markup) for the fields pyfront echoes, renders or hashes, and pyfront's own
checks and schema tightening in tools/fuzz/hooks.py (the error object, SSE framing, the API key).

The test reads schemathesis' NDJSON event log and prints: operations, cases tried (per operation and phase),
HTTP statuses, failures by check with a reproducing curl for each distinct one, and network errors. It asserts:
every POST route of /openapi.json was fuzzed with cases; no 5xx, no failure of the checks that mean a server bug
(`MUST_PASS`), no network error (a timeout, a reset connection); afterwards pyfront has nothing in flight for the
engine (streams schemathesis cut short were aborted), is still healthy, logged no traceback, and exits 0 on SIGTERM.
The other checks (where the published schema and the server disagree: a schema-valid request refused, a lenient
type accepted) are printed, not asserted.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tools.real_engine import engine as real_engine

pytestmark = pytest.mark.fuzz

FUZZ_DIR = REPO_ROOT / "tools" / "fuzz"
SETUP_HINT = "run tools/fuzz/setup_venv.sh (it prints the venv path; PYFRONT_FUZZ_VENV overrides it)"
API_KEY = "sk-fuzz-key"
# Cases per operation in the fuzzing phase (the coverage phase adds its own: about 40 to 1,000 per operation,
# 1,900 in all). 300 keeps the tier at about 2 minutes on a 2-core machine (~3,100 cases in ~100 s);
# PYFRONT_FUZZ_MAX_EXAMPLES asks for a deeper run.
MAX_EXAMPLES = int(os.environ.get("PYFRONT_FUZZ_MAX_EXAMPLES", "300"))
RUN_TIMEOUT_S = 1200.0
STARTUP_TIMEOUT_S = 180.0
DRAIN_TIMEOUT_S = 20.0
MOCK_ENGINE_ARGS = "--output-len 16 --step-interval 0.001 --tokens-per-step 8 --advertise-feh"
SERVER_ARGS = ["--max-model-len", "1024", "--trust-request-chat-template", "--api-key", API_KEY,
               "--enable-request-id-headers", "--enable-prompt-tokens-details",
               "--mock-engine-args", MOCK_ENGINE_ARGS]  # fmt: skip
# The checks whose failure is a server bug, asserted zero: a 5xx (`not_a_server_error`) and pyfront's own
# contract (tools/fuzz/hooks.py).
MUST_PASS = frozenset({"not_a_server_error", "openai_error_shape", "sse_stream_framing", "api_key_enforced"})


@pytest.fixture(scope="session")
def fuzz_venv() -> Path:
    """The schemathesis venv; a clear failure (not a skip) when --fuzz was asked without it."""
    venv = Path(os.environ.get("PYFRONT_FUZZ_VENV", Path.home() / ".cache" / "pyfront" / "fuzz-venv")).expanduser()
    if not os.access(venv / "bin" / "schemathesis", os.X_OK) or not (venv / ".pyfront-fuzz-venv.stamp").is_file():
        pytest.fail(f"the fuzz venv at {venv} is incomplete: {SETUP_HINT}", pytrace=False)
    return venv


@dataclass
class Failure:
    """One distinct failure: a check that failed, with the first case that showed it."""

    check: str
    code: str
    title: str
    operation: str
    message: str
    gist: str
    curl: str
    status: int | None
    response: str
    cases: set[str] = field(default_factory=set)


@dataclass
class FuzzRun:
    """What schemathesis' NDJSON event log says about a run."""

    cases: dict[str, set[str]] = field(default_factory=dict)  # operation -> case ids
    cases_by_phase: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    check_runs: Counter[str] = field(default_factory=Counter)  # check -> cases it ran on
    # (check, operation, gist) -> the first case showing it
    failures: dict[tuple[str, str, str], Failure] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    finished: bool = False

    @property
    def case_count(self) -> int:
        return sum(len(ids) for ids in self.cases.values())


def _decode(payload: dict[str, Any] | None) -> bytes:
    if not payload:
        return b""
    if "$base64" in payload:
        return base64.b64decode(payload["$base64"])
    return str(payload.get("string", "")).encode()


def _gist(status: int | None, answer: str, check_message: str) -> str:
    """What tells one failure from another: the status, the error's param and the start of its message (numbers
    masked, quoted values cut off, so "got 0" and "got -5", or two fuzzed names, are one failure), and the
    check's own detail line ("Invalid component: ...") for an answer that is not an error."""
    detail = next((line for line in check_message.splitlines() if line.startswith("Invalid component")), "")
    try:
        error = json.loads(answer)["error"]
        message = re.split(r"['\"`]", str(error["message"]))[0][:80]
        gist = f"{status} {re.sub(r'[0-9]+', '#', str(error.get('param')))}: {re.sub(r'[0-9]+', '#', message)}"
    except (ValueError, KeyError, TypeError):
        gist = f"{status}"
    return f"{gist} {detail}".strip()


def _curl(request: dict[str, Any]) -> str:
    """A curl line that resends the recorded request (with the run's API key)."""
    parts = ["curl", "-sS", "-X", request["method"], request["uri"], "-H", f"Authorization: Bearer {API_KEY}"]
    for name, values in (request.get("headers") or {}).items():
        if name.lower() != "authorization":
            parts += ["-H", f"{name}: {values[0]}"]
    body = _decode(request.get("body"))
    if body:
        parts += ["--data-binary", body.decode("utf-8", errors="backslashreplace")]
    return shlex.join(parts)


def parse_events(path: Path) -> FuzzRun:
    run = FuzzRun()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        (kind, data), = event.items()  # fmt: skip
        if kind in ("NonFatalError", "FatalError"):
            value = data.get("value") or data.get("info") or data
            run.errors.append(f"{data.get('label', '?')} ({data.get('phase')}): {json.dumps(value)[:400]}")
        elif kind == "EngineFinished":
            run.finished = True
        elif kind == "ScenarioFinished":
            recorder = data["recorder"]
            operation = recorder["label"]
            case_ids = set(recorder.get("cases", {}))
            run.cases.setdefault(operation, set()).update(case_ids)
            run.cases_by_phase[data["phase"]] += len(case_ids)
            interactions = recorder.get("interactions", {})
            for interaction in interactions.values():
                response = interaction.get("response")
                if response is not None:
                    run.statuses[response["status_code"]] += 1
            for case_id, checks in recorder.get("checks", {}).items():
                for check in checks:
                    run.check_runs[check["name"]] += 1
                    if check["status"] == "success":
                        continue
                    info = (check.get("failure_info") or {}).get("failure") or {}
                    message = info.get("message", "")
                    interaction = interactions.get(case_id) or {}
                    response = interaction.get("response") or {}
                    answer = _decode(response.get("content")).decode("utf-8", errors="replace")
                    gist = _gist(response.get("status_code"), answer, message)
                    key = (check["name"], operation, gist)
                    if key not in run.failures:
                        run.failures[key] = Failure(
                            check=check["name"], code=info.get("code", "?"), title=info.get("title", "?"),
                            operation=operation, message=message, gist=gist,
                            curl=_curl(interaction["request"]) if "request" in interaction else "?",
                            status=response.get("status_code"),
                            response=answer[:300],
                        )  # fmt: skip
                    run.failures[key].cases.add(case_id)
    return run


def _get(url: str, path: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def _in_flight(url: str) -> tuple[int, float]:
    """(sum of /health engines[].in_flight, /metrics vllm:num_requests_running)."""
    _, health = _get(url, "/health")
    _, metrics = _get(url, "/metrics")
    running = sum(
        float(line.rsplit(None, 1)[1])
        for line in metrics.decode().splitlines()
        if line.startswith("vllm:num_requests_running")
    )
    return sum(e["in_flight"] for e in json.loads(health)["engines"]), running


def _start_pyfront(http_port: int, rpc_port: int, log_path: Path) -> real_engine.Handle:
    argv = [sys.executable, "-m", "pyfront.server.cli", "serve", "--mock-engine", "--host", "127.0.0.1",
            "--port", str(http_port), "--data-parallel-rpc-port", str(rpc_port), *SERVER_ARGS]  # fmt: skip
    env = {**os.environ, "VLLM_NATIVE_FEH": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    return real_engine.Handle(
        kind="pyfront", pid=proc.pid, log_path=log_path, argv=argv, rpc_port=rpc_port, http_port=http_port, proc=proc
    )


def _run_schemathesis(venv: Path, url: str, tmp_path: Path) -> tuple[int, Path, Path]:
    """The schemathesis CLI to completion in its own process group; (exit code, NDJSON log, console log)."""
    events = tmp_path / "schemathesis.ndjson"
    console = tmp_path / "schemathesis.log"
    cmd = [str(venv / "bin" / "schemathesis"), "--config-file", str(FUZZ_DIR / "schemathesis.toml"), "run",
           f"{url}/openapi.json", "--include-method", "POST", "--max-examples", str(MAX_EXAMPLES),
           "--header", f"Authorization: Bearer {API_KEY}", "--no-color",
           "--report", "ndjson", "--report-ndjson-path", str(events)]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(FUZZ_DIR / "hooks.py"), "PYFRONT_FUZZ_API_KEY": API_KEY}
    with open(console, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            real_engine.stop_group(proc.pid, grace=5, proc=proc)
            pytest.fail(f"schemathesis ran over {RUN_TIMEOUT_S:.0f} s; console log {console}")
    return proc.returncode, events, console


def _report(run: FuzzRun, post_operations: list[str], seconds: float) -> None:
    print(f"\nschemathesis: {len(run.cases)} operations of {len(post_operations)} POST routes, "
          f"{run.case_count} cases in {seconds:.0f} s (max-examples {MAX_EXAMPLES})")  # fmt: skip
    for operation in sorted(run.cases):
        print(f"  {operation:<28} {len(run.cases[operation])} cases")
    print(f"  by phase: {dict(sorted(run.cases_by_phase.items()))}")
    print(f"HTTP statuses: {dict(sorted(run.statuses.items()))}; 5xx: {_server_errors(run)}")
    print(f"checks run (cases): {dict(sorted(run.check_runs.items()))}")
    print(f"network errors: {len(run.errors)}")
    for error in run.errors:
        print(f"  {error}")
    by_check: Counter[str] = Counter()
    for failure in run.failures.values():
        by_check[failure.check] += len(failure.cases)
    print("failed cases by check (MUST: a server bug, asserted zero; info: printed only):" + (" none" * (not by_check)))
    for check, cases in sorted(by_check.items()):
        print(f"  {'MUST' if check in MUST_PASS else 'info'} {check}: {cases}")
    failures = sorted(run.failures.values(), key=lambda f: (f.check not in MUST_PASS, f.check, f.operation))
    for failure in failures:
        if failure.check in MUST_PASS:
            print(f"\n[MUST] {failure.check} ({failure.code} {failure.title}) on {failure.operation}, "
                  f"{len(failure.cases)} case(s)")  # fmt: skip
            if failure.message:
                print("  " + failure.message.replace("\n", "\n  "))
            print(f"  answer: {failure.status} {failure.response}")
            print(f"  reproduce: {failure.curl}")
    info: dict[tuple[str, str], tuple[set[str], int]] = {}  # (check, gist) -> (operations, cases)
    for failure in failures:
        if failure.check not in MUST_PASS:
            operations, cases = info.get((failure.check, failure.gist), (set(), 0))
            info[(failure.check, failure.gist)] = (operations | {failure.operation}, cases + len(failure.cases))
    if info:
        print("\ninfo failures, one line per distinct answer (check, cases, operations: status param: message):")
    for (check, gist), (operations, cases) in info.items():
        print(f"  {check}, {cases}, {' '.join(sorted(op.split()[1] for op in operations))}: {gist}")


def _server_errors(run: FuzzRun) -> int:
    return sum(count for status, count in run.statuses.items() if status >= 500)


def test_schemathesis_post_routes(fuzz_venv: Path, tmp_path: Path) -> None:
    """Every POST route of /openapi.json, fuzzed: no 5xx, no unclean answer, nothing left in flight."""
    http, rpc = real_engine.free_port(), real_engine.free_port()
    log_path = tmp_path / "pyfront.log"
    pyfront = _start_pyfront(http, rpc, log_path)
    problems: list[str] = []
    try:
        real_engine.wait_healthy(pyfront, timeout=STARTUP_TIMEOUT_S)
        url = pyfront.url
        assert url is not None
        _, spec = _get(url, "/openapi.json")
        post_operations = sorted(
            f"POST {path}" for path, methods in json.loads(spec)["paths"].items() if "post" in methods
        )
        t0 = time.monotonic()
        exit_code, events, console = _run_schemathesis(fuzz_venv, url, tmp_path)
        seconds = time.monotonic() - t0
        run = parse_events(events)
        _report(run, post_operations, seconds)
        print(f"\nschemathesis exit code {exit_code} (non-zero with any failure, 'info' ones included); "
              f"console log {console}")  # fmt: skip

        if not run.finished:
            problems.append(f"schemathesis did not finish its run (console log {console})")
        if sorted(run.cases) != post_operations:
            problems.append(f"fuzzed {sorted(run.cases)}, not the POST routes {post_operations}")
        thin = {op: len(ids) for op, ids in run.cases.items() if len(ids) < MAX_EXAMPLES}
        if thin:
            problems.append(f"operations with fewer than {MAX_EXAMPLES} cases: {thin}")
        if _server_errors(run):
            problems.append(f"{_server_errors(run)} 5xx answers")
        must = sorted({f.check for f in run.failures.values() if f.check in MUST_PASS})
        if must:
            problems.append(f"failed checks that mean a server bug: {must}")
        if run.errors:
            problems.append(f"{len(run.errors)} network errors (timeouts, dropped connections)")

        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        in_flight = _in_flight(url)
        while in_flight != (0, 0.0) and time.monotonic() < deadline:
            time.sleep(0.2)
            in_flight = _in_flight(url)
        print(f"in flight after the run: /health engines[].in_flight {in_flight[0]}, "
              f"/metrics vllm:num_requests_running {in_flight[1]:g}")  # fmt: skip
        if in_flight != (0, 0.0):
            problems.append(f"requests still in flight {DRAIN_TIMEOUT_S:.0f} s after the run: {in_flight}")
        status, _ = _get(url, "/health")
        if status != 200 or not pyfront.alive():
            problems.append(f"pyfront unhealthy after the run (/health {status}, alive {pyfront.alive()})")
    finally:
        how = real_engine.stop(pyfront, grace=30)
    log = log_path.read_text(errors="replace")
    tracebacks = log.count("Traceback (most recent call last)")
    print(f"pyfront: stopped by {how}, exit code {pyfront.proc.returncode if pyfront.proc else '?'}, "
          f"{tracebacks} traceback(s) in its log {log_path}")  # fmt: skip
    if how != "sigterm" or (pyfront.proc is not None and pyfront.proc.returncode != 0):
        problems.append(f"pyfront did not exit 0 on SIGTERM ({how}, {pyfront.proc and pyfront.proc.returncode})")
    if tracebacks:
        problems.append(f"{tracebacks} traceback(s) in pyfront's log")
    assert not problems, "\n".join(problems)
