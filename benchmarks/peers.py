"""pyfront against vllm-rs and vLLM's Python front end, one after the other, on the same mock engine and load.

    python benchmarks/peers.py [--quick] [--peers vllm-rs,vllm,pyfront,pyfront-nofeh] [--repeats N] [--out DIR]

For every front end ("peer"): start it pinned to core 0 (``taskset -c 0``) listening on a fresh handshake port,
start a fresh pyfront mock engine pinned to core 1 (``python -m pyfront.engine_client.mock_engine --step-interval 0.02
--step-on-arrival --arrival-log FILE --max-model-len 131072``; ``--advertise-feh`` only for pyfront with
VLLM_NATIVE_FEH=1), wait for ``/health``, send a warm-up, then run benchmarks/loadgen.py (pinned to core 1, like the
mock) for each load, ``--repeats`` times, and stop both process groups. Figures (medians over repeats):

- N concurrent streams of M tokens: front-end CPU-s (utime+stime of every process of its process group, reaped
  children included, from /proc/PID/stat) per 1k output tokens (usage.completion_tokens); TTFT p50.
- one chat of T turns, each adding ~2k tokens of English prose: request written -> engine ADD (the mock's arrival
  log: when the ADD's frames came off its socket, before its decode; matched by the X-Request-Id every front end
  puts into the engine request id, else by order), at the last turn and the median of the last 11 turns.
- one keep-alive connection, R sequential non-streamed requests with max_tokens 1 (default 1000): client latency p50
  and front-end CPU per request, the latter from the threads' schedstat (nanoseconds): /proc/PID/stat counts 10 ms
  ticks, steps of 0.05 ms per request at 200 requests, as wide as the gaps this row compares.
- the same sequential load with every peer up at once (each with its own mock), in rounds (default 10 of 300
  requests per peer) whose peer order rotates: the machine's drift over the minutes of a run, larger than the gaps
  this row compares, then falls on every peer alike. Medians over the rounds.
- C keep-alive connections (default 64) sending short non-streamed requests with max_tokens 1 one after the other,
  3000 in all: requests per second the front end's one core answers, and its CPU per request.
- start (spawn) to the first ``/health`` 200, polled every 10 ms, and RSS of the front end's processes after the
  warm-up. pyfront's tokenizer is loaded once before (``prime_tokenizer_snapshot``): after an install or upgrade,
  that first load writes the tokenizer snapshot every later start reads without transformers; its time is in the
  report's details. A start-up row of its own starts every peer again ``--startup-rounds`` times (default 5), in
  turn, and reports the median: one start per portion is one draw of the VM's drift.

pyfront's packages (this tree's, which the mock engine runs from too, and ``--pyfront-src``'s) are compiled to
bytecode first, as ``pip install`` leaves an installed package and as vLLM's virtualenv is: with
``PYTHONDONTWRITEBYTECODE=1`` in the environment (these machines set it) a source tree would otherwise be compiled
again at every start (about 0.2 s of pyfront's start-up here).

A peer whose binary or virtualenv is missing is skipped. Logs, arrival logs and every raw result go to --out.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from tools.real_engine import engine as eng  # noqa: E402

LOADGEN = ROOT / "benchmarks" / "loadgen.py"
FE_CORE, LOAD_CORE = "0", "1"
STARTUP_POLL_S = 0.01
"""How often the start-up rows poll /health: the figure's resolution (a refused connect or a 200 costs little)."""

PEER_ORDER = ("vllm-rs", "vllm", "pyfront", "pyfront-nofeh")
PEER_TITLES = {
    "vllm-rs": "vllm-rs 0.33",
    "vllm": "vLLM 0.32 Python",
    "pyfront": "pyfront (FEH)¹",
    "pyfront-nofeh": "pyfront (no FEH)",
}
REFERENCE = {  # measured by others on these machines (the performance issue)
    "vllm-rs": "0.021-0.026 CPU-s/1k; TTFT 25 ms; turn-50 13-15 ms; 0.6-0.8 ms / 0.3-0.4 ms; 1.4 s, 255 MB",
    "vllm": "0.069-0.085 CPU-s/1k; TTFT 318-421 ms; turn-50 198-214 ms; 1.8-2.9 ms / 1.6-2.5 ms; 10-11 s, 1,040 MB",
}


# ------------------------------------------------------------------------------------------------ setup


def machine_facts() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    rev = "?"
    with contextlib.suppress(Exception):
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()  # fmt: skip
        if dirty:
            rev += " (+ uncommitted changes)"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyfront_rev": rev,
    }


def peer_version(peer: str, args: argparse.Namespace) -> str:
    if peer == "vllm-rs":
        with contextlib.suppress(Exception):
            return subprocess.run([str(args.vllm_rs), "--version"], capture_output=True, text=True,
                                  timeout=20).stdout.strip()  # fmt: skip
        return "?"
    if peer == "vllm":
        found = sorted(Path(args.vllm_venv).glob("lib/python*/site-packages/vllm*.dist-info"))
        return ", ".join(p.name.removesuffix(".dist-info") for p in found) or "?"
    if args.pyfront_src:
        return f"pyfront from {args.pyfront_src}"
    return f"pyfront {machine_facts()['pyfront_rev']}"


def prepare_model_dir(src: Path, out: Path, max_model_len: int) -> Path:
    """A copy of the tiny model dir (files symlinked) whose config allows `max_model_len` positions, so every
    front end accepts --max-model-len 131072 without override flags."""
    dst = out / "model"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "config.json" or not f.is_file():
            continue
        link = dst / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    config = json.loads((src / "config.json").read_text())
    config["max_position_embeddings"] = max(int(config.get("max_position_embeddings", 0)), max_model_len)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def default_model_dir() -> Path:
    tiny = Path(os.environ.get("PYFRONT_CACHE_DIR", Path.home() / ".cache/pyfront")) / "tiny-qwen3"
    if (tiny / "config.json").is_file() and (tiny / "tokenizer.json").is_file():
        return tiny
    raise SystemExit(
        f"{tiny} not found: build it with tools/real_engine/make_tiny_qwen3.py (see tools/real_engine/README.md)"
    )


# ------------------------------------------------------------------------------------------------ peers


