"""The ASGI application: `create_app` builds the serving state, the routes and the middleware stack once.

`create_app(config)` is what `pyfront serve` runs; `uvicorn pyfront.server.app:create_app --factory` builds the
config from PYFRONT_* environment variables instead. Requests are parsed with msgspec (no pydantic on the
request path); FastAPI supplies routing and the OpenAPI document. The request path itself starts in
`api.lane` (the two completion routes) and `api.routes` (the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from pyfront.engine_client.handshake import HandshakeServer
from pyfront.server.api.lane import FastLane, PyfrontApp
from pyfront.server.api.middleware import user_middleware
from pyfront.server.api.openapi import add_offline_docs
from pyfront.server.api.responses import add_error_handlers
from pyfront.server.api.responses_api.routes import add_responses_routes
from pyfront.server.api.responses_api.store import ResponseStore, store_enabled_by_env
from pyfront.server.api.routes import PYFRONT_VERSION, add_routes
from pyfront.server.chat.parsers import (
    AUTO_TOOL_PARSER,
    ToolCallParser,
    detect_tool_parser,
    get_reasoning_parser,
    get_tool_parser,
)
from pyfront.server.config import ServerConfig, tokenizer_problem
from pyfront.server.metrics import Metrics
from pyfront.server.runtime import MockEngineProcess, _return_free_heap, start_engine
from pyfront.server.state import ServingState
from pyfront.server.text.lean import SnapshotStore
from pyfront.server.text.tokenizer import Tokenizer

logger = logging.getLogger("pyfront.server")


class _NoTorchNotice(logging.Filter):
    """Drops transformers' "PyTorch was not found..." notice: a front end only needs the tokenizers.

    Only that one record; every other transformers warning still shows. Installed at import, before
    transformers is imported (by the tokenizer), on both start-up paths: `pyfront serve` and the factory.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found.")


logging.getLogger("transformers").addFilter(_NoTorchNotice())
logging.getLogger("transformers").addFilter(_NoTorchNotice())


GC_YOUNG_THRESHOLD = 50_000
"""Tracked objects, net of those freed, between collections of the youngest generation (CPython's default: 700).

A young collection walks every young object still alive and frees only cycles; a request's objects die by
reference count when it ends (tests/server/test_reference_cycles.py), so the collector has almost nothing to find
and its cost is the walk. A busy server holds the state of every request in flight, so the lower the threshold,
the more often it walks the same live objects:
- at 64 concurrent short requests (the peers.py rps row) the collector took 0.45 s per ~14k requests at 700
  (1044 young, 94 middle, 8 full collections) and 0.25 s at 5000 (111 and 10), with the same longest pause
  (8-10 ms); on stop 36's tree, 5000 left 2 young collections (2.6 ms) per 6000 such requests, 50,000 none;
- a burst of 256 streams is ~25k new objects, all alive until the streams end: at 5000 the collector ran 5-6 times
  while the burst was admitted, 7-26 ms of its first 150 ms, collecting nothing; at 50,000 it does not run, and
  TTFT p50 over 6 bursts went from 64-82 ms (median 65) to 43-97 ms (median 47.5).
Cyclic garbage (an exception's traceback, say) waits longer to be freed: at most this many objects' worth.
"""


def resolve_tool_parser(name: str | None, tokenizer: Tokenizer) -> type[ToolCallParser] | None:
    """The ``--tool-call-parser`` class; ``auto`` picks it from the loaded chat template and logs the pick.

    A template in no known format stops the start-up with a one-line reason (guessing would parse
    every call wrong); an explicit name was already checked with the other flags.
    """
    if not name:
        return None
    if name != AUTO_TOOL_PARSER:
        return get_tool_parser(name)
    try:
        parser = detect_tool_parser(tokenizer.chat_template_source())
    except ValueError as exc:
        raise SystemExit(f"pyfront: {exc}") from None
    logger.info("--tool-call-parser auto: the chat template writes %s tool calls; using %r", parser.name, parser.name)
    return parser


