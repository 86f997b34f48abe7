"""Server settings, from the CLI (`pyfront serve`) or from environment variables (the uvicorn factory)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from pyfront.server.bundled_tokenizer import BUNDLED_TOKENIZER_NAME

ENV_PREFIX = "PYFRONT_"


@dataclass(slots=True)
class ServerConfig:
    model: str = BUNDLED_TOKENIZER_NAME
    served_model_name: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    chat_template: str | None = None
    trust_request_chat_template: bool = False
    max_model_len: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: list[str] = field(default_factory=list)
    metrics_require_api_key: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    max_request_body_bytes: int = 32 * 1024 * 1024
    uvicorn_log_level: str = "info"
    disable_uvicorn_access_log: bool = False
    data_parallel_address: str = "127.0.0.1"
    data_parallel_rpc_port: int = 62100
    data_parallel_size: int = 1
    engine_startup_timeout: float = 600.0
    engine_ping_interval: float = 2.0
    engine_stall_timeout: float = 30.0
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
    enable_prompt_tokens_details: bool = False
    """usage.prompt_tokens_details.cached_tokens from the engine's num_cached_tokens (vLLM's flag of the same name)."""

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
        if config.api_key == [] and environ.get("VLLM_API_KEY"):
            config.api_key = [environ["VLLM_API_KEY"]]
        return config
