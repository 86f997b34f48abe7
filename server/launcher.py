"""Running the server: one process, or `--api-server-count N` processes sharing one port.

With N > 1 the parent process owns the engine handshake: it picks one input/output address pair per API
server, answers every engine's HELLO with all N pairs (engine-protocol.md 1.6), and supervises. Each API
server is a separate engine client (its own `client_index`, sockets, hash memo and event loop) that binds
its pair, collects every engine's registration, and serves HTTP on a SO_REUSEPORT socket, so the kernel
spreads connections across the processes. Metrics add up across processes through prometheus_client's
multiprocess mode. A dead API server does not take the others down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator

import zmq
import zmq.asyncio

from pyfront.engine_client.handshake import ClientAddresses, HandshakeError, run_handshake
from pyfront.server.config import ServerConfig

logger = logging.getLogger("pyfront.launcher")


def _graceful_server_class():  # uvicorn is imported lazily: `pyfront --help` stays fast
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, except that SIGTERM/SIGINT end in exit code 0 after the drain.

        uvicorn re-raises the signal once it has shut down, so the process would die "killed by
        SIGTERM"; a drained, clean shutdown is a success for process supervisors.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")


def print_banner(config: ServerConfig) -> None:
    name = config.model_names[0]
    print(
        f"pyfront: serving {name!r} on http://{config.host}:{config.port}; try:\n"
        f"  curl http://{config.host}:{config.port}/v1/chat/completions -H 'Content-Type: application/json' "
        + ("-H 'Authorization: Bearer $KEY' " if config.api_key else "")
        + f'-d \'{{"model": "{name}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
        flush=True,
    )


def run_server(config: ServerConfig, sock: socket.socket | None = None) -> None:
    """One API server process: build the app and serve until SIGTERM/SIGINT."""
    import uvicorn

    from pyfront.server.app import create_app

    server = _graceful_server_class()(
        uvicorn.Config(
            create_app(config),
            host=config.host,
            port=config.port,
            log_level=config.uvicorn_log_level,
            access_log=not config.disable_uvicorn_access_log,
            loop="uvloop",
            http="httptools",
            timeout_graceful_shutdown=max(1, round(config.shutdown_timeout)),
        )
    )
    server.run(sockets=[sock] if sock is not None else None)


def serve(config: ServerConfig) -> None:
    _configure_logging()
    print_banner(config)
    if config.api_server_count <= 1:
        run_server(config)
    else:
        serve_many(config)


# ---------------------------------------------------------------------- several API servers


def _reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _client_addresses(config: ServerConfig, run_dir: str) -> list[ClientAddresses]:
    """One input/output pair per API server: ipc when the engines are local, else TCP ports on the address."""
    from pyfront.engine_client.client import _is_loopback

    pairs = []
    for i in range(config.api_server_count):
        if _is_loopback(config.data_parallel_address):
            pairs.append(ClientAddresses(f"ipc://{run_dir}/in-{i}", f"ipc://{run_dir}/out-{i}"))
        else:
            host = config.data_parallel_address
            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind((host, 0))
                    ports.append(s.getsockname()[1])
            bracketed = f"[{host}]" if ":" in host else host
            pairs.append(ClientAddresses(f"tcp://{bracketed}:{ports[0]}", f"tcp://{bracketed}:{ports[1]}"))
    return pairs


def _child_main(config: ServerConfig) -> None:
    _configure_logging()
    run_server(config, _reuseport_socket(config.host, config.port))


def serve_many(config: ServerConfig) -> None:
    count = config.api_server_count
    if config.port == 0:
        raise SystemExit("pyfront: --api-server-count > 1 needs an explicit --port")
    run_dir = tempfile.mkdtemp(prefix="pyfront-")
    metrics_dir = os.path.join(run_dir, "metrics")
    os.makedirs(metrics_dir)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # inherited by the API servers
    addresses = _client_addresses(config, run_dir)
    mock = None
    if config.mock_engine:
        from pyfront.server.app import MockEngineProcess

        mock = MockEngineProcess(config)
    ctx = multiprocessing.get_context("spawn")
    children: list[multiprocessing.process.BaseProcess] = []
    for index, pair in enumerate(addresses):
        child_config = dataclasses.replace(
            config,
            mock_engine=False,
            api_server_count=1,
            client_index=index,
            client_count=count,
            engine_input_address=pair.input_address,
            engine_output_address=pair.output_address,
        )
        child = ctx.Process(target=_child_main, args=(child_config,), name=f"pyfront-api-{index}", daemon=False)
        children.append(child)
        child.start()

    stop = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        try:
            asyncio.run(_handshake(config, addresses))
        except HandshakeError as exc:
            logger.error("engine handshake failed: %s", exc)
        _supervise(children, lambda: stop)
    finally:
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + config.shutdown_timeout + 10
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join(5)
        if mock is not None:
            mock.stop()
    sys.exit(0)


async def _handshake(config: ServerConfig, addresses: list[ClientAddresses]) -> None:
    ctx = zmq.asyncio.Context()
    try:
        host = config.data_parallel_address
        bracketed = f"[{host}]" if ":" in host else host
        await run_handshake(
            ctx,
            f"tcp://{bracketed}:{config.data_parallel_rpc_port}",
            config.data_parallel_size,
            addresses,
            config.engine_startup_timeout,
        )
        logger.info("all %d engine(s) admitted for %d API servers", config.data_parallel_size, len(addresses))
    finally:
        ctx.term()


def _supervise(children: list[multiprocessing.process.BaseProcess], stopping) -> None:
    """Wait for a stop signal; report API servers that die, and keep the others serving."""
    from prometheus_client import multiprocess

    reported: set[int] = set()
    while not stopping():
        for child in children:
            if not child.is_alive() and child.pid not in reported:
                reported.add(child.pid)  # type: ignore[arg-type]
                logger.error("API server %s (pid %s) exited with %s", child.name, child.pid, child.exitcode)
                multiprocess.mark_process_dead(child.pid)
        if all(not c.is_alive() for c in children):
            logger.error("every API server has exited")
            return
        time.sleep(0.2)
