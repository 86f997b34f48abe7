"""Instructions per request of pyfront's front end, counted by valgrind's callgrind: a figure this noisy machine
cannot move.

    python benchmarks/request_instructions.py [--src TREE ...] [--scenario rps|seq|streams] [--requests 1000]
        [--rounds 3] [--no-feh]

Wall-clock CPU figures on these shared 2-core VMs move by 10-30 % from run to run, as much as a round of
optimisations; callgrind counts the instructions the process executes (all its threads, user space only), the same
for the same code and load within ~0.2 %. Each `--src` (a checkout or a `git archive` of one; default this
tree) is started as `pyfront serve` under `valgrind --tool=callgrind --instr-atstart=no` against a fresh mock
engine, warmed up, then instrumented only while `loadgen.py SCENARIO` sends `--requests` short requests
(`max_tokens` 1; `rps`: 16 connections; `streams`: one burst of `--requests` streamed chats of 4 tokens each),
and the count is divided by the requests. The trees alternate, `--rounds` times. Printed: instructions per
request per tree (median and min-max), and each tree's ratio to the first.

What it does not see: the kernel (system calls, context switches, the network stack) and waiting; a change that
saves a system call or a wake-up shows in peers.py's CPU rows, not here. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.real_engine import engine as eng  # noqa: E402

LOADGEN = ROOT / "benchmarks" / "loadgen.py"


def import_root(tree: Path) -> Path:
    """Where `import pyfront` finds `tree`'s packages: its .typecheck folder (symlinks named pyfront/...)."""
    root = tree / ".typecheck"
    if not (root / "pyfront" / "server").exists():
        raise SystemExit(f"{tree} has no .typecheck/pyfront (a checkout or a git archive of one)")
    return root


def count(tree: Path, model: Path, scenario: str, requests: int, workdir: Path, feh: bool = True) -> int:
    """Instructions per request of one run (`feh`: VLLM_NATIVE_FEH=1 against a mock that advertises it)."""
    root = import_root(tree)
    rpc, http = eng.free_port(), eng.free_port()
    out = workdir / f"callgrind.{rpc}"
    env = {**os.environ, "PYTHONPATH": str(root), "VLLM_NATIVE_FEH": "1" if feh else "0"}
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
            "-m", "pyfront.server.cli", "serve", str(model), "--port", str(http), "--data-parallel-rpc-port", str(rpc),
            "--max-model-len", "131072", "--engine-stall-timeout", "600"]  # fmt: skip
    log = (workdir / f"fe.{rpc}.log").open("w")
    fe = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    mock = subprocess.Popen(
        [sys.executable, "-m", "pyfront.engine_client.mock_engine", "--handshake-address", f"tcp://127.0.0.1:{rpc}",
         "--ranks", "0", "--step-interval", "0.02", "--max-model-len", "131072", "--step-on-arrival",
         *(["--advertise-feh"] if feh else [])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            if time.monotonic() > deadline or fe.poll() is not None:
                raise SystemExit(f"pyfront from {tree} did not become healthy (log {log.name})")
            time.sleep(0.5)
        name = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=30).read())["data"][0]["id"]
        if scenario == "streams":  # one burst of streamed chats, 4 tokens each: admission and a few frames
            load = [sys.executable, str(LOADGEN), "streams", "--url", url, "--model", name, "--max-tokens", "4"]
            size = "--streams"
        else:
            load = [sys.executable, str(LOADGEN), scenario, "--url", url, "--model", name, "--max-tokens", "1",
                    "--concurrency", "16"]  # fmt: skip
            size = "--requests"
        subprocess.run([sys.executable, str(LOADGEN), "warmup", "--url", url, "--model", name], check=True,
                       capture_output=True, cwd=ROOT)  # fmt: skip
        subprocess.run([*load, size, "50"], check=True, capture_output=True, cwd=ROOT)
        subprocess.run(["callgrind_control", "-i", "on", str(fe.pid)], check=True, capture_output=True)
        subprocess.run([*load, size, str(requests)], check=True, capture_output=True, cwd=ROOT)
        subprocess.run(["callgrind_control", "-i", "off", str(fe.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(fe.pid)], check=True, capture_output=True)
    finally:
        for proc in (fe, mock):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 2 if proc is fe else 15)
        for proc in (fe, mock):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        log.close()
    total = 0
    for part in workdir.glob(f"callgrind.{rpc}*"):  # the dump, and the (empty) part written at exit
        for line in part.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
        part.unlink()
    return total // requests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", action="append", type=Path, help="a tree to measure (repeatable; default this checkout)")
    p.add_argument("--scenario", choices=("rps", "seq", "streams"), default="rps")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model-dir", type=Path, default=None, help="default ~/.cache/pyfront/tiny-qwen3")
    p.add_argument("--no-feh", action="store_true", help="front-end block hashing off (by default on)")
    a = p.parse_args(argv)
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian's valgrind package)")
    trees = a.src or [ROOT]
    model = a.model_dir or Path(os.environ.get("PYFRONT_CACHE_DIR", Path.home() / ".cache/pyfront")) / "tiny-qwen3"
    counts: dict[Path, list[int]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="pyfront-instructions-") as tmp:
        for _ in range(a.rounds):
            for tree in trees:
                counts[tree].append(count(tree, model, a.scenario, a.requests, Path(tmp), feh=not a.no_feh))
                print(f"{tree}: {counts[tree][-1]:,} instructions/request", flush=True)
    first = statistics.median(counts[trees[0]])
    print(f"\n{a.scenario}, {a.requests} requests a run, {a.rounds} rounds (median, min-max, ratio to the first tree):")
    for tree in trees:
        med = statistics.median(counts[tree])
        print(f"  {tree}: {med:,.0f} ({min(counts[tree]):,}-{max(counts[tree]):,}) {med / first:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
