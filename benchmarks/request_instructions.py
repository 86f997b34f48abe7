"""Instructions per request of pyfront's front end, counted by valgrind's callgrind: a figure this noisy machine
cannot move.

    python benchmarks/request_instructions.py [--src TREE ...] [--scenario rps|seq|streams] [--requests 1000]
        [--rounds 3] [--no-feh] [--cache-sim] [--python PY --functions N]

Wall-clock CPU figures on these shared 2-core VMs move by 10-30 % from run to run, as much as a round of
optimisations; callgrind counts the instructions the process executes (all its threads, user space only), the same
for the same code and load within ~0.2 %. Each `--src` (a checkout or a `git archive` of one; default this
tree) is started as `pyfront serve` under `valgrind --tool=callgrind --instr-atstart=no` against a fresh mock
engine, warmed up, then instrumented only while `loadgen.py SCENARIO` sends `--requests` short requests
(`max_tokens` 1; `rps`: 16 connections; `streams`: one burst of `--requests` streamed chats of 4 tokens each),
and the count is divided by the requests. The trees alternate, `--rounds` times. Printed: instructions per
request per tree (median and min-max), and each tree's ratio to the first.

``--cache-sim`` also runs callgrind's cache simulation and prints the simulated cache misses per request: L1
(instruction and data) and last-level. The last level is set to 512 KB (``--LL=524288,8,64``), a core's own L2
on these VMs, not the machine's L3: between two requests of a server the rest of the machine (the client, the
engine, the kernel) takes over the shared cache, so what a request touches beyond its core's L2 comes back from
memory. Deterministic like the instruction count, and a proxy for that cost, not a measure of it (stop 37 in
benchmarks/README.md: the same function runs 2-10x slower with the caches flushed before it than in a loop).

What it does not see: the kernel (system calls, context switches, the network stack) and waiting; a change that
saves a system call or a wake-up shows in peers.py's CPU rows, not here. Needs valgrind (Debian's package).

Where the instructions go, per Python function: ``--functions N --python PY`` runs the server with ``PY -X perf``
(CPython >= 3.12: every Python function gets a small native trampoline, listed in ``/tmp/perf-PID.map``) and prints
the N functions with the most instructions per request, inclusive of what they call, with callgrind's attribution
to those trampolines. PY is a virtualenv's python with pyfront's dependencies (``python3.12 -m venv V &&
V/bin/pip install -e .``); the tree's own packages still come from ``--src``. The trampolines and 3.12 add some
instructions of their own (~1.1M a short request against ~0.87M on 3.11), so read the map for shares, and the
totals of a 3.11 run for changes. An inclusive figure counts a function once per call, however deep it recurses.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import re
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


def count(
    tree: Path,
    model: Path,
    scenario: str,
    requests: int,
    workdir: Path,
    feh: bool = True,
    python: str = sys.executable,
    functions: int = 0,
    cache_sim: bool = False,
) -> dict[str, int]:
    """Events per request of one run: "Ir" (instructions), and with `cache_sim` "L1 misses" and "LL misses" (see the
    module docstring). `feh`: VLLM_NATIVE_FEH=1 against a mock that advertises it; with `functions`, the server runs
    `python -X perf` and the top `functions` Python functions are printed."""
    root = import_root(tree)
    rpc, http = eng.free_port(), eng.free_port()
    out = workdir / f"callgrind.{rpc}"
    env = {**os.environ, "PYTHONPATH": str(root), "VLLM_NATIVE_FEH": "1" if feh else "0"}
    perf = ["-X", "perf"] if functions else []
    cache = ["--cache-sim=yes", "--LL=524288,8,64"] if cache_sim else []
    argv = ["valgrind", "--tool=callgrind", *cache, "--instr-atstart=no", f"--callgrind-out-file={out}", python, *perf,
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
    totals: dict[str, int] = {}
    perf_map = Path(f"/tmp/perf-{fe.pid}.map")  # valgrind runs the server in its own process: the same pid
    for part in workdir.glob(f"callgrind.{rpc}*"):  # the dump, and the (empty) part written at exit
        events: list[str] = []
        for line in part.read_text(errors="replace").splitlines():
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                for name, value in zip(events, line.split()[1:], strict=False):
                    totals[name] = totals.get(name, 0) + int(value)
        if functions and part.name != out.name and perf_map.exists():
            print_functions(part, perf_map, requests, functions)
        part.unlink()
    perf_map.unlink(missing_ok=True)
    result = {"Ir": totals.get("Ir", 0) // requests}
    if cache_sim:
        result["L1 misses"] = sum(totals.get(name, 0) for name in ("I1mr", "D1mr", "D1mw")) // requests
        result["LL misses"] = sum(totals.get(name, 0) for name in ("ILmr", "DLmr", "DLmw")) // requests
    return result


_ANNOTATED = re.compile(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\?\?\?:0x([0-9a-f]+)(?:'\d+)? \[\?\?\?\]")
"""A line of `callgrind_annotate --inclusive=yes` for code without a symbol: a perf trampoline, among others."""


def print_functions(dump: Path, perf_map: Path, requests: int, top: int) -> None:
    """The `top` Python functions by inclusive instructions per request: callgrind's unnamed code addresses looked
    up in the interpreter's perf map (lines "START SIZE py::qualname:file", hex)."""
    spans = []
    for line in perf_map.read_text().splitlines():
        start, size, name = line.split(" ", 2)
        spans.append((int(start, 16), int(start, 16) + int(size, 16), name.removeprefix("py::")))
    spans.sort()
    starts = [span[0] for span in spans]
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--show=Ir", str(dump)],
        capture_output=True,
        text=True,
    ).stdout
    inclusive: dict[str, int] = {}
    for line in annotated.splitlines():
        match = _ANNOTATED.match(line)
        if match is None:
            continue
        address = int(match.group(2), 16)
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < spans[i][1]:
            name = spans[i][2]  # a recursive function appears once per depth ('N): its outermost, largest, counts
            inclusive[name] = max(inclusive.get(name, 0), int(match.group(1).replace(",", "")))
    print(f"  instructions per request, inclusive, by Python function (top {top}):")
    for name, total in sorted(inclusive.items(), key=lambda item: -item[1])[:top]:
        print(f"  {total / requests / 1000:9.1f}k  {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", action="append", type=Path, help="a tree to measure (repeatable; default this checkout)")
    p.add_argument("--scenario", choices=("rps", "seq", "streams"), default="rps")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model-dir", type=Path, default=None, help="default ~/.cache/pyfront/tiny-qwen3")
    p.add_argument("--no-feh", action="store_true", help="front-end block hashing off (by default on)")
    p.add_argument("--cache-sim", action="store_true", help="also simulated L1 and 512 KB last-level misses")
    p.add_argument("--python", default=sys.executable, help="the server's interpreter (default this one)")
    p.add_argument(
        "--functions", type=int, default=0, metavar="N", help="print the top N Python functions (--python >= 3.12)"
    )
    a = p.parse_args(argv)
    if a.functions:
        probe = [a.python, "-c", "import sys; print(sys.version_info >= (3, 12))"]
        if subprocess.run(probe, capture_output=True, text=True).stdout.strip() != "True":
            raise SystemExit(f"--functions needs a Python >= 3.12 for -X perf (--python {a.python})")
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian's valgrind package)")
    trees = a.src or [ROOT]
    model = a.model_dir or Path(os.environ.get("PYFRONT_CACHE_DIR", Path.home() / ".cache/pyfront")) / "tiny-qwen3"
    counts: dict[Path, list[dict[str, int]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory(prefix="pyfront-instructions-") as tmp:
        for _ in range(a.rounds):
            for tree in trees:
                run = count(
                    tree, model, a.scenario, a.requests, Path(tmp), not a.no_feh, a.python, a.functions, a.cache_sim
                )
                counts[tree].append(run)
                print(f"{tree}: " + ", ".join(f"{v:,} {k}" for k, v in run.items()) + " per request", flush=True)
    print(f"\n{a.scenario}, {a.requests} requests a run, {a.rounds} rounds (median, min-max, ratio to the first tree):")
    for event in counts[trees[0]][0]:
        first = statistics.median(run[event] for run in counts[trees[0]])
        print(f"  {'instructions' if event == 'Ir' else event} per request:")
        for tree in trees:
            values = [run[event] for run in counts[tree]]
            med = statistics.median(values)
            ratio = f"{med / first:.3f}x" if first else "-"
            print(f"    {tree}: {med:,.0f} ({min(values):,}-{max(values):,}) {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
