"""The stored responses behind ``store``, ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``.

vLLM 0.32 keeps every stored response in a plain dict forever (and warns of the leak); pyfront bounds the
store by count and by bytes and evicts the least recently used response first. As in vLLM, nothing is stored
unless the server enables it (``--enable-responses-store`` or ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a
request's ``store: true`` (OpenAI's default) is then silently ignored, and a ``previous_response_id`` is
unknown (404).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from pyfront.server.api.responses_api.background import BackgroundRuns, EventLog
from pyfront.server.openai.types import ChatMessage
from pyfront.server.text.prompts import TurnPrompt

logger = logging.getLogger("pyfront.server")

STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
"""vLLM's switch for the store (``bool(int(value))``); pyfront honours it beside its own flag."""


def store_enabled_by_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``VLLM_ENABLE_RESPONSES_API_STORE`` read as vLLM reads it; a value that is not an integer stops the start-up."""
    raw = environ.get(STORE_ENV, "0")
    try:
        return bool(int(raw))
    except ValueError:
        raise SystemExit(f"pyfront: {STORE_ENV} must be an integer (0 or 1), got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: what ``GET`` returns and what a later turn needs to continue it.

    ``messages`` are the chat messages its prompt was rendered from (instructions included: a later turn
    drops them, as OpenAI's instructions do not carry over); the next turn appends the output items, then
    its own input. They are shallow copies of the previous turn's, so their contents are shared along a
    conversation. ``prompt`` is the rendered prompt (text, ids, piece starts, block hashes), from which the
    next turn tokenizes and hashes only what it adds; only the newest response of a chain keeps it (the
    store drops a response's prompt when a later turn continuing it is stored: a second branch from it is
    rendered in full, with the same result).

    ``messages_bytes`` bounds the messages' contents from above without encoding the history again each
    turn: every message came from some turn's request body or some stored response's output, so it is the
    previous response's ``messages_bytes`` plus its body plus this turn's raw request. ``nbytes`` adds this
    response's body, a pointer-sized slot per message and the prompt: the sum over the store is an upper
    bound of what it holds (shared contents counted once per response that shares them).
    """

    body: dict[str, Any]
    messages: list[ChatMessage]
    prompt: TurnPrompt | None
    messages_bytes: int
    body_bytes: int
    events: EventLog | None = None
    """A streamed background response's events (``GET ?stream=true`` replays them)."""

    @property
    def nbytes(self) -> int:
        prompt = self.prompt.nbytes if self.prompt is not None else 0
        events = self.events.nbytes if self.events is not None else 0
        return self.body_bytes + self.messages_bytes + 64 * len(self.messages) + prompt + events


def stored_response(
    body: dict[str, Any],
    messages: list[ChatMessage],
    prompt: TurnPrompt | None,
    previous: StoredResponse | None,
    request_bytes: int,
    events: EventLog | None = None,
) -> StoredResponse:
    """A StoredResponse and its sizes (see there); the body is encoded once, O(this turn)."""
    history = previous.messages_bytes + previous.body_bytes if previous is not None else 0
    body_bytes = len(msgspec.json.encode(body))
    return StoredResponse(body, messages, prompt, history + request_bytes, body_bytes, events)


class ResponseStore:
    """Stored responses by id, at most ``max_responses`` of them and ``max_bytes`` in all (LRU eviction).

    Thread-safe (one lock around every access), though the event loop is its only user today: the store
    is the server's one piece of mutable state shared across requests, and a lock keeps it correct for any
    caller. A response larger than ``max_bytes`` on its own is not stored (logged).
    """

    def __init__(self, *, enabled: bool, max_responses: int, max_bytes: int) -> None:
        self.enabled = enabled
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.background = BackgroundRuns()
        """The background responses still running (their entries are here, status ``queued``)."""

    def put(
        self, response_id: str, entry: StoredResponse, previous_id: str | None = None, *, unless_cancelled: bool = False
    ) -> None:
        """Store ``entry``; ``previous_id``: the response it continues, which then drops its prompt;
        ``unless_cancelled``: keep a stored response that was cancelled meanwhile (a background run's end)."""
        if not self.enabled:
            return
        if entry.nbytes > self.max_bytes:
            logger.warning("response %s (%d bytes) is larger than the store (%d bytes): not stored",
                           response_id, entry.nbytes, self.max_bytes)  # fmt: skip
            return
        with self._lock:
            current = self._entries.get(response_id)
            if unless_cancelled and current is not None and current.body.get("status") == "cancelled":
                return
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            parent = self._entries.get(previous_id) if previous_id is not None else None
            if previous_id is not None and parent is not None and parent.prompt is not None:
                lean = dataclasses.replace(parent, prompt=None)
                self._entries[previous_id] = lean  # an existing key: keeps its place in the LRU order
                self._bytes -= parent.nbytes - lean.nbytes
            self._entries[response_id] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def set_status(
        self, response_id: str, status: str, *, only_from: tuple[str, ...] | None = None, error: Any = None
    ) -> StoredResponse | None:
        """Give the stored response ``status`` (and ``error``) if its status is in ``only_from`` (any when None);
        the entry as it is afterwards, or None when there is none."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or (only_from is not None and entry.body.get("status") not in only_from):
                return entry
            body = {**entry.body, "status": status}
            if error is not None:
                body["error"] = error
            updated = dataclasses.replace(entry, body=body, body_bytes=len(msgspec.json.encode(body)))
            self._entries[response_id] = updated
            self._bytes += updated.nbytes - entry.nbytes
            return updated

    def delete(self, response_id: str) -> bool:
        with self._lock:
            entry = self._entries.pop(response_id, None)
            if entry is None:
                return False
            self._bytes -= entry.nbytes
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes
