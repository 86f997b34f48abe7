"""The ASGI application: routes, middleware, start-up and shutdown.

`create_app(config)` is what `pyfront serve` runs; `uvicorn pyfront.server.app:create_app --factory` builds the
config from PYFRONT_* environment variables instead. Requests are parsed with msgspec (no pydantic on the
request path); FastAPI supplies routing and the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hmac
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import Any

import anyio.to_thread
import msgspec
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyfront.engine_client.client import EngineClient, EngineClientConfig, EngineError
from pyfront.server import openai_types, serving
from pyfront.server.config import ServerConfig
from pyfront.server.errors import APIError, error_response
from pyfront.server.metrics import Metrics
from pyfront.server.openai_types import RequestValidationError
from pyfront.server.parsers import get_reasoning_parser, get_tool_parser
from pyfront.server.serving import CompletionBatch, Generation, ServingState
from pyfront.server.sse import SSEResponse
from pyfront.server.tokenizer import Tokenizer

logger = logging.getLogger("pyfront.server")

PYFRONT_VERSION = version("pyfront")
_encode = msgspec.json.encode


class EncodedJSON(Response):
    """A 200 JSON response from bytes already encoded, its headers built as raw pairs in one go.

    For the completion routes' non-streamed answers: Starlette's Response builds its headers through
    MutableHeaders, a measurable share of a one-token request.
    """

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body = body
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def json_response(body: Any, status: int = 200) -> Response:
    return Response(_encode(body), status_code=status, media_type="application/json")


# ---------------------------------------------------------------------- middleware


class APIKeyMiddleware:
    """Every route needs `Authorization: Bearer <key>` except /health (and /metrics unless told otherwise).

    Keys are compared with hmac.compare_digest against every configured key, so the time taken does not
    depend on how much of a key matched.
    """

    def __init__(self, app: ASGIApp, keys: list[str], open_paths: set[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        token = given[7:] if given[:7].lower() == b"bearer " else b""
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token, key)
        if not ok:
            await error_response(401, "Unauthorized: a valid API key is required (Authorization: Bearer ...)")(
                scope, receive, send
            )
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(scope, receive, send)
                return
        received = 0
        limit = self.limit

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(413, f"request body exceeds the {self.limit}-byte limit")(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


# ---------------------------------------------------------------------- start-up


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


async def _start_engine(state: ServingState, config: ServerConfig) -> None:
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
            )
        )
        logger.info("%d engine(s) admitted; max_model_len %d", config.data_parallel_size, state.engine.max_model_len)
    except Exception as exc:
        state.engine_error = str(exc)
        logger.error("engine start-up failed: %s", exc)


def create_app(config: ServerConfig | None = None) -> FastAPI:
    """The application; with no config, settings come from PYFRONT_* environment variables."""
    config = config or ServerConfig.from_env()
    tokenizer = Tokenizer(config.tokenizer_name, chat_template=config.chat_template)
    state = ServingState(
        tokenizer=tokenizer,
        metrics=None,  # type: ignore[arg-type]  # set below: needs the engine's memo lazily
        model_names=config.model_names,
        max_model_len_override=config.max_model_len,
        allow_request_chat_template=config.trust_request_chat_template,
        api_server_index=config.client_index,
        tool_parser=get_tool_parser(config.tool_call_parser) if config.tool_call_parser else None,
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
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        mock = MockEngineProcess(config) if config.mock_engine else None
        starter = asyncio.create_task(_start_engine(state, config))
        # Everything built so far (tokenizer, template, FastAPI app) lives as long as the process: keep the
        # collector from walking it again on every full collection (as vLLM's server does).
        gc.collect()
        gc.freeze()
        _return_free_heap()
        try:
            yield
        finally:
            starter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starter
            if state.engine is not None:
                await state.engine.close()
            if mock is not None:
                mock.stop()

    app = PyfrontApp(title="pyfront", version=PYFRONT_VERSION, lifespan=lifespan)
    app.state.serving = state
    app.state.config = config
    _add_routes(app, state)
    _add_error_handlers(app, state)
    open_paths = {"/health", "/ready"} | (set() if config.metrics_require_api_key else {"/metrics"})
    # The same user middleware, in the same order (outermost last), around FastAPI and around the fast lane.
    fast_lane = FastLane(state)
    lane: ASGIApp = fast_lane
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, keys=config.api_key, open_paths=open_paths)
        lane = APIKeyMiddleware(lane, keys=config.api_key, open_paths=open_paths)
    if config.allowed_origins:
        cors = {"allow_origins": config.allowed_origins, "allow_methods": ["*"], "allow_headers": ["*"]}
        app.add_middleware(CORSMiddleware, **cors)
        lane = CORSMiddleware(lane, **cors)
    app.add_middleware(BodyLimitMiddleware, limit=config.max_request_body_bytes)
    app.fast_lane = BodyLimitMiddleware(lane, limit=config.max_request_body_bytes)
    app.fast_paths = frozenset(fast_lane.handlers)
    return app


# ---------------------------------------------------------------------- errors


def exception_response(state: ServingState, exc: Exception) -> Response:
    """The OpenAI error response for an exception raised while handling a request (counted in metrics)."""
    if isinstance(exc, StarletteHTTPException):
        message = "Not Found" if exc.status_code == 404 else str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))
    error = serving.engine_error_to_api(exc)
    if error.status >= 500 and not isinstance(exc, (APIError, serving.DeadlineExceeded, EngineError)):
        logger.exception("request failed", exc_info=exc)
    state.metrics.error(error.status)
    return error_response(error.status, error.message, error.param, error.headers)


def _add_error_handlers(app: FastAPI, state: ServingState) -> None:
    async def handle(_: Request, exc: Exception) -> Response:
        return exception_response(state, exc)

    # Handlers for specific classes run in Starlette's ExceptionMiddleware and answer cleanly; a handler
    # for Exception runs in ServerErrorMiddleware, which re-raises after answering (for real bugs only).
    for kind in (APIError, RequestValidationError, StarletteHTTPException, serving.DeadlineExceeded, EngineError,
                 ValueError, Exception):  # fmt: skip
        app.add_exception_handler(kind, handle)


# ---------------------------------------------------------------------- routes


LARGE_BODY_BYTES = 256 * 1024


async def _decode(decode: Callable[[bytes], Any], raw: bytes) -> Any:
    """Parse a request body once; a long chat history is parsed on a worker thread, not on the event loop."""
    if len(raw) < LARGE_BODY_BYTES:
        return decode(raw)
    return await anyio.to_thread.run_sync(decode, raw)


def _request_body_schema(name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


class _Headers:
    """The request headers the completion handlers read, found in one pass over the raw ASGI list."""

    __slots__ = ("request_id", "timeout")

    def __init__(self, scope: Scope) -> None:
        self.request_id: str | None = None
        self.timeout: str | None = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                self.request_id = value.decode("latin-1")
            elif name == b"x-request-timeout":
                self.timeout = value.decode("latin-1")


async def chat_response(state: ServingState, raw: bytes, headers: _Headers) -> Response:
    """POST /v1/chat/completions: parse -> render/tokenize -> engine -> a JSON or SSE response."""
    body = await _decode(
        functools.partial(
            openai_types.decode_chat_request, allow_request_chat_template=state.allow_request_chat_template
        ),
        raw,
    )
    model = state.check_model(body.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    admission = state.admit(body.n or 1)
    try:
        prompt_text, prompt_ids, hashes = await serving.render_chat(state, body, hash_prompt=True)
        plan = serving.plan_output_parsing(state, body, prompt_text)
        base = serving.base_request_id(headers.request_id, body.request_id)
        response_id = f"chatcmpl-{base}"
        generation = await serving.prepare(
            state,
            body,
            prompt_ids,
            base_id=response_id,
            streaming=bool(body.stream),
            deadline=deadline,
            plan=plan,
            prompt_block_hashes=hashes,
        )
        response_headers = {"x-request-id": base}
        if body.stream:
            streamed, admission = admission, None
            if len(generation.choices) == 1:
                frames = serving.ChatFrames(state, body, generation, response_id, model)
                pusher = serving.PushStream(state, generation, frames)
                return SSEResponse(None, response_headers, on_close=streamed.release, pusher=pusher)
            stream = serving.chat_stream(state, body, generation, response_id, model)
            return SSEResponse(stream, response_headers, on_close=streamed.release)
        result = await serving.chat_full(state, body, generation, response_id, model)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()


async def completion_response(state: ServingState, raw: bytes, headers: _Headers) -> Response:
    """POST /v1/completions: parse -> tokenize each prompt -> engine -> a JSON or SSE response."""
    body = await _decode(openai_types.decode_completion_request, raw)
    model = state.check_model(body.model)
    state.require_engine()
    deadline = state.deadline(headers.timeout)
    prompts = await serving.tokenize_completion_prompts(state, body)
    admission = state.admit((body.n or 1) * len(prompts))
    try:
        base = serving.base_request_id(headers.request_id, body.request_id)
        response_id = f"cmpl-{base}"
        generations: list[Generation] = []
        try:
            for i, (_, prompt_ids) in enumerate(prompts):
                sub_id = response_id if len(prompts) == 1 else f"{response_id}-{i}"
                generations.append(
                    await serving.prepare(
                        state, body, prompt_ids, base_id=sub_id, streaming=bool(body.stream), deadline=deadline
                    )
                )
        except BaseException:
            for generation in generations:
                await generation.abort()
            raise
        echo_texts = [text or "" for text, _ in prompts] if body.echo else None
        echo_only = bool(body.echo and body.max_tokens == 0)
        batch = CompletionBatch(generations, echo_texts, body.n or 1, echo_only=echo_only)
        response_headers = {"x-request-id": base}
        if body.stream:
            streamed, admission = admission, None
            if len(generations) == 1 and len(generations[0].choices) == 1:
                frames = serving.CompletionFrames(state, body, batch, response_id, model)
                pusher = serving.PushStream(state, generations[0], frames)
                return SSEResponse(None, response_headers, on_close=streamed.release, pusher=pusher)
            stream = serving.completion_stream(state, body, batch, response_id, model)
            return SSEResponse(stream, response_headers, on_close=streamed.release)
        result = await serving.completion_full(state, body, batch, response_id, model)
        return EncodedJSON(_encode(result), response_headers)
    finally:
        if admission is not None:
            admission.release()


class FastLane:
    """POST /v1/chat/completions and /v1/completions straight from the server, around FastAPI's stack.

    These two routes carry every token; through FastAPI each `send` of a streamed frame passed several
    middleware wrappers (error, exception, body-limit and telemetry layers) and each request a dozen
    more calls. Here a request costs one dispatch and frames go to the server's own `send`. Behaviour is
    the same as through FastAPI: the same handlers (chat_response / completion_response), the same
    user middleware (API key, CORS, body limit, wrapped around this lane in create_app), and errors
    mapped to the same OpenAI error bodies (`exception_response`).
    """

    def __init__(self, state: ServingState) -> None:
        self.state = state
        self.handlers = {"/v1/chat/completions": chat_response, "/v1/completions": completion_response}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        try:
            raw = await _read_body(receive)
            if raw is None:
                return  # the client left before sending its body
            response = await self.handlers[scope["path"]](state, raw, _Headers(scope))
        except Exception as exc:
            response = exception_response(state, exc)
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class PyfrontApp(FastAPI):
    """FastAPI, except that the two completion routes take the FastLane (see there)."""

    fast_lane: ASGIApp | None = None
    fast_paths: frozenset[str] = frozenset()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.fast_lane is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in self.fast_paths
        ):
            await self.fast_lane(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _add_routes(app: FastAPI, state: ServingState) -> None:
    @app.post("/v1/chat/completions", openapi_extra=_request_body_schema("ChatCompletionRequest"))
    async def chat_completions(request: Request) -> Response:
        return await chat_response(state, await request.body(), _Headers(request.scope))

    @app.post("/v1/completions", openapi_extra=_request_body_schema("CompletionRequest"))
    async def completions(request: Request) -> Response:
        return await completion_response(state, await request.body(), _Headers(request.scope))

    @app.get("/v1/models")
    async def models() -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "pyfront",
                "root": state.tokenizer.name,
                "parent": None,
                "max_model_len": state.max_model_len or None,
                "permission": [],
            }
            for name in state.model_names
        ]
        return json_response({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> Response:
        engine = state.engine
        if engine is None:
            detail = {"healthy": False, "status": state.engine_error or "starting"}
            return json_response(detail, 503)
        report = engine.health()
        report["pid"] = os.getpid()
        report["api_server_index"] = state.api_server_index
        return json_response(report, 200 if report["healthy"] else 503)

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 503 until every engine has been admitted (and while none is healthy)."""
        engine = state.engine
        if engine is None or not engine.healthy:
            return json_response({"ready": False, "status": state.engine_error or "starting"}, 503)
        return json_response({"ready": True})

    @app.get("/metrics")
    async def metrics() -> Response:
        engine = state.engine
        if engine is not None:
            state.metrics.running.set(engine.num_in_flight)
            state.metrics.waiting.set(sum(e.num_waiting for e in engine.engines))
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/version")
    async def version_route() -> Response:
        return json_response({"version": PYFRONT_VERSION})

    @app.get("/load")
    async def load() -> Response:
        engine = state.engine
        return json_response({"server_load": engine.num_in_flight if engine is not None else 0})

    @app.post("/tokenize", openapi_extra=_request_body_schema("TokenizeRequest"))
    async def tokenize(request: Request) -> Response:
        body = openai_types.decode_tokenize_request(await request.body())
        state.check_model(body.model)
        if body.messages is not None:
            chat = openai_types.ChatCompletionRequest(
                messages=body.messages,
                model=body.model,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template_kwargs=body.chat_template_kwargs,
                tools=body.tools,
            )
            _, ids, _ = await serving.render_chat(state, chat)
        elif body.prompt is not None:
            prompt = body.prompt
            ids = await anyio.to_thread.run_sync(
                lambda: state.tokenizer.encode(prompt, add_special_tokens=body.add_special_tokens)
            )
        else:
            raise APIError(400, "either prompt or messages is required")
        result: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
        if body.return_token_strs:
            result["token_strs"] = state.tokenizer.hf.convert_ids_to_tokens(ids)
        return json_response(result)

    @app.post("/detokenize", openapi_extra=_request_body_schema("DetokenizeRequest"))
    async def detokenize(request: Request) -> Response:
        body = openai_types.decode_detokenize_request(await request.body())
        state.check_model(body.model)
        vocab = state.tokenizer.vocab_size
        if not all(0 <= t < vocab for t in body.tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        text = await anyio.to_thread.run_sync(lambda: state.tokenizer.decode(body.tokens))
        return json_response({"prompt": text})

    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original_openapi()
            components = openai_types.openapi_components()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
