"""An in-process engine for HTTP handler tests: `FakeEngine` implements `pyfront.engine_client.interface.Engine`.

No sockets, threads or engine processes: requests are answered by a script on the test's event loop, and
the outputs go into real `RequestStream` objects through `RequestStream.push`, the same entry point
`EngineClient`'s output loop uses, so the server consumes them exactly as it consumes a ZMQ engine's.

    engine = FakeEngine()                                # echo DEFAULT_TOKENS, finish as max_tokens says
    engine = FakeEngine(script=lambda request: [...])    # or script every step yourself
    state.engine = engine                                # wherever the server takes its Engine

What it mirrors from `EngineClient` (``tests/engine_client/test_fakes.py`` checks each against the ZMQ client):
- `add_request` validates with `validate_request` (ValueError), refuses an id already in flight
  (`DuplicateRequestError`), hashes eligible prompts when given a `hasher`, and raises
  `EngineUnavailableError` once closed or dead;
- outputs of every request arrive in order, one engine "step" at a time for all running requests, and a
  request leaves the in-flight set with its finished output;
- `abort` ends the streams at once with `RequestAbortedError` (``async for`` stops quietly) and nothing more
  is delivered for those ids; `die` fails every in-flight stream with `EngineDeadError`, as a dead engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyfront.engine_client.client import (
    DuplicateRequestError,
    EngineDeadError,
    EngineUnavailableError,
    RequestAbortedError,
    RequestStream,
    feh_eligible,
)
from pyfront.engine_client.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason
from pyfront.engine_client.validation import validate_request
from pyfront.hashing import PromptHasher

__all__ = ["DEFAULT_TOKENS", "FakeEngine", "FakeEngineLoad", "Script", "Step", "echo_script"]

Step = Sequence[EngineCoreOutput]
"""The outputs one engine step delivers for one request (usually one; several test batching)."""
Script = Callable[[EngineCoreRequest], Sequence[Step]]
"""Called once per added request: every step's outputs for it, in order.

A script whose last step carries no finish_reason leaves the request in flight until it is aborted (or the
engine dies or closes): that is how a test holds a request open, e.g. to disconnect a client mid-stream.
"""

DEFAULT_TOKENS: tuple[int, ...] = (279, 1614, 323, 264, 311, 315, 304, 374)
"""What the default script emits: whole-word Qwen ids (" the", " model", " and", ...), so text decodes to words."""


def echo_script(tokens: Sequence[int] = DEFAULT_TOKENS) -> Script:
    """One token of `tokens` per step, finishing as the request's ``max_tokens`` says.

    ``max_tokens`` reached first: the last token finishes with LENGTH. `tokens` used up first: one more step
    samples the request's EOS token (``_eos_token_id``, unless ``ignore_eos``) and finishes with STOP, as an
    engine does; without an EOS to sample, the last token of `tokens` finishes with STOP.
    """
    fixed = tuple(tokens)

    def script(request: EngineCoreRequest) -> list[Step]:
        sp = request.sampling_params
        max_tokens = sp.max_tokens if sp is not None and sp.max_tokens is not None else 16
        rid = request.request_id
        emitted = list(fixed[:max_tokens])
        steps: list[Step] = [[EngineCoreOutput(rid, [token])] for token in emitted]
        if len(emitted) == max_tokens:
            finish = FinishReason.LENGTH
        else:
            finish = FinishReason.STOP
            eos = None if sp is None or sp.ignore_eos else sp.eos_token_id
            if eos is not None or not steps:
                steps.append([EngineCoreOutput(rid, [] if eos is None else [eos])])
        last = steps[-1][-1]
        last.finish_reason = int(finish)
        return steps

    return script


@dataclass(slots=True)
class FakeEngineLoad:
    """The one engine's load (`EngineLoad`); set `num_waiting` to test the metrics that read it."""

    rank: int = 0
    num_waiting: int = 0
    num_running: int = 0
    healthy: bool = True


@dataclass(slots=True, eq=False)
class _Running:
    stream: RequestStream
    steps: deque[Step] = field(default_factory=deque)


