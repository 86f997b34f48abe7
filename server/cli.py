"""The `pyfront` command line: `pyfront serve MODEL [flags]`, flags named as `vllm serve`'s.

Unknown flags fail at once with a clear message (argparse), and so do `vllm serve` flags that mean
something pyfront does not do (they are listed, so the error says why rather than "unrecognized").
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import socket
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pyfront.engine_client.kv_events import parse_config_flag
from pyfront.engine_client.routing import ROUTING_POLICIES
from pyfront.server.config import ServerConfig, resolve_api_keys, tokenizer_problem
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, QWEN3, bundled_spec

# `vllm serve` flags that configure the engine, not the front end (vLLM's EngineArgs), with vLLM's short
# aliases: pyfront refuses them by name, so the error says where they belong rather than "unrecognized".
ENGINE_SIDE_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp"), ("--data-parallel-rank", "-dpn"),
    ("--data-parallel-start-rank", "-dpr"), ("--data-parallel-backend", "-dpb"), ("--enable-expert-parallel", "-ep"),
    ("--distributed-executor-backend",), ("--gpu-memory-utilization",), ("--kv-cache-memory-bytes",),
    ("--dtype",), ("--quantization", "-q"), ("--kv-cache-dtype",), ("--block-size",), ("--swap-space",),
    ("--cpu-offload-gb",), ("--num-gpu-blocks-override",), ("--enforce-eager",), ("--compilation-config", "-cc"),
    ("--attention-backend",), ("--enable-prefix-caching",), ("--enable-chunked-prefill",), ("--async-scheduling",),
    ("--max-num-seqs",), ("--max-num-batched-tokens",), ("--seed",), ("--trust-remote-code",), ("--revision",),
    ("--load-format",), ("--download-dir",), ("--hf-overrides",), ("--enable-lora",), ("--max-loras",),
    ("--max-lora-rank",), ("--lora-modules",), ("--speculative-config", "-sc"), ("--kv-transfer-config",),
    ("--limit-mm-per-prompt",), ("--headless",),
)  # fmt: skip


def _bounded(
    kind: type[int] | type[float], low: float, high: float | None = None, *, above: bool = False
) -> Callable[[str], int | float]:
    """An argparse `type` that parses `kind` and refuses values outside [low, high] (or <= low with `above`).

    Every numeric flag goes through one of these, so `--port 99999` or `--shutdown-timeout -1` is an
    argparse error with the allowed range instead of a surprise at run time. Floats must be finite.
    """
    if above:
        wanted = f"> {low:g}"
    elif high is None:
        wanted = f">= {low:g}"
    else:
        wanted = f"in {low:g}-{high:g}"
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        ok = math.isfinite(value) and (value > low if above else value >= low) and (high is None or value <= high)
        if not ok:
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {noun} {wanted}")
        return value

    return parse


port = _bounded(int, 0, 65535)
positive_int = _bounded(int, 1)
non_negative_int = _bounded(int, 0)
positive_seconds = _bounded(float, 0, above=True)
non_negative_seconds = _bounded(float, 0)
non_negative_float = _bounded(float, 0)
at_least_one = _bounded(float, 1)


def kv_events_config(value: str) -> str:
    """`--kv-events-config`: vLLM's JSON object, checked here so a typo is a usage error, kept as given."""
    try:
        parse_config_flag(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generation_config_source(value: str) -> str:
    """`--generation-config`: auto, vllm, or a directory with a generation_config.json (checked now, not at start)."""
    if value in ("auto", "vllm"):
        return value
    if not (Path(value) / "generation_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{value!r} is neither auto, vllm nor a directory with generation_config.json")
    return value


_DEFAULTS = ServerConfig()
"""Every setting's default, ServerConfig's (the one definition, also behind PYFRONT_* and `create_app()`)."""


def _default(name: str) -> Any:
    """The default of the flag for setting ``name``: its ServerConfig field's (a list copied: argparse keeps it)."""
    value = getattr(_DEFAULTS, name)
    return list(value) if isinstance(value, list) else value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyfront", description="OpenAI-compatible front end for vLLM engines")
    parser.add_argument("--version", action="version", version=f"pyfront {version('pyfront')}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description="Serve MODEL (a local model or tokenizer directory, or the bundled "
        f"{BUNDLED_TOKENIZER_NAME!r}) against external vLLM engines (started with `vllm serve MODEL --headless`), "
        "or against the bundled mock engine. Engine-side flags (-tp, --dtype, --gpu-memory-utilization, ...) "
        "belong to `vllm serve --headless` and are refused here.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.set_defaults(serve_parser=serve)
    serve.add_argument("model", nargs="?", default=_default("model"), help="model or tokenizer directory")
    serve.add_argument("--host", default=_default("host"), help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument(
        "--port", type=port, default=_default("port"), help="HTTP port (0: a free port, shown in the banner)"
    )
    serve.add_argument("--uds", default=_default("uds"), help="serve on this unix socket instead of --host/--port")
    serve.add_argument(
        "--api-key",
        action="append",
        default=_default("api_key"),
        help="required bearer key (repeatable; default: $VLLM_API_KEY if set)",
    )
    serve.add_argument(
        "--served-model-name", nargs="+", default=_default("served_model_name"), help="model names the API answers to"
    )
    serve.add_argument("--tokenizer", default=_default("tokenizer"), help="tokenizer directory, if not MODEL")
    serve.add_argument("--chat-template", default=_default("chat_template"), help="chat template file or inline Jinja")
    serve.add_argument(
        "--tokenizer-snapshot-dir",
        default=_default("tokenizer_snapshot_dir"),
        help="where tokenizer snapshots are kept: the first start on a tokenizer checks and writes one, later starts "
        "load it without transformers (default: $PYFRONT_CACHE_DIR/tokenizer-snapshots, ~/.cache/pyfront/...)",
    )
    serve.add_argument(
        "--no-tokenizer-snapshot",
        action="store_true",
        help="load the tokenizer with transformers at every start, and write no snapshot",
    )
    serve.add_argument(
        "--generation-config",
        type=generation_config_source,
        default=_default("generation_config"),
        help="request defaults: 'auto' (the model's generation_config.json), 'vllm' (none), or a directory "
        "holding a generation_config.json",
    )
    serve.add_argument(
        "--trust-request-chat-template",
        action=argparse.BooleanOptionalAction,
        default=_default("trust_request_chat_template"),
        help="allow requests to pass their own chat_template",
    )
    serve.add_argument(
        "--max-model-len",
        type=positive_int,
        default=_default("max_model_len"),
        help="cap below the engines' max_model_len",
    )
    serve.add_argument(
        "--data-parallel-address",
        "-dpa",
        default=_default("data_parallel_address"),
        help="address the engines connect to",
    )
    serve.add_argument(
        "--data-parallel-rpc-port",
        "-dpp",
        type=_bounded(int, 1, 65535),
        default=None,
        help=f"handshake port the engines connect to (default {_DEFAULTS.data_parallel_rpc_port}; a free port with "
        "--mock-engine)",
    )
    serve.add_argument(
        "--data-parallel-size",
        "-dp",
        type=positive_int,
        default=_default("data_parallel_size"),
        help="number of engines (DP ranks)",
    )
    serve.add_argument(
        "--data-parallel-size-local",
        "-dpl",
        type=non_negative_int,
        default=0,
        help="engines this command starts: only 0 (pyfront never starts engines)",
    )
    serve.add_argument(
        "--uvicorn-log-level",
        default=_default("uvicorn_log_level"),
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level",
    )
    serve.add_argument(
        "--allowed-origins",
        nargs="+",
        default=_default("allowed_origins"),
        help="CORS origins (CORS is off without this)",
    )
    serve.add_argument(
        "--max-request-body-bytes",
        type=positive_int,
        default=_default("max_request_body_bytes"),
        help="larger request bodies get 413",
    )
    serve.add_argument(
        "--max-header-bytes",
        "--h11-max-incomplete-event-size",
        type=positive_int,
        default=_default("max_header_bytes"),
        help="a request line plus headers longer than this gets 431 (vLLM's h11 name is an alias)",
    )
    serve.add_argument(
        "--max-header-count",
        "--h11-max-header-count",
        type=positive_int,
        default=_default("max_header_count"),
        help="a request with more headers gets 431 (vLLM's h11 name is an alias)",
    )
    serve.add_argument(
        "--request-read-timeout",
        type=non_negative_seconds,
        default=_default("request_read_timeout"),
        help="seconds for a whole request (headers and body) to arrive, else 408 and the connection closed (0: none)",
    )
    serve.add_argument(
        "--engine-startup-timeout",
        type=positive_seconds,
        default=_default("engine_startup_timeout"),
        help="seconds to wait for every engine's handshake",
    )
    serve.add_argument(
        "--engine-ping-interval",
        type=positive_seconds,
        default=_default("engine_ping_interval"),
        help="an engine that sent nothing for this long is pinged (a stall is found within about twice this "
        "plus --engine-stall-timeout)",
    )
    serve.add_argument(
        "--engine-stall-timeout",
        type=positive_seconds,
        default=_default("engine_stall_timeout"),
        help="an engine silent this long (and not answering pings) is taken out of service",
    )
    routing = serve.add_argument_group("data-parallel routing (engine_client/routing.py)")
    routing.add_argument(
        "--routing",
        choices=ROUTING_POLICIES,
        default=_default("routing"),
        help="cache: to the engine that holds the longest prefix of the prompt (from the engines' KV events, "
        "else approximate from where pyfront sent each prompt), within the imbalance cap; load: load alone, "
        "as vLLM's front end",
    )
    routing.add_argument(
        "--routing-load-weight",
        type=non_negative_float,
        default=_default("routing_load_weight"),
        help="prompt tokens one unit of an engine's DP load score (in-flight, waiting + running) is worth",
    )
    routing.add_argument(
        "--routing-max-imbalance",
        type=at_least_one,
        default=_default("routing_max_imbalance"),
        help="an engine competes only while its load is at most this times the least loaded one's "
        "(or the slack above it)",
    )
    routing.add_argument(
        "--routing-imbalance-slack",
        type=non_negative_float,
        default=_default("routing_imbalance_slack"),
        help="... or at most this much above the least loaded one's load",
    )
    routing.add_argument(
        "--routing-index-max-blocks",
        type=positive_int,
        default=_default("routing_index_max_blocks"),
        help="blocks remembered per engine in the prefix index (~76 bytes each, ~220 with pyfront's own "
        "chains; the oldest go first)",
    )
    routing.add_argument(
        "--kv-events-config",
        type=kv_events_config,
        default=_default("kv_events_config"),
        help="the --kv-events-config JSON the engines were started with (ports are offset per DP rank as vLLM "
        "does); default: the endpoints each engine reports when it registers",
    )
    routing.add_argument(
        "--kv-events-hosts",
        type=lambda value: [h for h in value.split(",") if h],
        default=_default("kv_events_hosts"),
        help="host of the engines that publish KV events on a wildcard endpoint (tcp://*:PORT): one, or one per "
        "rank, comma-separated (default 127.0.0.1)",
    )
    routing.add_argument(
        "--kv-events-silence-timeout",
        type=positive_seconds,
        default=_default("kv_events_silence_timeout"),
        help="an engine that stored new blocks but published no KV event for this long is routed approximately "
        "until its events resume",
    )
    serve.add_argument(
        "--disable-uvicorn-access-log",
        action=argparse.BooleanOptionalAction,
        default=_default("disable_uvicorn_access_log"),
        help="no access-log line per request (saves CPU)",
    )
    serve.add_argument(
        "--enable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=_default("enable_log_requests"),
        help="log one line per admitted completion request (id, route, prompt tokens, parameters)",
    )
    serve.add_argument(
        "--enable-request-id-headers",
        action=argparse.BooleanOptionalAction,
        default=_default("enable_request_id_headers"),
        help="add an X-Request-Id header to every response (the request's own, or a new one)",
    )
    serve.add_argument(
        "--enable-prompt-tokens-details",
        action=argparse.BooleanOptionalAction,
        default=_default("enable_prompt_tokens_details"),
        help="usage.prompt_tokens_details.cached_tokens in responses",
    )
    serve.add_argument(
        "--enable-responses-store",
        action=argparse.BooleanOptionalAction,
        default=_default("enable_responses_store"),
        help="keep /v1/responses answers for previous_response_id and GET (or VLLM_ENABLE_RESPONSES_API_STORE=1)",
    )
    serve.add_argument(
        "--responses-store-max-responses",
        type=positive_int,
        default=_default("responses_store_max_responses"),
        help="stored responses at most (least recently used evicted first)",
    )
    serve.add_argument(
        "--responses-store-max-bytes",
        type=positive_int,
        default=_default("responses_store_max_bytes"),
        help="bytes of stored responses at most (least recently used evicted first)",
    )
    serve.add_argument(
        "--disable-fastapi-docs",
        action=argparse.BooleanOptionalAction,
        default=_default("disable_fastapi_docs"),
        help="no /docs, /redoc or /openapi.json",
    )
    serve.add_argument(
        "--root-path",
        default=_default("root_path"),
        help="path prefix of a proxy in front of the server (FastAPI root_path)",
    )
    serve.add_argument(
        "--ssl-keyfile", default=_default("ssl_keyfile"), help="TLS private key file (with --ssl-certfile)"
    )
    serve.add_argument("--ssl-certfile", default=_default("ssl_certfile"), help="TLS certificate file: serve HTTPS")
    serve.add_argument(
        "--ssl-ca-certs",
        default=_default("ssl_ca_certs"),
        help="CA certificates that client certificates are checked against",
    )
    serve.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=_default("ssl_cert_reqs"),
        choices=[int(r) for r in ssl.VerifyMode],
        help="client certificates: 0 not asked, 1 optional, 2 required (Python's ssl.CERT_*)",
    )
    serve.add_argument(
        "--tool-call-parser",
        default=_default("tool_call_parser"),
        help="tool call parser (e.g. hermes, qwen3_coder), or auto: the format the chat template writes "
        "(an unknown name lists the known ones)",
    )
    serve.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=_default("enable_auto_tool_choice"),
        help="parse tool calls for tool_choice auto",
    )
    serve.add_argument(
        "--reasoning-parser", default=_default("reasoning_parser"), help="reasoning parser (known: qwen3)"
    )
    serve.add_argument(
        "--api-server-count",
        "-asc",
        type=positive_int,
        default=_default("api_server_count"),
        help="API server processes sharing the port, each its own engine client (needs an explicit --port)",
    )
    serve.add_argument(
        "--max-num-seqs-in-flight",
        type=non_negative_int,
        default=_default("max_num_seqs_in_flight"),
        help="engine requests admitted at once; beyond it 503 + Retry-After (0: no limit)",
    )
    serve.add_argument(
        "--request-timeout",
        type=non_negative_seconds,
        default=_default("request_timeout"),
        help="seconds before a request is aborted with 504 (0: none; X-Request-Timeout asks less)",
    )
    serve.add_argument(
        "--sse-keep-alive-interval",
        type=non_negative_seconds,
        default=_default("sse_keep_alive_interval"),
        help="seconds of stream silence before an SSE keep-alive comment (0: off)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=non_negative_seconds,
        default=_default("shutdown_timeout"),
        help="on SIGTERM/Ctrl-C, seconds for in-flight requests to finish before they are cut",
    )
    serve.add_argument("--metrics-require-api-key", action="store_true", help="guard /metrics with --api-key too")
    serve.add_argument("--mock-engine", action="store_true", help="start the bundled mock engine (no GPU needed)")
    serve.add_argument(
        "--mock-engine-args",
        default="",
        help="extra flags for the mock engine, e.g. '--step-interval 0.01 --advertise-feh'",
    )
    for flags in ENGINE_SIDE_FLAGS:
        serve.add_argument(
            *flags, dest=_engine_dest(flags), nargs="?", const=True, default=None, help=argparse.SUPPRESS
        )
    return parser


def _engine_dest(flags: tuple[str, ...]) -> str:
    return "_engine" + flags[0].replace("-", "_")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; an unknown flag is reported with the `serve` usage and the nearest known flag."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        serve: argparse.ArgumentParser = args.serve_parser
        known = [o for a in serve._actions if a.help is not argparse.SUPPRESS for o in a.option_strings]
        hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u.split("=")[0], known, 1)) else u
                 for u in unknown]  # fmt: skip
        serve.error(f"unrecognized arguments: {' '.join(hints)}")
    return args