def peer_missing(peer: str, args: argparse.Namespace) -> str | None:
    if peer == "vllm-rs" and not os.access(args.vllm_rs, os.X_OK):
        return f"{args.vllm_rs} not found (tools/real_engine/fetch_vllm_rs.sh fetches it)"
    if peer == "vllm" and not os.access(Path(args.vllm_venv) / "bin" / "vllm", os.X_OK):
        return f"{args.vllm_venv}/bin/vllm not found (tools/real_engine/setup_venv.sh makes the venv)"
    if shutil.which("taskset") is None:
        return "taskset not found"
    return None


def frontend_argv(peer: str, args: argparse.Namespace, model: Path, rpc: int, http: int) -> tuple[list[str], dict]:
    mml = str(args.max_model_len)
    if peer == "vllm-rs":
        argv = [str(args.vllm_rs), "serve", str(model), "--data-parallel-address", "127.0.0.1",
                "--data-parallel-rpc-port", str(rpc), "--data-parallel-size", "1", "--data-parallel-size-local", "0",
                "--host", "127.0.0.1", "--port", str(http), "--max-model-len", mml]  # fmt: skip
        return argv, {}
    if peer == "vllm":
        argv = [str(Path(args.vllm_venv) / "bin" / "vllm"), "serve", str(model), "--data-parallel-size-local", "0",
                "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc),
                "--data-parallel-size", "1", "--host", "127.0.0.1", "--port", str(http), "--max-model-len", mml,
                "--dtype", "bfloat16", "--enforce-eager"]  # fmt: skip
        return argv, {}
    argv = [sys.executable, "-m", "pyfront.server.cli", "serve", str(model), "--host", "127.0.0.1", "--port", str(http),
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc),
            "--max-model-len", mml]  # fmt: skip
    env = {"VLLM_NATIVE_FEH": "1" if peer == "pyfront" else "0"}
    if args.pyfront_src:
        env["PYTHONPATH"] = str(args.pyfront_src)
    return argv, env


def mock_argv(peer: str, args: argparse.Namespace, rpc: int, arrivals: Path) -> list[str]:
    argv = [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{rpc}",
            "--ranks", "0", "--step-interval", str(args.step_interval), "--max-model-len", str(args.max_model_len),
            "--arrival-log", str(arrivals), "--step-on-arrival"]  # fmt: skip
    if peer == "pyfront":
        argv.append("--advertise-feh")
    return argv


def spawn(kind: str, argv: list[str], core: str, log: Path, rpc: int, http: int | None, env: dict) -> eng.Handle:
    if "PYTHONPATH" in env:  # pyfront from another source tree (--pyfront-src): run it from there
        with contextlib.chdir(env["PYTHONPATH"]):
            return eng._spawn(kind, ["taskset", "-c", core, *argv], log, rpc, http, env, True)
    return eng._spawn(kind, ["taskset", "-c", core, *argv], log, rpc, http, env, True)


def run_loadgen(scenario: str, extra: list[str], timeout: float) -> dict[str, Any]:
    cmd = ["taskset", "-c", LOAD_CORE, sys.executable, str(LOADGEN), scenario, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"loadgen {scenario} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def read_arrivals(path: Path) -> list[tuple[float, str]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                out.append((float(parts[0]), parts[2]))
    return out


ID_RE = re.compile(r"pb[0-9a-f]{6}r\d{2}[scq]\d{4,5}")


def add_times(arrivals: list[tuple[float, str]], offset: int = 0) -> dict[str, float]:
    """Our request id (found inside the engine request id) -> wall time of its ADD."""
    out: dict[str, float] = {}
    for t, rid in arrivals[offset:]:
        m = ID_RE.search(rid)
        if m:
            out.setdefault(m.group(0), t)
    return out


def match_turns(chat: dict[str, Any], arrivals: list[tuple[float, str]], offset: int) -> str:
    """Adds `add_latency` (ADD wall time - send wall time) to every turn; returns the matching method."""
    turns = chat["turns"]
    by_id = add_times(arrivals, offset)
    if turns and all(t["id"] in by_id for t in turns):
        for t in turns:
            t["add_latency"] = by_id[t["id"]] - t["sent"]
        return "request id"
    new = arrivals[offset:]  # sequential on one connection: the n-th ADD after the offset is turn n
    for t, (wall, _) in zip(turns, new, strict=False):
        t["add_latency"] = wall - t["sent"]
    return "order" if len(new) >= len(turns) else f"order (only {len(new)} ADDs for {len(turns)} turns)"


def add_latencies(records: list[list], by_id: dict[str, float]) -> list[float]:
    """send -> ADD of [id, sent, ...] records whose id shows up in the arrival log."""
    return [by_id[r[0]] - r[1] for r in records if r[0] in by_id and r[1] is not None]


def wait_quiet(limit_s: float, threshold: float = 0.10) -> tuple[float, float]:
    """Wait (up to `limit_s`) until no core is busier than `threshold` over a 1 s sample: other jobs on this
    machine (a test run, another benchmark) would disturb the figures. Returns (seconds waited, last busiest)."""
    from loadgen import cores_busy_seconds

    t0 = time.monotonic()
    while True:
        a = cores_busy_seconds()
        time.sleep(1.0)
        b = cores_busy_seconds()
        busiest = max(b[k] - a.get(k, 0.0) for k in b)
        if busiest <= threshold or time.monotonic() - t0 >= limit_s:
            return time.monotonic() - t0, busiest


def foreign_share(row: dict[str, Any]) -> float:
    """CPU that processes other than the front end, the mock and the load generator used in a row's window, as a
    share of its wall time; under 0.05 CPU-s counts as none (/proc/PID/stat ticks are 10 ms)."""
    cpu, wall = row.get("others_cpu_s") or 0.0, row.get("wall_s") or 0.0
    return cpu / wall if wall and cpu >= 0.05 else 0.0


def group_rss_mb(pgid: int) -> float:
    return sum(eng.group_rss(pgid).values()) / 2**20


def log_problems(path: Path, patterns: tuple[str, ...]) -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if any(p in line for p in patterns):
                out.append(line.strip()[:300])
    return out


def compile_bytecode(tree: Path) -> None:
    """Write the ``__pycache__`` of pyfront's packages under ``tree`` (a checkout, or a snapshot's import root)."""
    import compileall

    for name in ("server", "engine_client", "hashing", "pyfront"):
        if (tree / name).is_dir():
            compileall.compile_dir(str(tree / name), quiet=1)


def prime_tokenizer_snapshot(model: Path, env: dict[str, str]) -> dict[str, Any]:
    """Load pyfront's tokenizer for `model` once, as `pyfront serve` does (server/text/lean.py), before the measured
    start: the first start after an install or upgrade loads it with transformers and writes the tokenizer snapshot
    every later start loads without transformers. Returns that load's time and what it did, for the report."""
    code = (
        "import time; t = time.monotonic()\n"
        "from pyfront.server.text.lean import SnapshotStore\n"
        "from pyfront.server.text.tokenizer import Tokenizer\n"
        f"tok = Tokenizer({str(model)!r}, snapshots=SnapshotStore(SnapshotStore.default_directory()))\n"
        "print(round(time.monotonic() - t, 2), tok.mode, tok.snapshot)\n"
    )
    cwd = env.get("PYTHONPATH") or str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **env})  # fmt: skip
    if proc.returncode != 0:
        return {"error": proc.stderr[-500:]}
    seconds, mode, snapshot = proc.stdout.strip().splitlines()[-1].split(" ", 2)
    return {"seconds": float(seconds), "mode": mode, "snapshot": snapshot}


