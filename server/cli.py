"""The `pyfront` command line: `pyfront serve MODEL [flags]`, flags named as `vllm serve`'s.

Unknown flags fail at once with a clear message (argparse), and so do `vllm serve` flags that mean
something pyfront does not do (they are listed, so the error says why rather than "unrecognized").
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from importlib.metadata import version

from pyfront.server.bundled_tokenizer import BUNDLED_TOKENIZER_NAME
from pyfront.server.config import ServerConfig

# `vllm serve` flags that configure the engine, not the front end: pyfront refuses them by name.
ENGINE_SIDE_FLAGS = (
    "--tensor-parallel-size", "--pipeline-parallel-size", "--gpu-memory-utilization", "--dtype", "--quantization",
    "--enforce-eager", "--enable-prefix-caching", "--kv-cache-dtype", "--max-num-seqs", "--max-num-batched-tokens",
    "--block-size", "--swap-space", "--cpu-offload-gb", "--headless", "--data-parallel-size-local",
    "--enable-lora", "--speculative-config", "--load-format",
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyfront", description="OpenAI-compatible front end for vLLM engines")
    parser.add_argument("--version", action="version", version=f"pyfront {version('pyfront')}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Serve MODEL (a local model or tokenizer directory, or the bundled "
        f"{BUNDLED_TOKENIZER_NAME!r}) against external vLLM engines, or against the bundled mock engine.",
    )
    serve.add_argument("model", nargs="?", default=BUNDLED_TOKENIZER_NAME, help="model or tokenizer directory")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", action="append", default=[], help="required bearer key (repeatable)")
    serve.add_argument("--served-model-name", nargs="+", default=[], help="model names the API answers to")
    serve.add_argument("--tokenizer", default=None, help="tokenizer directory, if not MODEL")
    serve.add_argument("--chat-template", default=None, help="chat template file or inline Jinja")
    serve.add_argument("--trust-request-chat-template", action="store_true",
                       help="allow requests to pass their own chat_template")  # fmt: skip
    serve.add_argument("--max-model-len", type=int, default=None, help="cap below the engines' max_model_len")
    serve.add_argument("--data-parallel-address", default="127.0.0.1", help="address the engines connect to")
    serve.add_argument(
        "--data-parallel-rpc-port",
        type=int,
        default=None,
        help="handshake port the engines connect to (default 62100; a free port with --mock-engine)",
    )
    serve.add_argument("--data-parallel-size", type=int, default=1, help="number of engines (DP ranks)")
    serve.add_argument("--uvicorn-log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])  # fmt: skip
    serve.add_argument("--allowed-origins", nargs="+", default=[], help="CORS origins (CORS is off without this)")
    serve.add_argument("--max-request-body-bytes", type=int, default=32 * 1024 * 1024)
    serve.add_argument("--engine-startup-timeout", type=float, default=600.0)
    serve.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=30.0,
        help="an engine silent this long (and not answering pings) is taken out of service",
    )
    serve.add_argument(
        "--disable-uvicorn-access-log", action="store_true", help="no access-log line per request (saves CPU)"
    )
    serve.add_argument("--tool-call-parser", default=None, help="tool call parser (known: hermes)")
    serve.add_argument("--enable-auto-tool-choice", action="store_true", help="parse tool calls for tool_choice auto")
    serve.add_argument("--reasoning-parser", default=None, help="reasoning parser (known: qwen3)")
    serve.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="API server processes sharing the port, each its own engine client (needs an explicit --port)",
    )
    serve.add_argument(
        "--max-num-seqs-in-flight",
        type=int,
        default=4096,
        help="engine requests admitted at once; beyond it 503 + Retry-After (0: no limit)",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=0.0,
        help="seconds before a request is aborted with 504 (0: none; X-Request-Timeout asks less)",
    )
    serve.add_argument(
        "--sse-keep-alive-interval",
        type=float,
        default=15.0,
        help="seconds of stream silence before an SSE keep-alive comment (0: off)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds for in-flight requests to finish before they are aborted",
    )
    serve.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (the engine's prefix-cache hits), as vLLM does",
    )
    serve.add_argument("--metrics-require-api-key", action="store_true", help="guard /metrics with --api-key too")
    serve.add_argument("--mock-engine", action="store_true", help="start the bundled mock engine (no GPU needed)")
    serve.add_argument(
        "--mock-engine-args",
        default="",
        help="extra flags for the mock engine, e.g. '--step-interval 0.01 --advertise-feh'",
    )
    for flag in ENGINE_SIDE_FLAGS:
        serve.add_argument(flag, dest=f"_engine_{flag}", nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from pyfront.server.parsers import get_reasoning_parser, get_tool_parser

    try:
        if args.tool_call_parser:
            get_tool_parser(args.tool_call_parser)
        if args.reasoning_parser:
            get_reasoning_parser(args.reasoning_parser)
    except ValueError as exc:
        raise SystemExit(f"pyfront: {exc}") from None
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("pyfront: --enable-auto-tool-choice needs --tool-call-parser")
    engine_flags = [f for f in ENGINE_SIDE_FLAGS if getattr(args, f"_engine_{f}") is not None]
    if engine_flags:
        raise SystemExit(
            f"pyfront: {', '.join(engine_flags)} configure(s) the engine, not the front end: pass them to "
            "`vllm serve --headless` on the engine side"
        )
    rpc_port = args.data_parallel_rpc_port
    if rpc_port is None:
        rpc_port = _free_port() if args.mock_engine else 62100
    mock_args = args.mock_engine_args.split()
    if args.mock_engine and "--output-len" not in mock_args:
        mock_args += ["--output-len", "48"]  # a demo answer ends after a sentence or two
    if args.mock_engine and "--advertise-feh" not in mock_args and "--no-feh" not in mock_args:
        mock_args.append("--advertise-feh")
    mock_args = [a for a in mock_args if a != "--no-feh"]
    return ServerConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        trust_request_chat_template=args.trust_request_chat_template,
        max_model_len=args.max_model_len,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        metrics_require_api_key=args.metrics_require_api_key,
        allowed_origins=args.allowed_origins,
        max_request_body_bytes=args.max_request_body_bytes,
        uvicorn_log_level=args.uvicorn_log_level,
        data_parallel_address=args.data_parallel_address,
        data_parallel_rpc_port=rpc_port,
        data_parallel_size=args.data_parallel_size,
        engine_startup_timeout=args.engine_startup_timeout,
        engine_stall_timeout=args.engine_stall_timeout,
        max_num_seqs_in_flight=args.max_num_seqs_in_flight,
        request_timeout=args.request_timeout,
        sse_keep_alive_interval=args.sse_keep_alive_interval,
        shutdown_timeout=args.shutdown_timeout,
        api_server_count=args.api_server_count,
        disable_uvicorn_access_log=args.disable_uvicorn_access_log,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        reasoning_parser=args.reasoning_parser,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        mock_engine=args.mock_engine,
        mock_engine_args=mock_args,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from pyfront.server.launcher import serve

        serve(config_from_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