class FakeEngine:
    """One in-process "engine" answering by script; records what it was sent. See the module docstring.

    `step_interval_s` is the time between engine steps (0: one event-loop turn, so outputs still arrive
    after `add_request` returns, never inside it). Records: `added` (requests in arrival order, as sent:
    validated, hashes attached), `aborted` (ids that were in flight when aborted: what a real engine would
    receive), `abort_calls` (every `abort` call's ids, as given).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        max_model_len: int = 4096,
        hasher: PromptHasher | None = None,
        step_interval_s: float = 0.0,
    ) -> None:
        self.script: Script = script if script is not None else echo_script()
        self.max_model_len = max_model_len
        self.hasher = hasher
        self.step_interval_s = step_interval_s
        self.engines: list[FakeEngineLoad] = [FakeEngineLoad()]
        self.added: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.abort_calls: list[list[str]] = []
        self._running: dict[str, _Running] = {}
        self._add_error: BaseException | None = None
        self._dead: str | None = None
        self._closed = False
        self._stepper: asyncio.Task[None] | None = None
        self._progress: asyncio.Event | None = None
        """Set when a request is added: wakes a step loop whose running requests all wait for an abort."""

    # ------------------------------------------------------------------ Engine protocol

    @property
    def healthy(self) -> bool:
        return not self._closed and self._dead is None

    @property
    def num_in_flight(self) -> int:
        return len(self._running)

    def health(self) -> dict[str, Any]:
        """Same shape as `EngineClient.health()`."""
        status = "ok" if self._dead is None else "disconnected"
        return {
            "healthy": self.healthy,
            "degraded_ranks": [] if self._dead is None else [e.rank for e in self.engines],
            "engines": [
                {
                    "rank": e.rank,
                    "healthy": self._dead is None,
                    "status": status,
                    "in_flight": self.num_in_flight,
                    "waiting": e.num_waiting,
                    "running": e.num_running,
                    "kv_cache_usage": 0.0,
                    "restarts": 0,
                    "routing": {"mode": "off", "reason": "fake engine: one engine, nothing to route"},
                }
                for e in self.engines
            ],
            "front_end_block_hashing": "fake engine: prompts are hashed by pyfront"
            if self.hasher is not None
            else "fake engine: prompts are sent unhashed",
            "routing": {"policy": "load", "state": "fake engine: one engine, nothing to route"},
        }

    def routing_report(self) -> None:
        """One in-process engine: nothing to route, no routing metrics."""
        return None

    async def add_request(
        self,
        request: EngineCoreRequest,
        *,
        prompt_block_hashes: bytes | None = None,
        trusted: bool = False,
    ) -> RequestStream:
        """Check and record the request as `EngineClient.add_request` would, then start scripting its outputs."""
        if self._closed:
            raise EngineUnavailableError("the engine client is closed")
        if self._add_error is not None:
            error, self._add_error = self._add_error, None
            raise error
        if self._dead is not None:
            raise EngineUnavailableError("no healthy engine")
        request.client_index = 0
        validate_request(request, self.max_model_len, 1, trusted=trusted)
        if request.request_id in self._running:
            raise DuplicateRequestError(f"request id {request.request_id!r} is already in flight")
        if self.hasher is not None and feh_eligible(request):
            if prompt_block_hashes is None:
                assert request.prompt_token_ids is not None
                prompt_block_hashes = await self.hasher.hash_prompt(
                    request.prompt_token_ids, request.cache_salt, checked=True
                )
            request.prompt_block_hashes = prompt_block_hashes
        else:
            request.prompt_block_hashes = None
        if request.request_id in self._running:  # re-check: hashing awaited
            raise DuplicateRequestError(f"request id {request.request_id!r} is already in flight")
        stream = RequestStream(request.request_id, 0)
        self._running[request.request_id] = _Running(stream, deque(self.script(request)))
        self.added.append(request)
        self._ensure_stepper()
        return stream

    async def abort(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        self.abort_calls.append(ids)
        for request_id in ids:
            running = self._running.pop(request_id, None)
            if running is None:
                continue
            self.aborted.append(request_id)
            running.stream.fail(RequestAbortedError(f"request {request_id!r} was aborted"), finished=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_all(EngineUnavailableError("the engine client is shutting down"))
        if self._stepper is not None:
            self._stepper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stepper

    # ------------------------------------------------------------------ test controls

    @property
    def added_ids(self) -> list[str]:
        """Ids of every added request, in arrival order."""
        return [r.request_id for r in self.added]

    def fail_next_add(self, error: BaseException) -> None:
        """The next `add_request` raises `error` (e.g. `EngineUnavailableError`, or ValueError for a 400)."""
        self._add_error = error

    def die(self, reason: str = "the engine process is gone") -> None:
        """Fail every in-flight request with `EngineDeadError` and refuse new ones, as a dead engine does."""
        self._dead = reason
        self.engines[0].healthy = False
        self._fail_all(EngineDeadError(f"engine rank 0 is disconnected: {reason}"))

    def revive(self) -> None:
        """Back in service (a stalled engine that answers again)."""
        self._dead = None
        self.engines[0].healthy = True

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Return once no request is in flight (every script ran out or was aborted)."""
        async with asyncio.timeout(timeout):
            while self._running:
                await asyncio.sleep(0)

    # ------------------------------------------------------------------ stepping

    def _fail_all(self, error: BaseException) -> None:
        running, self._running = self._running, {}
        for entry in running.values():
            entry.stream.fail(error)

    def _ensure_stepper(self) -> None:
        if self._progress is not None:
            self._progress.set()
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._step_loop(), name="fake-engine-steps")

    async def _step_loop(self) -> None:
        """Step while requests run: each step delivers the next outputs of every running request, in arrival
        order. The task ends when nothing runs and `add_request` starts a new one, so a FakeEngine is not tied
        to one event loop."""
        while self._running:
            if not any(entry.steps for entry in self._running.values()):
                # Only held-open requests: sleep until one is added (aborts and deaths empty the dict).
                self._progress = progress = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(progress.wait(), 0.05)
                continue
            await asyncio.sleep(self.step_interval_s)
            for request_id, entry in list(self._running.items()):
                if self._running.get(request_id) is not entry:
                    continue  # aborted by a listener during this step
                if not entry.steps:
                    continue  # script ran out unfinished: in flight until aborted
                for output in entry.steps.popleft():
                    entry.stream.push(output)
                    if output.finish_reason is not None:
                        self._running.pop(request_id, None)
                        break
