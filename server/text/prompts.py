"""Rendered prompts kept for later turns: one conversation's previous turn (``TurnPrompt``), and the process's
recent long prompts (``RecentPrompts``), from which a new turn tokenizes and hashes only what it adds
(server/chat/render.py's ``render_turn``)."""

from __future__ import annotations

import threading

from pyfront.hashing import HashConfig
from pyfront.server.text.segment_cache import PromptTokens, common_prefix_length


class TurnPrompt:
    """A rendered turn kept for the next one: its tokens (text, ids, piece starts), and its block hashes
    with the hash config and salt they were computed under (a later turn reuses them only under the same)."""

    __slots__ = ("blob", "hash_config", "salt", "tokens")

    def __init__(
        self, tokens: PromptTokens, blob: bytes | None, hash_config: HashConfig | None, salt: str | None
    ) -> None:
        self.tokens = tokens
        self.blob = blob
        self.hash_config = hash_config
        self.salt = salt

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + (len(self.blob) if self.blob is not None else 0)


class RecentPrompts:
    """The last few long prompts this process rendered, for the next turn of each conversation to start from.

    A client that re-sends a conversation every turn (chat completions, the Messages API, Responses without
    ``previous_response_id``) sends a prompt whose text starts with the previous turn's: ``closest`` finds the kept
    prompt sharing the longest prefix with a new one (chunked string comparison, no more than ``MAX_PROMPTS`` of
    them), and ``render_turn`` tokenizes and hashes only what follows it. Any kept prompt gives the exact result
    (``SegmentTokenizer.encode_after`` and ``PromptHasher.hash_prompt_after_sync`` are exact for any earlier
    prompt); the closest one saves the most. A turn replaces the prompt it started from, so each conversation
    holds one place (a prompt that only shares a beginning with the closest one, such as a system prompt, is kept
    beside it). Bounded by ``MAX_PROMPTS`` prompts and ``MAX_BYTES`` of what they hold (``TurnPrompt.nbytes``:
    ~2 MB for a 100k-token prompt); the least recently used go first. Thread-safe: renders run on the pool.
    """

    MAX_PROMPTS = 16
    MAX_BYTES = 64 * 1024 * 1024

    def __init__(self) -> None:
        self._turns: list[TurnPrompt] = []  # most recent last
        self._lock = threading.Lock()

    def closest(self, text: str) -> tuple[TurnPrompt | None, bool]:
        """The kept prompt sharing the longest prefix with ``text`` (None: none shares any), and whether ``text``
        continues it."""
        with self._lock:
            turns = list(self._turns)
        best, best_shared = None, 0
        for turn in reversed(turns):  # the most recent wins a tie
            shared = common_prefix_length(text, turn.tokens.text)
            if shared > best_shared:
                best, best_shared = turn, shared
        # A continuation shares all of the kept prompt up to its last added token: everything but the generation
        # prompt's text. (A turn whose template rewrote earlier text, such as reasoning Qwen3 drops once a new user
        # message comes, is kept beside the prompt it started from; the older one ages out.)
        continues = best is not None and best_shared >= best.tokens.last_piece_start
        return best, continues

    def add(self, turn: TurnPrompt, replaces: TurnPrompt | None) -> None:
        with self._lock:
            turns = [kept for kept in self._turns if kept is not replaces]
            turns.append(turn)
            total = sum(kept.nbytes for kept in turns)
            while len(turns) > self.MAX_PROMPTS or (total > self.MAX_BYTES and len(turns) > 1):
                total -= turns.pop(0).nbytes
            if total > self.MAX_BYTES:
                turns.clear()
            self._turns = turns

    def __len__(self) -> int:
        return len(self._turns)