class Launch:
    """A peer's front end and its mock engine, on fresh ports, not started yet (`start`)."""

    def __init__(self, peer: str, args: argparse.Namespace, model: Path, pdir: Path, arrivals: Path, log: str) -> None:
        self.peer, self.pdir, self.log = peer, pdir, log
        self.rpc = eng.free_port()
        self.http = eng.free_port()
        while self.http == self.rpc:
            self.http = eng.free_port()
        self.fe_argv, self.fe_env = frontend_argv(peer, args, model, self.rpc, self.http)
        self.m_argv = mock_argv(peer, args, self.rpc, arrivals)
        self.fe: eng.Handle | None = None
        self.mock: eng.Handle | None = None

    def start(self) -> None:
        self.fe = spawn(self.peer, self.fe_argv, FE_CORE, self.pdir / f"{self.log}frontend.log", self.rpc, self.http,
                        self.fe_env)  # fmt: skip
        self.mock = eng._spawn("mock", ["taskset", "-c", LOAD_CORE, *self.m_argv], self.pdir / f"{self.log}mock.log",
                               self.rpc, None, {"PYTHONPATH": str(ROOT)}, True)  # fmt: skip

    def handles(self) -> list[eng.Handle]:
        return [h for h in (self.fe, self.mock) if h is not None]


def run_peer(peer: str, args: argparse.Namespace, model: Path, out: Path, run_id: str) -> dict[str, Any]:
    pdir = out / peer
    pdir.mkdir(parents=True, exist_ok=True)
    arrivals = pdir / "arrivals.log"
    arrivals.unlink(missing_ok=True)
    launch = Launch(peer, args, model, pdir, arrivals, "")
    res: dict[str, Any] = {"peer": peer, "version": peer_version(peer, args), "repeats": [], "notes": []}
    res["frontend_cmd"] = " ".join(["taskset", "-c", FE_CORE, *launch.fe_argv])
    res["mock_cmd"] = " ".join(["taskset", "-c", LOAD_CORE, *launch.m_argv])
    fe = mock = None
    t_start = time.monotonic()
    if peer.startswith("pyfront"):
        res["tokenizer_snapshot"] = prime_tokenizer_snapshot(model, launch.fe_env)
    try:
        t0 = time.monotonic()
        launch.start()
        fe, mock = launch.fe, launch.mock
        assert fe is not None and mock is not None
        eng.wait_healthy(fe, timeout=args.health_timeout, also_alive=[mock], poll_s=STARTUP_POLL_S)
        res["startup_s"] = time.monotonic() - t0
        res["rss_at_health_mb"] = group_rss_mb(fe.pgid)
        models = json.loads(urllib.request.urlopen(f"{fe.url}/v1/models", timeout=30).read())
        name = models["data"][0]["id"]
        res["model_name"] = name
        common = ["--url", fe.url, "--model", name, "--fe-pgid", str(fe.pgid), "--mock-pgid", str(mock.pgid)]
        warm = run_loadgen("warmup", [*common, "--tag", f"pb{run_id}w"], 300)
        res["warmup"] = warm
        if warm["n_errors"]:
            res["notes"].append(f"warm-up errors: {warm['errors']}")
        time.sleep(args.settle)
        res["idle_rss_mb"] = group_rss_mb(fe.pgid)
        res["processes"] = len(eng.group_pids(fe.pgid))
        for rep in range(args.repeats + args.retries):
            clean = sum(1 for x in res["repeats"] if not x["disturbed"])
            if clean >= args.repeats or (rep >= args.repeats and not args.retries):
                break
            if rep and time.monotonic() - t_start > args.peer_budget:
                res["notes"].append(
                    f"stopped after {rep} repeat(s) ({clean} undisturbed): past the {args.peer_budget:.0f} s budget"
                )
                break
            r: dict[str, Any] = {}
            waited, busiest = wait_quiet(args.quiet_wait)
            r["quiet_wait_s"], r["busiest_core_before"] = waited, busiest
            if busiest > 0.10:
                res["notes"].append(f"repeat {rep + 1} started on a busy machine (a core {100 * busiest:.0f}% busy)")
            tag = f"pb{run_id}r{rep:02d}"
            r["streams"] = run_loadgen(
                "streams",
                [*common, "--tag", tag, "--streams", str(args.streams), "--max-tokens", str(args.stream_tokens)],
                300,
            )
            time.sleep(args.settle)
            offset = len(read_arrivals(arrivals))
            chat = run_loadgen(
                "chat",
                [*common, "--tag", tag, "--turns", str(args.turns), "--turn-tokens", str(args.turn_tokens),
                 "--max-tokens", str(args.chat_tokens), "--tokenizer-json", str(model / "tokenizer.json")],
                480,
            )  # fmt: skip
            chat["match"] = match_turns(chat, read_arrivals(arrivals), offset)
            r["chat"] = chat
            time.sleep(args.settle)
            r["seq"] = run_loadgen(
                "seq", [*common, "--tag", tag, "--requests", str(args.seq_requests), "--max-tokens", "1"], 300
            )
            time.sleep(args.settle)
            r["rps"] = run_loadgen(
                "rps",
                [*common, "--tag", tag, "--requests", str(args.rps_requests), "--concurrency",
                 str(args.rps_concurrency), "--max-tokens", "1"],
                300,
            )  # fmt: skip
            by_id = add_times(read_arrivals(arrivals))
            for key in ("streams", "seq"):
                lat = add_latencies(r[key].pop("records", []), by_id)
                r[key]["add_p50_s"] = statistics.median(lat) if lat else None
                r[key]["add_max_s"] = max(lat) if lat else None
                r[key]["add_matched"] = len(lat)
            r["foreign"] = max(foreign_share(r[k]) for k in ("streams", "chat", "seq", "rps"))
            r["disturbed"] = r["foreign"] > args.max_foreign
            res["repeats"].append(r)
            print(f"  {peer} repeat {rep + 1}: {summarize_repeat(r)}", flush=True)
            if not fe.alive():
                res["notes"].append("front end exited during the run")
                break
        res["rss_after_load_mb"] = group_rss_mb(fe.pgid)
        arr = read_arrivals(arrivals)
        res["engine_id_examples"] = [rid for _, rid in arr[-2:]]
    except Exception as exc:  # reported in the table notes
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for h in (fe, mock):
            if h is not None:
                with contextlib.suppress(Exception):
                    res.setdefault("stopped", {})[h.kind] = eng.stop(h, grace=10)
        left = [p for h in (fe, mock) if h is not None for p in eng.group_pids(h.pgid)]
        if left:
            res["notes"].append(f"processes left running: {left}")
        res["elapsed_s"] = time.monotonic() - t_start
    res["frontend_log_problems"] = log_problems(
        pdir / "frontend.log", ("Traceback", "ERROR", "Error:", "panicked", "WARN ", "WARNING")
    )[:20]
    res["mock_log_problems"] = log_problems(pdir / "mock.log", ("ERROR", "WARNING", "differ", "bad prompt"))[:20]
    (pdir / "result.json").write_text(json.dumps(res, indent=1))
    return res