def _origins(values: list[str]) -> list[str]:
    """--allowed-origins as pyfront takes it (one or more origins) or as `vllm serve` does (one JSON list)."""
    if len(values) == 1 and values[0].lstrip().startswith("["):
        try:
            origins = json.loads(values[0])
        except ValueError:
            origins = None
        if not (isinstance(origins, list) and all(isinstance(o, str) for o in origins)):
            raise SystemExit(f"pyfront: --allowed-origins {values[0]}: not a JSON list of strings")
        return origins
    return values


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServerConfig:
    """The settings the flags ask for, or a one-line `SystemExit("pyfront: ...")` saying what to pass instead."""
    from pyfront.server.chat.parsers import AUTO_TOOL_PARSER, get_reasoning_parser, get_tool_parser

    try:
        if args.tool_call_parser and args.tool_call_parser != AUTO_TOOL_PARSER:
            get_tool_parser(args.tool_call_parser)
        if args.reasoning_parser:
            get_reasoning_parser(args.reasoning_parser)
    except ValueError as exc:
        raise SystemExit(f"pyfront: {exc}") from None
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("pyfront: --enable-auto-tool-choice needs --tool-call-parser")
    engine_flags = ["/".join(flags) for flags in ENGINE_SIDE_FLAGS if getattr(args, _engine_dest(flags)) is not None]
    if engine_flags:
        raise SystemExit(
            f"pyfront: {', '.join(engine_flags)} configure(s) the engine, not the front end: pass them to "
            "`vllm serve MODEL --headless ...`, which starts the engines that pyfront connects to"
        )
    if args.data_parallel_size_local != 0:
        raise SystemExit(
            f"pyfront: --data-parallel-size-local {args.data_parallel_size_local}: pyfront never starts engines "
            "(only 0, external engines, is accepted); start them with `vllm serve MODEL --headless "
            "--data-parallel-size-local N ...`"
        )
    if (args.ssl_keyfile or args.ssl_ca_certs or args.ssl_cert_reqs) and not args.ssl_certfile:
        raise SystemExit("pyfront: --ssl-keyfile, --ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile")
    for flag, path in (("--ssl-keyfile", args.ssl_keyfile), ("--ssl-certfile", args.ssl_certfile),
                       ("--ssl-ca-certs", args.ssl_ca_certs)):  # fmt: skip
        if path and not os.path.isfile(path):
            raise SystemExit(f"pyfront: {flag} {path}: no such file")
    if args.uds and args.api_server_count > 1:
        raise SystemExit("pyfront: --uds serves one API server process: drop --api-server-count")
    rpc_port = args.data_parallel_rpc_port
    if rpc_port is None:
        rpc_port = _free_port() if args.mock_engine else _DEFAULTS.data_parallel_rpc_port
    mock_args = args.mock_engine_args.split()
    if args.mock_engine and "--output-len" not in mock_args:
        mock_args += ["--output-len", "48"]  # a demo answer ends after a sentence or two
    if args.mock_engine and "--advertise-feh" not in mock_args and "--no-feh" not in mock_args:
        mock_args.append("--advertise-feh")
    mock_args = [a for a in mock_args if a != "--no-feh"]
    spec = bundled_spec(args.tokenizer or args.model)
    if args.mock_engine and spec not in (None, QWEN3) and not {"--tokenizer", "--word-ids"} & set(mock_args):
        # The mock's default words are Qwen3 ids: for another bundled vocabulary it picks that one's words.
        mock_args += ["--tokenizer", spec.name]
    return ServerConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        generation_config=args.generation_config,
        trust_request_chat_template=args.trust_request_chat_template,
        tokenizer_snapshot_dir=args.tokenizer_snapshot_dir,
        no_tokenizer_snapshot=args.no_tokenizer_snapshot,
        max_model_len=args.max_model_len,
        host=args.host,
        port=args.port,
        api_key=resolve_api_keys(args.api_key, environ),
        metrics_require_api_key=args.metrics_require_api_key,
        allowed_origins=_origins(args.allowed_origins),
        max_request_body_bytes=args.max_request_body_bytes,
        max_header_bytes=args.max_header_bytes,
        max_header_count=args.max_header_count,
        request_read_timeout=args.request_read_timeout,
        uvicorn_log_level=args.uvicorn_log_level,
        data_parallel_address=args.data_parallel_address,
        data_parallel_rpc_port=rpc_port,
        data_parallel_size=args.data_parallel_size,
        engine_startup_timeout=args.engine_startup_timeout,
        engine_ping_interval=args.engine_ping_interval,
        engine_stall_timeout=args.engine_stall_timeout,
        routing=args.routing,
        routing_load_weight=args.routing_load_weight,
        routing_max_imbalance=args.routing_max_imbalance,
        routing_imbalance_slack=args.routing_imbalance_slack,
        routing_index_max_blocks=args.routing_index_max_blocks,
        kv_events_config=args.kv_events_config,
        kv_events_hosts=args.kv_events_hosts,
        kv_events_silence_timeout=args.kv_events_silence_timeout,
        max_num_seqs_in_flight=args.max_num_seqs_in_flight,
        request_timeout=args.request_timeout,
        sse_keep_alive_interval=args.sse_keep_alive_interval,
        shutdown_timeout=args.shutdown_timeout,
        api_server_count=args.api_server_count,
        disable_uvicorn_access_log=args.disable_uvicorn_access_log,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        reasoning_parser=args.reasoning_parser,
        mock_engine=args.mock_engine,
        mock_engine_args=mock_args,
        enable_log_requests=args.enable_log_requests,
        enable_request_id_headers=args.enable_request_id_headers,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_responses_store=args.enable_responses_store,
        responses_store_max_responses=args.responses_store_max_responses,
        responses_store_max_bytes=args.responses_store_max_bytes,
        disable_fastapi_docs=args.disable_fastapi_docs,
        root_path=args.root_path,
        uds=args.uds,
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        from pyfront.server.launcher import serve

        config = config_from_args(args)
        if problem := tokenizer_problem(config.tokenizer_name):
            raise SystemExit(f"pyfront: {problem}")
        serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
