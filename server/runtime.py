"""What runs beside the application: the bundled mock engine's process, the engine client's start-up,
and returning the heap freed while loading.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys

from pyfront.engine_client.client import EngineClient, EngineClientConfig
from pyfront.engine_client.handshake import HandshakeServer, handshake_address
from pyfront.engine_client.kv_events import parse_config_flag
from pyfront.engine_client.routing import RoutingConfig
from pyfront.server.config import ServerConfig
from pyfront.server.state import ServingState

logger = logging.getLogger("pyfront.server")


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the parent dies (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _return_free_heap() -> None:
    """Give the heap freed while loading back to the OS (glibc keeps it: ~30 MB after the Qwen tokenizer)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


class MockEngineProcess:
    """The bundled mock engine, started by `--mock-engine` so the server works with no GPU."""

    def __init__(self, config: ServerConfig) -> None:
        ranks = [str(r) for r in range(config.data_parallel_size)]
        cmd = [sys.executable, "-m", "pyfront.engine_client.mock_engine",
               "--handshake-address", f"tcp://{config.data_parallel_address}:{config.data_parallel_rpc_port}",
               "--ranks", *ranks, "--max-model-len", str(config.max_model_len or 32768),
               "--log-level", "WARNING", *config.mock_engine_args]  # fmt: skip
        # Its own session (a Ctrl-C in the terminal is for pyfront, which stops it in order), and it dies
        # with pyfront even when pyfront is SIGKILLed (PR_SET_PDEATHSIG), so it is never orphaned.
        self.proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


async def start_engine(state: ServingState, config: ServerConfig, handshake: HandshakeServer | None = None) -> None:
    """Start the engine client (with `handshake`, the handshake socket already bound, if any) into `state`."""
    if config.client_count == 1:
        host = config.data_parallel_address
        ranks = "rank 0" if config.data_parallel_size == 1 else f"ranks 0-{config.data_parallel_size - 1}"
        logger.info(
            "waiting for %d engine(s) (%s) to connect to the handshake address %s%s",
            config.data_parallel_size,
            ranks,
            handshake_address(host, config.data_parallel_rpc_port),
            " (the bundled mock engine)"
            if config.mock_engine
            else f"; start them with `vllm serve MODEL --headless --data-parallel-address {host} "
            f"--data-parallel-rpc-port {config.data_parallel_rpc_port} --data-parallel-size "
            f"{config.data_parallel_size}`, or for a demo without a GPU use the bundled mock engine "
            "(`pyfront serve --mock-engine`, or PYFRONT_MOCK_ENGINE=1 with the uvicorn factory)",
        )
    try:
        state.engine = await EngineClient.start(
            EngineClientConfig(
                data_parallel_address=config.data_parallel_address,
                data_parallel_rpc_port=config.data_parallel_rpc_port,
                data_parallel_size=config.data_parallel_size,
                client_index=config.client_index,
                client_count=config.client_count,
                run_handshake=config.client_count == 1,
                input_address=config.engine_input_address,
                output_address=config.engine_output_address,
                startup_timeout_s=config.engine_startup_timeout,
                ping_interval_s=config.engine_ping_interval,
                stall_timeout_s=config.engine_stall_timeout,
                routing=RoutingConfig(
                    policy=config.routing,
                    load_weight=config.routing_load_weight,
                    max_imbalance=config.routing_max_imbalance,
                    imbalance_slack=config.routing_imbalance_slack,
                    index_max_blocks=config.routing_index_max_blocks,
                    silence_timeout_s=config.kv_events_silence_timeout,
                ),
                kv_events_config=(
                    parse_config_flag(config.kv_events_config) if config.kv_events_config is not None else None
                ),
                kv_events_hosts=config.kv_events_hosts,
            ),
            handshake,
        )
        logger.info("%d engine(s) admitted; max_model_len %d", config.data_parallel_size, state.engine.max_model_len)
    except Exception as exc:
        state.engine_error = str(exc)
        logger.error("engine start-up failed: %s", exc)