def run_interleaved_seq(peers: list[str], args: argparse.Namespace, model: Path, out: Path, run_id: str) -> dict:
    """The sequential row again, with every peer up at once and their turns interleaved; then the bursts.

    The sequential row compares per-request costs a few percent apart, and this VM's speed drifts by more than that
    over the minute that separates one peer's portion from the next. Here every peer's front end (core 0) and mock
    (core 1) run side by side, idle except for their turn; each of `--seq-rounds` rounds runs `--seq-round-requests`
    sequential requests on every peer, in an order that rotates by one peer each round, so a drift of the machine
    falls on every peer alike. Figures per peer: the per-round latency p50 and front-end CPU per request (schedstat),
    their medians over the rounds reported.

    Then `--burst-rounds` rounds of the two burst rows the same way (the order rotating too): the rps row's load
    (`--rps-requests` over `--rps-concurrency` connections) and a burst of `--streams` streams of
    `--burst-stream-tokens` tokens, for its TTFT. In a peer's own portion these rows read the VM's drift as much as the
    front end: vllm-rs's own rps moved 2.2x between four runs of stop 38 (benchmarks/README.md).
    """
    launches: dict[str, Launch] = {}
    arrival_logs: dict[str, Path] = {}
    res: dict[str, Any] = {"rounds": [], "notes": []}
    try:
        for peer in peers:
            pdir = out / peer
            arrival_logs[peer] = arrivals = pdir / "interleaved-arrivals.log"
            arrivals.unlink(missing_ok=True)
            launches[peer] = launch = Launch(peer, args, model, pdir, arrivals, "interleaved-")
            launch.start()
        common: dict[str, list[str]] = {}
        for peer, launch in launches.items():
            assert launch.fe is not None and launch.mock is not None
            eng.wait_healthy(launch.fe, timeout=args.health_timeout, also_alive=[launch.mock])
            url = f"http://127.0.0.1:{launch.http}"
            models = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=30).read())
            common[peer] = ["--url", url, "--model", models["data"][0]["id"], "--fe-pgid",
                            str(launch.fe.pgid), "--mock-pgid", str(launch.mock.pgid)]  # fmt: skip
            run_loadgen("warmup", [*common[peer], "--tag", f"pb{run_id}w"], 300)
        time.sleep(args.settle)
        for rnd in range(args.seq_rounds):
            order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
            row: dict[str, Any] = {"order": order}
            for peer in order:
                q = run_loadgen(
                    "seq",
                    [*common[peer], "--tag", f"pb{run_id}r{rnd:02d}", "--requests", str(args.seq_round_requests),
                     "--max-tokens", "1"],
                    300,
                )  # fmt: skip
                add = add_latencies(q.pop("records", []), add_times(read_arrivals(arrival_logs[peer])))
                row[peer] = {
                    "latency_p50_s": q["latency_p50_s"],
                    "add_p50_s": statistics.median(add) if add else None,
                    "fe_cpu_s_per_request": q["fe_cpu_precise_s_per_request"],
                    "n_errors": q["n_errors"],
                    "foreign": foreign_share(q),
                }
            res["rounds"].append(row)
            print(f"  round {rnd + 1}: " + ", ".join(
                f"{p} {ms(row[p]['latency_p50_s'], 3)} / {ms(row[p]['fe_cpu_s_per_request'], 3)} (send->ADD "
                f"{ms(row[p]['add_p50_s'], 3)})" for p in peers
            ), flush=True)  # fmt: skip
        res["bursts"] = []
        for rnd in range(args.burst_rounds):
            order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
            burst: dict[str, Any] = {"order": order}
            for peer in order:
                tag = f"pb{run_id}b{rnd:02d}"
                time.sleep(args.settle)
                x = run_loadgen(
                    "rps",
                    [*common[peer], "--tag", tag, "--requests", str(args.rps_requests), "--concurrency",
                     str(args.rps_concurrency), "--max-tokens", "1"],
                    300,
                )  # fmt: skip
                time.sleep(args.settle)
                y = run_loadgen(
                    "streams",
                    [*common[peer], "--tag", tag, "--streams", str(args.streams), "--max-tokens",
                     str(args.burst_stream_tokens)],
                    300,
                )  # fmt: skip
                burst[peer] = {
                    "rps": x["rps"],
                    "rps_cpu_s_per_request": x["fe_cpu_s_per_request"],
                    "ttft_p50_s": y["ttft_p50_s"],
                    "n_errors": x["n_errors"] + y["n_errors"],
                    "foreign": max(foreign_share(x), foreign_share(y)),
                }
            res["bursts"].append(burst)
            print(f"  burst round {rnd + 1}: " + ", ".join(
                f"{p} {burst[p]['rps']:.0f} rps / TTFT {ms(burst[p]['ttft_p50_s'], 0)}" for p in peers
            ), flush=True)  # fmt: skip
    except Exception as exc:  # reported in the table notes
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for launch in launches.values():
            for h in launch.handles():
                with contextlib.suppress(Exception):
                    eng.stop(h, grace=10)
    return res


