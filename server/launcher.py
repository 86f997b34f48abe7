"""Running the server: one process, or `--api-server-count N` processes sharing one port.

With N > 1 the parent process owns the engine handshake: it picks one input/output address pair per API
server, answers every engine's HELLO with all N pairs (docs/engine-protocol.md#several-front-end-processes),
and supervises. It keeps the handshake socket open for its whole life, so an engine that dies and is started
again gets INIT too and registers again with every API server (docs/engine-protocol.md#engines-that-come-back).
Each API
server is a separate engine client (its own `client_index`, sockets, hash memo and event loop) that binds
its pair, collects every engine's registration, and serves HTTP on a SO_REUSEPORT socket, so the kernel
spreads connections across the processes. Metrics add up across processes through prometheus_client's
multiprocess mode. A dead API server does not take the others down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import multiprocessing
import os
import shlex
import signal
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from pyfront.engine_client.handshake import ClientAddresses, HandshakeError, HandshakeServer, handshake_address
from pyfront.server.config import ServerConfig
from pyfront.server.errors import FORCED_EXIT

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

logger = logging.getLogger("pyfront.launcher")


def _graceful_server_class() -> Callable[[uvicorn.Config, ServerConfig], uvicorn.Server]:
    # uvicorn is imported lazily: `pyfront --help` stays fast
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, plus what an operator at a terminal expects of start-up and shutdown.

        - The banner (a curl line that works) is printed once the server really listens, never before a
          failure.
        - The first SIGINT/SIGTERM says that it drains, how many requests and for how long; a second
          Ctrl-C forces the exit: the requests still running are cut (their streams end with an error
          event) and the engines are still told to abort them and the mock engine is still stopped.
        - SIGTERM/SIGINT end in exit code 0 after the drain. uvicorn re-raises the signal once it has shut
          down, so the process would die "killed by SIGTERM"; a drained, clean shutdown is a success for
          process supervisors.
        """

        def __init__(self, config: uvicorn.Config, server_config: ServerConfig) -> None:
            super().__init__(config)
            self.server_config = server_config

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                if not self.force_exit:
                    _say(FORCED_EXIT)
            elif not self.should_exit:
                running = len(self.server_state.tasks)
                timeout = self.config.timeout_graceful_shutdown
                again = "; Ctrl-C again to force exit" if sig == signal.SIGINT else ""
                _say(f"pyfront: shutting down: draining {running} in-flight request(s) for up to {timeout} s{again}")
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit and self.server_config.client_index == 0:
                bound = self.servers[0].sockets[0].getsockname() if self.servers else None
                port = bound[1] if isinstance(bound, tuple) else self.server_config.port
                print(banner(self.server_config, port), flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets)
            if self.force_exit:  # uvicorn skips both steps below when forced: cut the requests, still clean up
                tasks = list(self.server_state.tasks)
                for task in tasks:
                    task.cancel(msg=FORCED_EXIT)
                if tasks:
                    await asyncio.wait(tasks, timeout=2)
                if not getattr(self.lifespan, "shutdown_event", asyncio.Event()).is_set():
                    await self.lifespan.shutdown()

    return GracefulServer


def _say(line: str) -> None:
    """One line for the operator on stderr (from a signal handler: no logging locks)."""
    print(line, file=sys.stderr, flush=True)


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")


def banner(config: ServerConfig, port: int) -> str:
    """Where the server listens and a curl line that works when pasted into a POSIX shell.

    The key is referenced as "$KEY" in double quotes, so the shell expands it (single quotes would
    send the literal text $KEY); the JSON body is quoted with shlex, whatever the model name holds.
    """
    name = config.model_names[0]
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello!"}]})
    if config.uds:
        where, target = f"unix socket {config.uds}", f"--unix-socket {shlex.quote(config.uds)} http://localhost"
    else:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(config.host, config.host)
        scheme = "https" if config.ssl_certfile else "http"
        base = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
        where, target = base, base
    auth = ' -H "Authorization: Bearer $KEY"' if config.api_key else ""
    return (
        f"pyfront: serving {name!r} on {where}; try{' (with KEY set to your API key)' if auth else ''}:\n"
        f"  curl {target}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d {shlex.quote(body)}"
    )


