"""Server settings, from the CLI (`pyfront serve`) or from environment variables (the uvicorn factory)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from pyfront.engine_client.routing import RoutingConfig
from pyfront.server.text.bundled_tokenizer import BUNDLED_TOKENIZER_NAME, is_bundled_tokenizer_name

ENV_PREFIX = "PYFRONT_"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A tokenizer directory needs one of these (transformers' AutoTokenizer reads them)."""
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_api_keys(given: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """The bearer keys the server requires: `--api-key` / PYFRONT_API_KEY, else VLLM_API_KEY.

    The one place both start-up paths (`pyfront serve` and the uvicorn factory) decide the keys. As in
    `vllm serve`, whose `--api-key` defaults to VLLM_API_KEY, keys given explicitly replace the variable
    rather than adding to it; empty keys are dropped (an empty key would let an empty bearer token in).
    """
    keys = [key for key in given if key]
    if not keys and environ.get("VLLM_API_KEY"):
        keys = [environ["VLLM_API_KEY"]]
    return keys


def tokenizer_problem(name: str) -> str | None:
    """Why `name` cannot be loaded as a tokenizer offline, in one line with what to pass instead; None if it can.

    Checked before anything starts, so a wrong MODEL costs one clear line rather than a transformers
    traceback after the server has announced itself.
    """
    if is_bundled_tokenizer_name(name):
        return None
    instead = (
        f"pass a local directory with {' or '.join(TOKENIZER_FILES)} (MODEL, or --tokenizer DIR), "
        f"or the bundled {BUNDLED_TOKENIZER_NAME!r}"
    )
    path = Path(name).expanduser()
    if path.is_dir():
        if any((path / f).is_file() for f in TOKENIZER_FILES):
            return None
        return f"{name} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): {instead}"
    if path.exists():
        return f"{name} is a file, not a model or tokenizer directory: {instead}"
    if _HUB_ID.fullmatch(name):
        from huggingface_hub import try_to_load_from_cache

        if any(isinstance(try_to_load_from_cache(name, f), str) for f in TOKENIZER_FILES):
            return None  # already in the local Hugging Face cache: transformers loads it offline
        return (
            f"{name} is not a local directory, and pyfront does not download from the Hugging Face hub: "
            f"download it where the hub is reachable (e.g. `hf download {name} --local-dir DIR`) and pass DIR, "
            f"or pass the bundled {BUNDLED_TOKENIZER_NAME!r}"
        )
    return f"no such directory: {name}: {instead}"


ROUTING_DEFAULTS = RoutingConfig()
"""The routing knobs' defaults: engine_client.routing.RoutingConfig's, the one definition."""


@dataclass(slots=True)
class ServerConfig:
    model: str = BUNDLED_TOKENIZER_NAME
    served_model_name: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    chat_template: str | None = None
    generation_config: str = "auto"
    """Request defaults: "auto" (the model's generation_config.json), "vllm" (none), or a directory with one."""
    trust_request_chat_template: bool = False
    tokenizer_snapshot_dir: str | None = None
    """Where tokenizer snapshots are kept (server/text/lean.py: later starts load the tokenizer without transformers);
    None: $PYFRONT_CACHE_DIR/tokenizer-snapshots (~/.cache/pyfront/...)."""
    no_tokenizer_snapshot: bool = False
    """No snapshots: every start loads the tokenizer with transformers."""
    max_model_len: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: list[str] = field(default_factory=list)
    """Bearer keys; decided by `resolve_api_keys` on both start-up paths."""
    metrics_require_api_key: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    max_request_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    """The request line and headers, in bytes; a longer request head gets 431 before it is parsed further."""
    max_header_count: int = 256
    """Headers in one request; more get 431 (vLLM's --h11-max-header-count default)."""
    request_read_timeout: float = 60.0
    """Seconds for a whole request (head and body) to arrive, from the connection's start or its first byte;
    a slower one gets 408 and its connection is closed. 0: no bound."""
    uvicorn_log_level: str = "info"
    disable_uvicorn_access_log: bool = False
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 62100
    data_parallel_size: int = 1
    engine_startup_timeout: float = 600.0
    engine_ping_interval: float = 2.0
    engine_stall_timeout: float = 30.0
    routing: str = "cache"
    """Data-parallel routing: "cache" (prefix-cache aware, engine_client/routing.py) or "load" (load alone)."""
    routing_load_weight: float = ROUTING_DEFAULTS.load_weight
    routing_max_imbalance: float = ROUTING_DEFAULTS.max_imbalance
    routing_imbalance_slack: float = ROUTING_DEFAULTS.imbalance_slack
    routing_index_max_blocks: int = ROUTING_DEFAULTS.index_max_blocks
    kv_events_config: str | None = None
    """vLLM's --kv-events-config JSON, as the engines were given it; None: the endpoints the engines register."""
    kv_events_hosts: list[str] = field(default_factory=list)
    """Hosts of engines that publish on a wildcard endpoint (one, or one per rank); default 127.0.0.1."""
    kv_events_silence_timeout: float = ROUTING_DEFAULTS.silence_timeout_s
    max_num_seqs_in_flight: int = 4096
    """Engine requests (choices) admitted at once by this process; beyond it, 503 with Retry-After. 0: no limit."""
    request_timeout: float = 0.0
    """Seconds before a request is aborted and answered with 504; 0: none. X-Request-Timeout can ask for less."""
    sse_keep_alive_interval: float = 15.0
    """Seconds of silence before a stream gets an SSE comment, so proxies keep long prefills open; 0: off."""
    shutdown_timeout: float = 30.0
    """On SIGTERM, seconds to let in-flight requests finish before they are aborted."""
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    api_server_count: int = 1
    client_index: int = 0
    """Set by the launcher for each API server process, as are the three fields below."""
    client_count: int = 1
    engine_input_address: str | None = None
    engine_output_address: str | None = None
    mock_engine: bool = False
    mock_engine_args: list[str] = field(default_factory=list)
    enable_log_requests: bool = False
    """One log line per admitted completion request (id, route, prompt tokens, parameters)."""
    enable_request_id_headers: bool = False
    """An X-Request-Id header on every response (vLLM's flag of the same name; off: none)."""
    disable_fastapi_docs: bool = False
    """No /docs, /redoc, /openapi.json."""
    root_path: str = ""
    """FastAPI root_path, for a server behind a path-prefix proxy."""
    uds: str | None = None
    """Serve HTTP on this unix socket instead of host:port."""
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    """ssl.CERT_NONE (0), CERT_OPTIONAL (1) or CERT_REQUIRED (2): whether clients must show a certificate."""
    enable_prompt_tokens_details: bool = False
    """usage.prompt_tokens_details.cached_tokens from the engine's num_cached_tokens (vLLM's flag of the same name)."""
    enable_responses_store: bool = False
    """Keep /v1/responses answers for previous_response_id and GET (also on with VLLM_ENABLE_RESPONSES_API_STORE=1)."""
    responses_store_max_responses: int = 1000
    """Stored responses at most; beyond it the least recently used is evicted."""
    responses_store_max_bytes: int = 256 * 1024 * 1024
    """Bytes of stored responses at most (bodies, messages, prompt text and ids); LRU eviction beyond it."""

    @property
    def model_names(self) -> list[str]:
        return self.served_model_name or [self.model]

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ServerConfig:
        """`PYFRONT_MODEL`, `PYFRONT_PORT`, `PYFRONT_API_KEY` (comma-separated), ... one per field."""
        config = cls()
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            kind = str(f.type)  # annotations are strings here: "int | None", "list[str]", ...
            value: object
            if kind.startswith("bool"):
                value = raw.strip().lower() in ("1", "true", "yes", "on")
            elif kind.startswith("list"):
                value = [part for part in (p.strip() for p in raw.split(",")) if part]
            elif kind.startswith("int"):
                value = int(raw)
            elif kind.startswith("float"):
                value = float(raw)
            else:
                value = raw
            setattr(config, f.name, value)
        config.api_key = resolve_api_keys(config.api_key, environ)
        return config