def run_interleaved_startups(peers: list[str], args: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
    """Start-up to /health, `--startup-rounds` times per peer, the peers in turn (the order rotating by one each
    round), /health polled every STARTUP_POLL_S: the portion's single start of each peer lands on a drift of the VM,
    and a 0.25 s poll rounds the figure to a quarter second. Each start is a fresh front end and mock, spawned
    together as in the portion (so an engine connects while the front end starts, as in a real deployment), both
    stopped before the next start."""
    res: dict[str, Any] = {"rounds": [], "notes": []}
    try:
        for rnd in range(args.startup_rounds):
            order = peers[rnd % len(peers) :] + peers[: rnd % len(peers)]
            row: dict[str, float] = {}
            for peer in order:
                pdir = out / peer
                launch = Launch(peer, args, model, pdir, pdir / "startup-arrivals.log", "startup-")
                try:
                    t0 = time.monotonic()
                    launch.start()
                    assert launch.fe is not None and launch.mock is not None
                    eng.wait_healthy(launch.fe, timeout=args.health_timeout, also_alive=[launch.mock],
                                     poll_s=STARTUP_POLL_S)  # fmt: skip
                    row[peer] = time.monotonic() - t0
                finally:
                    for h in launch.handles():
                        with contextlib.suppress(Exception):
                            eng.stop(h, grace=10)
                time.sleep(args.settle)
            res["rounds"].append(row)
            print(f"  round {rnd + 1}: " + ", ".join(f"{p} {row[p]:.2f} s" for p in peers), flush=True)
    except Exception as exc:  # reported in the table notes
        res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def interleaved_figures(res: dict[str, Any], peer: str) -> tuple[list[float | None], list[float | None]]:
    """(latency p50s, CPU per request) of `peer` over the interleaved rounds."""
    rounds = [r[peer] for r in res.get("rounds", []) if peer in r and not r[peer]["n_errors"]]
    return [r["latency_p50_s"] for r in rounds], [r["fe_cpu_s_per_request"] for r in rounds]


# ------------------------------------------------------------------------------------------------ figures


def chat_figures(chat: dict[str, Any]) -> tuple[float | None, float | None]:
    turns = [t for t in chat["turns"] if "add_latency" in t and "error" not in t]
    if not turns or len(turns) < len(chat["turns"]):
        return None, None
    last = turns[-1]["add_latency"]
    tail = [t["add_latency"] for t in turns[-11:]]
    return last, statistics.median(tail)


def summarize_repeat(r: dict[str, Any]) -> str:
    s, c, q = r["streams"], r["chat"], r["seq"]
    last, tail = chat_figures(c)
    return (
        f"[other processes: {100 * r['foreign']:.0f}% of a core{' DISTURBED' if r['disturbed'] else ''}] "
        f"streams cpu/1k={fmt(s['fe_cpu_s_per_1k_tokens'], '.4f')} ttft_p50={ms(s['ttft_p50_s'])} "
        f"err={s['n_errors']} | chat last={ms(last)} tail={ms(tail)} err={c['n_errors']} ({c.get('match')}) | "
        f"seq p50={ms(q['latency_p50_s'], 3)} cpu/req={ms(q.get('fe_cpu_precise_s_per_request'), 3)} "
        f"err={q['n_errors']}"
    )


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def ms(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v * 1000:.{digits}f} ms"


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: list[float | None], scale: float = 1.0, spec: str = ".1f") -> str:
    vals = [v * scale for v in values if v is not None]
    if len(vals) < 2:
        return ""
    return f" ({format(min(vals), spec)}-{format(max(vals), spec)})"


def figures(res: dict[str, Any]) -> dict[str, Any]:
    reps = res.get("repeats", [])
    clean = [r for r in reps if not r.get("disturbed")]
    reps = clean or reps
    cpu1k = [r["streams"]["fe_cpu_s_per_1k_tokens"] for r in reps]
    ttft = [r["streams"]["ttft_p50_s"] for r in reps]
    last = [chat_figures(r["chat"])[0] for r in reps]
    tail = [chat_figures(r["chat"])[1] for r in reps]
    seq_lat = [r["seq"]["latency_p50_s"] for r in reps]
    seq_cpu = [r["seq"].get("fe_cpu_precise_s_per_request", r["seq"]["fe_cpu_s_per_request"]) for r in reps]
    rps = [r["rps"]["rps"] for r in reps if "rps" in r]
    rps_cpu = [r["rps"]["fe_cpu_s_per_request"] for r in reps if "rps" in r]
    return {
        "rps": (med(rps), rps),
        "rps_cpu": (med(rps_cpu), rps_cpu),
        "cpu1k": (med(cpu1k), cpu1k),
        "ttft": (med(ttft), ttft),
        "add_last": (med(last), last),
        "add_tail": (med(tail), tail),
        "seq_lat": (med(seq_lat), seq_lat),
        "seq_cpu": (med(seq_cpu), seq_cpu),
    }


