"""The process's serving state: what every handler needs, built once at start-up, and admission.

`ServingState` holds the tokenizer, the engine client (or why there is none), the metrics and the
server's settings; `admit` reserves in-flight capacity (503 beyond it, never an unbounded queue).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyfront.engine_client.interface import Engine
from pyfront.server.errors import APIError, Overloaded
from pyfront.server.ids import EngineRequestIds
from pyfront.server.metrics import Metrics
from pyfront.server.pacing import AdmissionPacer
from pyfront.server.text.prompts import RecentPrompts
from pyfront.server.text.tokenizer import ChatTokenizer

logger = logging.getLogger("pyfront.server")


@dataclass(slots=True)
class ServingState:
    """What every request handler needs; one per process, built at start-up."""

    tokenizer: ChatTokenizer
    metrics: Metrics
    model_names: list[str]
    max_model_len_override: int | None
    allow_request_chat_template: bool = False
    api_server_index: int = 0
    tool_parser: Any = None
    """The --tool-call-parser class, or None."""
    reasoning_parser: Any = None
    """The --reasoning-parser class, or None."""
    enable_auto_tool_choice: bool = False
    max_in_flight: int | None = None
    """Engine requests (choices) this process admits at once; beyond it, 503 + Retry-After."""
    request_timeout_s: float | None = None
    sse_keepalive_s: float | None = 15.0
    enable_prompt_tokens_details: bool = False
    """Report usage.prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details), as vLLM does."""
    active: int = 0
    engine: Engine | None = None
    """The engine client (EngineClient over ZMQ; in-process tests put a FakeEngine here), None until it starts."""
    engine_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    engine_ids: EngineRequestIds = field(default_factory=EngineRequestIds)
    pacer: AdmissionPacer = field(default_factory=AdmissionPacer)
    """Streamed requests' admissions take turns with running streams' outputs in a burst (server/pacing.py)."""
    """Makes the engine request id of every choice (the base id plus random bits)."""
    sampling_memo: Any = None
    """The request path's SamplingMemo (server/generate/sampling.py), made by its first request: it keeps every
    request shape's engine sampling parameters (this module sits below the request path and does not name it)."""
    recent_prompts: RecentPrompts = field(default_factory=lambda: RecentPrompts())
    """The last long prompts rendered, for the next turn of each conversation to tokenize and hash only what it
    adds (server/chat/render.py)."""
    render_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=4, thread_name_prefix="pyfront-render")
    )
    """Worker threads for rendering, tokenizing and hashing prompts (one hop per request; none for small bodies,
    chat.render.INLINE_RENDER_MAX_BYTES). A plain executor: anyio's to_thread costs a capacity limiter and
    cancel-scope checkpoints on every call."""

    @property
    def max_model_len(self) -> int:
        engine_len = self.engine.max_model_len if self.engine is not None else 0
        if self.max_model_len_override:
            return min(self.max_model_len_override, engine_len) if engine_len else self.max_model_len_override
        return engine_len

    def require_engine(self) -> Engine:
        engine = self.engine
        if engine is None:
            reason = self.engine_error or "the engines are still starting"
            raise APIError(503, f"no engine is available: {reason}", headers={"Retry-After": "5"})
        if not engine.healthy:
            raise APIError(503, "no healthy engine is available", headers={"Retry-After": "5"})
        return engine

    def admit(self, count: int) -> Admission:
        """Reserve room for `count` engine requests, or refuse with 503 (never queue without bound).

        A request that needs more room than there is at all (n choices, times its prompts) can never be
        admitted: that is the client's 400, not a 503 telling it to retry.
        """
        if self.max_in_flight is not None and count > self.max_in_flight:
            raise APIError(
                400,
                f"this request needs {count} engine requests (n times the prompts); the server admits at most "
                f"{self.max_in_flight} at once (--max-num-seqs-in-flight)",
                param="n",
            )
        if self.max_in_flight is not None and self.active + count > self.max_in_flight:
            self.metrics.rejected.labels(self.metrics.model_name, "overload").inc()
            raise Overloaded(
                503,
                f"the server is at capacity ({self.max_in_flight} requests in flight); retry later",
                headers={"Retry-After": "1"},
            )
        self.active += count
        return Admission(self, count)

    def deadline(self, header: str | None) -> float | None:
        """The request's deadline: X-Request-Timeout (seconds) capped by --request-timeout."""
        timeout = self.request_timeout_s
        if header is not None:
            try:
                asked = float(header)
            except ValueError:
                raise APIError(
                    400, "X-Request-Timeout must be a number of seconds", param="X-Request-Timeout"
                ) from None
            if not asked > 0:
                raise APIError(400, "X-Request-Timeout must be positive", param="X-Request-Timeout")
            timeout = asked if timeout is None else min(asked, timeout)
        return None if timeout is None else time.monotonic() + timeout

    def data_parallel_rank(self, header: str | None) -> int | None:
        """X-data-parallel-rank: the engine the request must go to, as vLLM's front end reads it.

        A value that is not an int is ignored (vLLM's ``_get_data_parallel_rank``); one outside the engines'
        ranks is a 400 with vLLM's message (its input processor's check).
        """
        if header is None:
            return None
        try:
            rank = int(header)
        except ValueError:
            return None
        count = len(self.require_engine().engines)
        if not 0 <= rank < count:
            raise APIError(
                400, f"data_parallel_rank {rank} is out of range [0, {count}).", param="X-data-parallel-rank"
            )
        return rank

    def check_model(self, model: str | None) -> str:
        if model is None or model == "":
            return self.model_names[0]
        if model not in self.model_names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model")
        return model


class Admission:
    """A reservation of in-flight capacity; `release()` is idempotent."""

    __slots__ = ("count", "state")

    def __init__(self, state: ServingState, count: int) -> None:
        self.state = state
        self.count = count

    def release(self) -> None:
        if self.count:
            self.state.active -= self.count
            self.count = 0
