"""The stored responses behind ``store``, ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``.

vLLM 0.32 keeps every stored response in a plain dict forever (and warns of the leak); pyfront bounds the
store by count and by bytes and evicts the least recently used response first. As in vLLM, nothing is stored
unless the server enables it (``--enable-responses-store`` or ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a
request's ``store: true`` (OpenAI's default) is then silently ignored, and a ``previous_response_id`` is
unknown (404).
"""

from __future__ import annotations

import array
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from pyfront.server.openai.types import ChatMessage

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
    """One stored response: what a later turn needs to continue it.

    ``messages`` are the chat messages its prompt was rendered from (instructions included: a later turn
    drops them, as OpenAI's instructions do not carry over); the next turn appends the output items, then
    its own input. ``prompt_text`` and ``prompt_ids`` are the rendered prompt, kept so that a later turn can
    check or reuse the stored prefix instead of rendering and tokenizing it again.
    """

    body: dict[str, Any]
    messages: list[ChatMessage]
    prompt_text: str
    prompt_ids: array.array[int]
    nbytes: int


def stored_response(body: dict[str, Any], messages: list[ChatMessage], prompt_text: str,
                    prompt_ids: list[int]) -> StoredResponse:  # fmt: skip
    """A StoredResponse with its size: the encoded body and messages, the text's UTF-8 bytes, 4 bytes an id."""
    ids = array.array("i", prompt_ids)
    size = len(msgspec.json.encode(body)) + len(msgspec.json.encode(messages))
    size += len(prompt_text.encode("utf-8", "surrogatepass")) + ids.itemsize * len(ids)
    return StoredResponse(body, messages, prompt_text, ids, size)


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

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if not self.enabled:
            return
        if entry.nbytes > self.max_bytes:
            logger.warning("response %s (%d bytes) is larger than the store (%d bytes): not stored",
                           response_id, entry.nbytes, self.max_bytes)  # fmt: skip
            return
        with self._lock:
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= old.nbytes
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