def print_report(
    results: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    facts: dict[str, Any],
    interleaved: dict[str, Any],
    startups: dict[str, Any],
) -> str:
    lines: list[str] = []
    w = lines.append
    peers = [p for p in PEER_ORDER if p in results]
    w(f"machine: {facts['cpus']} CPUs, {facts['cpu_model']}, {facts['memory']}, Linux {facts['kernel']}, "
      f"Python {facts['python']}, pyfront {facts['pyfront_rev']}")  # fmt: skip
    w(f"settings: front end on core {FE_CORE} (taskset), mock engine + load generator on core {LOAD_CORE}; mock "
      f"--step-interval {args.step_interval} --step-on-arrival --max-model-len {args.max_model_len}; "
      f"{args.streams} streams x {args.stream_tokens} tokens; chat {args.turns} turns x ~{args.turn_tokens} tokens, "
      f"max_tokens {args.chat_tokens}, think time 0.05 s; {args.seq_requests} sequential requests, max_tokens 1; "
      f"{args.rps_requests} requests over {args.rps_concurrency} connections, max_tokens 1; "
      f"repeats {args.repeats} (medians); model dir {args.model_dir} (max_position_embeddings raised to "
      f"{args.max_model_len} in a symlinked copy)")  # fmt: skip
    for p in peers:
        w(f"  {p}: {results[p].get('version', '?')}")
    w("")
    hdr = ["figure", *[PEER_TITLES[p] for p in peers]]
    w("| " + " | ".join(hdr) + " |")
    w("|" + "---|" * len(hdr))
    figs = {p: figures(results[p]) if not results[p].get("skipped") else None for p in peers}

    def row(label: str, cell) -> None:
        cells = []
        for p in peers:
            r = results[p]
            if r.get("skipped"):
                cells.append("skipped")
            elif figs[p] is None:
                cells.append("-")
            else:
                try:
                    cells.append(cell(p, r, figs[p]))
                except Exception:
                    cells.append("-")
        w(f"| {label} | " + " | ".join(cells) + " |")

    n, m, t = args.streams, args.stream_tokens, args.turns
    row(f"{n} concurrent streams, {m} tokens each: front-end CPU-s per 1k output tokens",
        lambda p, r, f: fmt(f["cpu1k"][0], ".4f") + spread(f["cpu1k"][1], 1, ".4f"))  # fmt: skip
    row(f"{n} streams: TTFT p50", lambda p, r, f: ms(f["ttft"][0], 0) + spread(f["ttft"][1], 1000, ".0f"))
    row(f"one chat of {t} turns growing by ~{args.turn_tokens // 1000}k tokens: request sent -> engine ADD, turn "
        f"{t} (median over turns {max(1, t - 10)}-{t})",
        lambda p, r, f: f"{ms(f['add_last'][0])} ({ms(f['add_tail'][0])})")  # fmt: skip
    row(f"1 connection, {args.seq_requests} sequential requests with max_tokens 1: latency p50 / front-end CPU per "
        "request (schedstat)", lambda p, r, f: f"{ms(f['seq_lat'][0], 3)} / {ms(f['seq_cpu'][0], 3)}")  # fmt: skip
    if interleaved.get("rounds"):

        def interleaved_cell(p: str, r: dict[str, Any], f: dict[str, Any]) -> str:
            lat, cpu = interleaved_figures(interleaved, p)
            if not lat:
                return "-"
            return (f"{ms(med(lat), 3)}{spread(lat, 1000, '.3f')} / "
                    f"{ms(med(cpu), 3)}{spread(cpu, 1000, '.3f')}")  # fmt: skip

        row(f"the same, every peer up at once and their turns interleaved: {len(interleaved['rounds'])} rounds of "
            f"{args.seq_round_requests} sequential requests per peer; median of the rounds' latency p50 / front-end "
            "CPU per request", interleaved_cell)  # fmt: skip
    row(f"{args.rps_concurrency} connections, short requests with max_tokens 1: requests per second (front-end CPU "
        "per request)",
        lambda p, r, f: f"{f['rps'][0]:.0f}{spread(f['rps'][1], 1, '.0f')} ({ms(f['rps_cpu'][0], 2)})")  # fmt: skip
    bursts = interleaved.get("bursts") or []
    if bursts:

        def burst_cell(key: str, scale: float, spec: str, suffix: str) -> Any:
            def cell(p: str, r: dict[str, Any], f: dict[str, Any]) -> str:
                values = [b[p][key] for b in bursts if p in b and not b[p]["n_errors"]]
                if not values:
                    return "-"
                return f"{format(med(values) * scale, spec)}{suffix}{spread(values, scale, spec)}"

            return cell

        row(f"the same, every peer up at once and their turns interleaved: {len(bursts)} rounds; median requests per "
            "second", burst_cell("rps", 1, ".0f", ""))  # fmt: skip
        row(f"{n} streams of {args.burst_stream_tokens} tokens, every peer up at once and their turns interleaved: "
            f"{len(bursts)} rounds; median TTFT p50", burst_cell("ttft_p50_s", 1000, ".0f", " ms"))  # fmt: skip
    row("startup to /health; idle RSS",
        lambda p, r, f: f"{r['startup_s']:.2f} s; {r['idle_rss_mb']:.0f} MB")  # fmt: skip
    if startups.get("rounds"):

        def startup_cell(p: str, r: dict[str, Any], f: dict[str, Any]) -> str:
            times = [rnd[p] for rnd in startups["rounds"] if p in rnd]
            return f"{med(times):.2f} s{spread(times, 1, '.2f')}" if times else "-"

        row(f"start-up to /health again, every peer started {len(startups['rounds'])} times in turn (front end and "
            f"mock spawned together, /health polled every {1000 * STARTUP_POLL_S:.0f} ms): median",
            startup_cell)  # fmt: skip
    w("")
    w("¹ FEH (front-end block hashing: the front end sends prompt_block_hashes, VLLM_NATIVE_FEH=1, mock started "
      "with --advertise-feh) is pyfront's feature; the other front ends run against a mock that does not advertise "
      "it. 'pyfront (no FEH)': VLLM_NATIVE_FEH=0 and a mock without --advertise-feh.")  # fmt: skip
    w("Ranges in parentheses after a median: min-max over repeats. RSS: sum over the front end's processes, after "
      "the warm-up and an idle pause.")  # fmt: skip
    for p in ("vllm-rs", "vllm"):
        w(f"Reference ({PEER_TITLES[p]}, measured by others): {REFERENCE[p]}")
    w("")
    w("details:")
    for p in peers:
        r = results[p]
        if r.get("skipped"):
            w(f"- {p}: SKIPPED: {r['skipped']}")
            continue
        w(f"- {p}: {r.get('frontend_cmd', '')}")
        if r.get("error"):
            w(f"    ERROR: {r['error']}")
        for note in r.get("notes", []):
            w(f"    note: {note}")
        primed = r.get("tokenizer_snapshot")
        if primed:
            w(f"    tokenizer load before the measured start (the first start after an install or upgrade writes the "
              f"tokenizer snapshot): {primed}")  # fmt: skip
        if "startup_s" in r:
            w(f"    processes {r.get('processes')}; RSS at /health {r.get('rss_at_health_mb', 0):.0f} MB, idle "
              f"{r.get('idle_rss_mb', 0):.0f} MB, after the load {r.get('rss_after_load_mb', 0):.0f} MB; "
              f"portion took {r.get('elapsed_s', 0):.0f} s")  # fmt: skip
        for i, rep in enumerate(r.get("repeats", [])):
            s, c, q = rep["streams"], rep["chat"], rep["seq"]
            turns = c["turns"]
            e2e = turns[-1]["latency"] if turns else None
            ptoks = turns[-1].get("prompt_tokens") if turns else None
            others = [x for k in ("streams", "chat", "seq", "rps") for x in rep[k].get("other_processes", [])]
            dropped = rep.get("disturbed") and not all(x.get("disturbed") for x in r["repeats"])
            w(
                f"    repeat {i + 1}{' (DISTURBED, not in the medians)' if dropped else ''}: "
                f"other processes used {100 * rep['foreign']:.0f}% of a core at worst; waited "
                f"{rep['quiet_wait_s']:.0f} s for a quiet machine; other processes busy: "
                f"{', '.join(others) or 'none'}"
            )
            w(f"      streams: {s['ok']}/{s['streams']} ok, {s['tokens']} tokens in {s['wall_s']:.2f} s, "
              f"front end {s['fe_cpu_s']:.2f} CPU-s, TTFT p90 {ms(s['ttft_p90_s'], 0)}, max {ms(s['ttft_max_s'], 0)}; "
              f"core 1: load generator {s['loadgen_cpu_s']:.2f} + mock {s['mock_cpu_s']:.2f} CPU-s "
              f"= {100 * (s['core1_busy'] or 0):.0f}% busy; send->ADD p50 {ms(s['add_p50_s'])}, "
              f"max {ms(s['add_max_s'])}; "
              f"front-end CPU by schedstat {s['fe_cpu_precise_s']:.2f} s"
              + (f"; short streams {s['short_streams']}" if s["short_streams"] else "")
              + (f"; errors {s['n_errors']}: {s['errors'][:1]}" if s["n_errors"] else ""))  # fmt: skip
            w(f"      chat: {len(turns)} turns, last prompt {ptoks} tokens ({turns[-1]['body_bytes'] if turns else 0} "
              f"B body), turn latency at the end {ms(e2e)}, front end {c['fe_cpu_s']:.2f} CPU-s for the chat "
              f"(schedstat {c['fe_cpu_precise_s']:.2f}), "
              f"ADD matched by {c.get('match')}" + (f"; errors {c['n_errors']}: {turns[-1].get('error')}"
                                                    if c["n_errors"] else ""))  # fmt: skip
            w(f"      seq: p90 {ms(q['latency_p90_s'], 2)}, mean {ms(q['latency_mean_s'], 2)}, "
              f"front end {q['fe_cpu_s']:.3f} CPU-s (schedstat {q['fe_cpu_precise_s']:.3f}), send->ADD p50 "
              f"{ms(q['add_p50_s'], 2)}, reconnects {q['reconnects']}"
              + (f", errors {q['n_errors']}: {q['errors'][:1]}" if q["n_errors"] else ""))  # fmt: skip
            if "rps" in rep:
                x = rep["rps"]
                w(f"      rps: {x['requests']} requests in {x['wall_s']:.2f} s over {x['concurrency']} connections, "
                  f"latency p50 {ms(x['latency_p50_s'], 1)} p99 {ms(x['latency_p99_s'], 1)}, front-end core "
                  f"{100 * x['fe_core_busy']:.0f}% busy, mock {x['mock_cpu_s']:.2f} + load generator "
                  f"{x['loadgen_cpu_s']:.2f} CPU-s on core 1, reconnects {x['reconnects']}"
                  + (f", errors {x['n_errors']}: {x['errors'][:1]}" if x["n_errors"] else ""))  # fmt: skip
        if r.get("engine_id_examples"):
            w(f"    engine request ids look like: {r['engine_id_examples'][-1]}")
        if r.get("frontend_log_problems"):
            w(f"    front-end log lines worth a look ({len(r['frontend_log_problems'])} shown at most 20):")
            for line in r["frontend_log_problems"][:6]:
                w(f"      {line}")
        if r.get("mock_log_problems"):
            w("    mock log warnings: " + " | ".join(r["mock_log_problems"][:4]))
    if interleaved:
        w("- interleaved sequential rounds (latency p50 / front-end CPU per request / send->ADD p50; others' share "
          "of a core):")  # fmt: skip
        if interleaved.get("error"):
            w(f"    ERROR: {interleaved['error']}")
        for i, rnd in enumerate(interleaved.get("rounds", [])):
            w(f"    round {i + 1}: " + ", ".join(
                f"{p} {ms(rnd[p]['latency_p50_s'], 3)} / {ms(rnd[p]['fe_cpu_s_per_request'], 3)} / "
                f"{ms(rnd[p].get('add_p50_s'), 3)}; "
                f"{100 * rnd[p]['foreign']:.0f}%" + (f", {rnd[p]['n_errors']} errors" if rnd[p]["n_errors"] else "")
                for p in rnd["order"]
            ))  # fmt: skip
        for i, burst in enumerate(interleaved.get("bursts") or []):
            w(f"    burst round {i + 1} (rps (front-end CPU per request) / TTFT p50; others' share): " + ", ".join(
                f"{p} {burst[p]['rps']:.0f} ({ms(burst[p]['rps_cpu_s_per_request'], 3)}) / "
                f"{ms(burst[p]['ttft_p50_s'], 0)}; {100 * burst[p]['foreign']:.0f}%"
                + (f", {burst[p]['n_errors']} errors" if burst[p]["n_errors"] else "")
                for p in burst["order"]
            ))  # fmt: skip
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 32 streams x 64 tokens, 10 turns, 20 requests")
    p.add_argument("--peers", default=",".join(PEER_ORDER), help=f"comma-separated subset of {','.join(PEER_ORDER)}")
    p.add_argument("--repeats", type=int, default=None, help="repeats of the load rows (default 3; 1 with --quick)")
    p.add_argument("--model-dir", type=Path, default=None, help="default ~/.cache/pyfront/tiny-qwen3")
    p.add_argument("--vllm-rs", type=Path, default=eng.default_vllm_rs())
    p.add_argument("--vllm-venv", type=Path, default=eng.default_venv())
    p.add_argument(
        "--pyfront-src",
        type=Path,
        default=None,
        help="run pyfront from this source tree (e.g. a `git archive` snapshot) instead of the repo",
    )
    p.add_argument("--out", type=Path, default=None, help="directory for logs and raw results")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--step-interval", type=float, default=0.02)
    p.add_argument("--streams", type=int, default=None)
    p.add_argument("--stream-tokens", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--turn-tokens", type=int, default=2000)
    p.add_argument("--chat-tokens", type=int, default=8)
    p.add_argument("--seq-requests", type=int, default=None)
    p.add_argument(
        "--seq-rounds", type=int, default=None, help="rounds of the interleaved sequential row (default 10; 0: none)"
    )
    p.add_argument("--seq-round-requests", type=int, default=None, help="requests per peer and round (default 300)")
    p.add_argument(
        "--burst-rounds", type=int, default=None, help="rounds of the interleaved rps and TTFT rows (default 5)"
    )
    p.add_argument(
        "--burst-stream-tokens", type=int, default=32, help="tokens per stream of the interleaved TTFT row's bursts"
    )
    p.add_argument(
        "--startup-rounds", type=int, default=None, help="starts of each peer for the start-up row (default 5; 0: none)"
    )
    p.add_argument("--rps-requests", type=int, default=None, help="requests of the rps row (default 3000)")
    p.add_argument("--rps-concurrency", type=int, default=64)
    p.add_argument("--settle", type=float, default=1.0, help="idle pause between loads, s")
    p.add_argument(
        "--retries", type=int, default=3, help="extra repeats allowed to replace disturbed ones (within --peer-budget)"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60,
        help="before each repeat, wait up to this many s for the machine to be idle (other jobs)",
    )
    p.add_argument(
        "--max-foreign",
        type=float,
        default=0.05,
        help="a repeat in which other processes used more than this share of a core is 'disturbed'; medians "
        "use the undisturbed repeats when there are any",
    )
    p.add_argument("--health-timeout", type=float, default=240)
    p.add_argument("--peer-budget", type=float, default=420, help="no new repeat for a peer after this many s")
    args = p.parse_args(argv)
    q = args.quick
    args.streams = args.streams or (32 if q else 256)
    args.stream_tokens = args.stream_tokens or (64 if q else 256)
    args.turns = args.turns or (10 if q else 50)
    args.seq_requests = args.seq_requests or (20 if q else 1000)
    args.seq_rounds = (2 if q else 10) if args.seq_rounds is None else args.seq_rounds
    args.seq_round_requests = args.seq_round_requests or (20 if q else 300)
    args.rps_requests = args.rps_requests or (300 if q else 3000)
    args.burst_rounds = (1 if q else 5) if args.burst_rounds is None else args.burst_rounds
    args.startup_rounds = (1 if q else 5) if args.startup_rounds is None else args.startup_rounds
    args.repeats = args.repeats or (1 if q else 3)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEER_ORDER]
    if unknown:
        p.error(f"unknown peers {unknown}; choose from {PEER_ORDER}")
    if os.cpu_count() and os.cpu_count() < 2:
        p.error("needs at least 2 cores (front end on core 0, mock + load generator on core 1)")
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {int(LOAD_CORE)})  # this orchestrator stays off the front end's core
    src = args.model_dir or default_model_dir()
    args.model_dir = src
    out = args.out or Path(f"/tmp/pyfront-peers-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    model = prepare_model_dir(Path(src), out, args.max_model_len)
    facts = machine_facts()
    if args.pyfront_src:
        facts["pyfront_rev"] = f"run from {args.pyfront_src} (repo HEAD {facts['pyfront_rev']})"
    for tree in (ROOT, *([Path(args.pyfront_src)] if args.pyfront_src else [])):
        compile_bytecode(tree)
    run_id = secrets.token_hex(3)
    print(f"peers: {peers}; logs and raw results in {out}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for peer in PEER_ORDER:
        if peer not in peers:
            continue
        missing = peer_missing(peer, args)
        if missing:
            print(f"skipping {peer}: {missing}", flush=True)
            results[peer] = {"peer": peer, "skipped": missing}
            continue
        print(f"running {peer} ...", flush=True)
        results[peer] = run_peer(peer, args, model, out, run_id)
        r = results[peer]
        print(f"  {peer} done in {r.get('elapsed_s', 0):.0f} s" + (f"; ERROR {r['error']}" if r.get("error") else ""),
              flush=True)  # fmt: skip
    ran = [p for p in PEER_ORDER if p in results and not results[p].get("skipped") and not results[p].get("error")]
    interleaved: dict[str, Any] = {}
    if args.seq_rounds and len(ran) > 1:
        print(f"sequential requests, {', '.join(ran)} interleaved ...", flush=True)
        interleaved = run_interleaved_seq(ran, args, model, out, run_id)
        if interleaved.get("error"):
            print(f"  ERROR {interleaved['error']}", flush=True)
    startups: dict[str, Any] = {}
    if args.startup_rounds and ran:
        print(f"start-up, {', '.join(ran)} in turn ...", flush=True)
        startups = run_interleaved_startups(ran, args, model, out)
        if startups.get("error"):
            print(f"  ERROR {startups['error']}", flush=True)
    print()
    text = print_report(results, args, facts, interleaved, startups)
    (out / "report.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"facts": facts, "args": {k: str(v) for k, v in vars(args).items()},
                                                  "results": results, "interleaved_seq": interleaved,
                                                  "startups": startups},
                                                 indent=1))  # fmt: skip
    failed = any(r.get("error") for r in results.values()) or interleaved.get("error") or startups.get("error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