def create_app(config: ServerConfig | None = None, handshake: HandshakeServer | None = None) -> FastAPI:
    """The application; with no config (`uvicorn pyfront.server.app:create_app --factory`), settings come
    from PYFRONT_* environment variables, and a bad PYFRONT_MODEL / PYFRONT_TOKENIZER exits with one line.

    `handshake`: the engine handshake socket, already bound (`launcher.run_server`); the app owns it from here.
    Without one, the engine client binds it when the app starts.
    """
    if config is None:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
        config = ServerConfig.from_env()
        if problem := tokenizer_problem(config.tokenizer_name):
            raise SystemExit(f"pyfront: {problem} (PYFRONT_MODEL / PYFRONT_TOKENIZER)")
    tokenizer = Tokenizer(
        config.tokenizer_name,
        chat_template=config.chat_template,
        model_dir=config.model if config.tokenizer else None,
        generation_config=config.generation_config,
        snapshots=None
        if config.no_tokenizer_snapshot
        else SnapshotStore(config.tokenizer_snapshot_dir or SnapshotStore.default_directory()),
    )
    state = ServingState(
        tokenizer=tokenizer,
        metrics=None,  # type: ignore[arg-type]  # set below: needs the engine's memo lazily
        model_names=config.model_names,
        max_model_len_override=config.max_model_len,
        allow_request_chat_template=config.trust_request_chat_template,
        api_server_index=config.client_index,
        tool_parser=resolve_tool_parser(config.tool_call_parser, tokenizer),
        reasoning_parser=get_reasoning_parser(config.reasoning_parser) if config.reasoning_parser else None,
        enable_auto_tool_choice=config.enable_auto_tool_choice,
        max_in_flight=config.max_num_seqs_in_flight or None,
        request_timeout_s=config.request_timeout or None,
        sse_keepalive_s=config.sse_keep_alive_interval or None,
        enable_prompt_tokens_details=config.enable_prompt_tokens_details,
    )
    state.metrics = Metrics(
        config.model_names[0],
        lambda: state.engine.hasher.memo.stats if state.engine and state.engine.hasher else None,
        lambda: tokenizer.segments.stats,
        lambda: state.engine.routing_report() if state.engine else None,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        mock = MockEngineProcess(config) if config.mock_engine else None
        starter = asyncio.create_task(start_engine(state, config, handshake))
        # Everything built so far (tokenizer, template, FastAPI app) lives as long as the process: keep the
        # collector from ever walking it again (vLLM's server does the same after a gc.collect()). `pyfront serve`
        # ran the imports and the construction with the collector off (launcher.run_server), and it runs from
        # here on. No collection first: over the ~100k objects start-up leaves it takes ~65 ms (5 % of the start)
        # to find ~1,100 unreachable ones, 0.23 MB (module-level temporaries), which stay frozen instead; idle RSS
        # is the same either way (measured: 97.3 MB).
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        gc.enable()
        _return_free_heap()
        try:
            yield
        finally:
            await responses_store.background.cancel_all()  # background responses still running: abort them
            starter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starter
            if state.engine is not None:
                await state.engine.close()
            if handshake is not None:  # the engine client closes it; this covers a start-up that never got to it
                handshake.close()
            if mock is not None:
                mock.stop()

    # FastAPI's own /docs and /redoc load their assets from a CDN: api.openapi serves them locally instead.
    responses_store = ResponseStore(
        enabled=config.enable_responses_store or store_enabled_by_env(),
        max_responses=config.responses_store_max_responses,
        max_bytes=config.responses_store_max_bytes,
    )
    app = PyfrontApp(
        FastLane(state, config, responses_store),
        middleware=user_middleware(config),
        title="pyfront",
        version=PYFRONT_VERSION,
        lifespan=lifespan,
        root_path=config.root_path,
        docs_url=None,
        redoc_url=None,
        openapi_url=None if config.disable_fastapi_docs else "/openapi.json",
    )
    if not config.disable_fastapi_docs:
        add_offline_docs(app)
    app.state.serving = state
    app.state.config = config
    app.state.responses_store = responses_store
    add_routes(app, state, config)
    add_responses_routes(app, state, config, responses_store)
    add_error_handlers(app, state)
    return app