def run_server(config: ServerConfig, sock: socket.socket | None = None) -> None:
    """One API server process: build the app and serve until SIGTERM/SIGINT.

    Everything that can fail on a user's input (the handshake port, the tokenizer, the TLS files) fails here,
    before the server listens, as one line.

    A single API server binds its engine handshake first, before it imports the app and loads the tokenizer
    (most of its start-up): an engine already waiting connects meanwhile, and its HELLO is read the moment the
    engine client starts, instead of on the engine's next connect retry (ZMQ retries every 100-200 ms).

    The collector is off until the app's lifespan has frozen what start-up built (`create_app`): the imports
    alone would otherwise trigger ~150 collections, three of them full (~70 ms of a ~1 s start), each walking
    every module object made so far, nearly all of which lives as long as the process.
    """
    gc.disable()
    handshake = None
    if config.client_count == 1:
        try:
            handshake = HandshakeServer(
                handshake_address(config.data_parallel_address, config.data_parallel_rpc_port),
                config.data_parallel_size,
            )
        except HandshakeError as exc:
            raise SystemExit(f"pyfront: {exc}") from None
    from pyfront.server.app import create_app

    try:
        app = create_app(config, handshake)
    except (OSError, RuntimeError, ValueError) as exc:
        raise SystemExit(f"pyfront: {exc}") from None
    uvicorn_config = build_uvicorn_config(app, config)
    try:
        uvicorn_config.load()
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"pyfront: cannot load the TLS key/certificate: {exc}") from None
    server = _graceful_server_class()(uvicorn_config, config)
    server.run(sockets=[sock] if sock is not None else None)


def build_uvicorn_config(app: ASGIApp, config: ServerConfig) -> uvicorn.Config:
    """uvicorn's settings for `app`: uvloop, and httptools with pyfront's bounds on reading a request
    (server/http_limits.py: header size and count, the time a request may take to arrive).

    Its own function so that tests serve the app exactly as `pyfront serve` does.
    """
    import uvicorn

    from pyfront.server.http_limits import ReadLimits, protocol_class

    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        uds=config.uds,
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        ssl_ca_certs=config.ssl_ca_certs,
        ssl_cert_reqs=config.ssl_cert_reqs,
        log_level=config.uvicorn_log_level,
        access_log=not config.disable_uvicorn_access_log,
        loop="uvloop",
        http=protocol_class(ReadLimits.from_config(config), app),
        ws="none",  # no WebSocket routes: an Upgrade request is plain HTTP, not a handshake refused without a body
        timeout_graceful_shutdown=max(1, round(config.shutdown_timeout)),
    )


def serve(config: ServerConfig) -> None:
    _configure_logging()
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
        from pyfront.server.runtime import MockEngineProcess

        mock = MockEngineProcess(config)
    ctx = multiprocessing.get_context("spawn")
    children: list[multiprocessing.process.BaseProcess] = []
    child: multiprocessing.process.BaseProcess
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
        asyncio.run(_parent(config, addresses, children, lambda: stop))
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


async def _parent(
    config: ServerConfig,
    addresses: list[ClientAddresses],
    children: list[multiprocessing.process.BaseProcess],
    stopping: Callable[[], bool],
) -> None:
    """The parent's life: supervise the API servers, and run the engine handshake beside them until the end."""
    handshake = asyncio.get_running_loop().create_task(_handshake(config, addresses))
    try:
        await _supervise(children, stopping)
    finally:
        handshake.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handshake


async def _handshake(config: ServerConfig, addresses: list[ClientAddresses]) -> None:
    """Admit the engines for every API server, then answer restarted engines until cancelled.

    A failed start-up is logged, not raised: the API servers report the ranks they miss themselves, and the
    supervisor keeps running until it is told to stop.
    """
    server: HandshakeServer | None = None
    try:
        server = HandshakeServer(
            handshake_address(config.data_parallel_address, config.data_parallel_rpc_port), config.data_parallel_size
        )
        await server.startup(addresses, config.engine_startup_timeout)
        logger.info("all %d engine(s) admitted for %d API servers", config.data_parallel_size, len(addresses))
        await server.serve_restarts()
    except HandshakeError as exc:
        logger.error("engine handshake failed: %s", exc)
    finally:
        if server is not None:
            server.close()


async def _supervise(children: list[multiprocessing.process.BaseProcess], stopping: Callable[[], bool]) -> None:
    """Wait for a stop signal; report API servers that die, and keep the others serving."""
    from prometheus_client import multiprocess

    reported: set[int] = set()
    while not stopping():
        for child in children:
            if not child.is_alive() and child.pid is not None and child.pid not in reported:
                reported.add(child.pid)
                logger.error("API server %s (pid %s) exited with %s", child.name, child.pid, child.exitcode)
                multiprocess.mark_process_dead(child.pid)
        if all(not c.is_alive() for c in children):
            logger.error("every API server has exited")
            return
        await asyncio.sleep(0.2)
