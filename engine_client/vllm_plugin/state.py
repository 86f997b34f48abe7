"""The engine side of FEH without vLLM: settings, the verdict on each shipped blob, counters and trust.

Everything here is plain Python so that the decisions can be unit-tested without an engine; the vLLM-facing
wrappers (`patches.py`) only translate between vLLM's objects and these calls.

One engine process holds one `FehState` (module `__init__` owns it). It is touched from two threads: the
engine's input thread judges requests and records what it hashed, and the core busy loop answers the
`pyfront_feh_stats` utility call. Every read and write of the mutable fields holds the one lock, so a
snapshot is consistent (its counters add up) and trust, once withdrawn, is withdrawn for every later request.
"""

from __future__ import annotations

import enum
import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyfront.hashing import HashConfig
from pyfront.hashing.wire import BlobError, unpack_block_hashes

logger = logging.getLogger("vllm.pyfront_feh")
"""A child of vLLM's "vllm" logger, so the lines show in the engine's log with vLLM's format and level."""

SWITCH_ENV = "PYFRONT_ENGINE_FEH"
"""The engine-side switch: the plugin patches nothing unless it is 1 (or true/yes/on)."""
VERIFY_ENV = "PYFRONT_ENGINE_FEH_VERIFY"
"""Fraction of shipped blobs the engine recomputes and compares (0..1); the first one is always checked."""
SALT_ENV = "PYFRONT_ENGINE_FEH_SALT"
"""`feh1` (default): the engine hashes salted prompts with feh1's untagged salt key and accepts salted blobs;
`stock`: the engine's hashing stays vLLM's bit for bit and salted blobs are refused."""
DEFAULT_VERIFY_FRACTION = 0.01

Hasher = Callable[[Any], list[bytes]]
"""vLLM's request block hasher: Request -> the digests of its new full blocks."""


class SaltMode(enum.StrEnum):
    FEH1 = "feh1"
    STOCK = "stock"


class Fallback(enum.StrEnum):
    """Why a request's shipped blob was not used (the keys of the `fallbacks` counter).

    The blob-format kinds are `pyfront.hashing.wire.BlobError`'s; the others are the engine's own rules.
    """

    TYPE = "type"  # not bytes (nil means "no blob", not a fallback)
    SHORT = "short"
    MAGIC = "magic"
    BLOCK_SIZE = "block_size"
    LENGTH = "length"
    COUNT = "count"
    INELIGIBLE = "ineligible"  # LoRA, multimodal, prompt embeddings, resumable: feh1 does not model them
    SALTED = "salted"  # salt mode `stock`: the engine's salted hashes are not feh1's
    INACTIVE = "inactive"  # this engine did not advertise FEH (prefix caching off, another algorithm, ...)
    DISTRUSTED = "distrusted"  # an earlier blob failed verification


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Settings:
    """The plugin's switches, read once from the engine's environment."""

    enabled: bool
    verify_fraction: float = DEFAULT_VERIFY_FRACTION
    salt_mode: SaltMode = SaltMode.FEH1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """ValueError for a value the plugin cannot take at its word: with the switch on, a typo in the
        other two must not silently pick a default the operator did not ask for."""
        enabled = _flag(environ.get(SWITCH_ENV, "0"))
        raw_fraction = environ.get(VERIFY_ENV, "").strip()
        try:
            fraction = float(raw_fraction) if raw_fraction else DEFAULT_VERIFY_FRACTION
        except ValueError:
            raise ValueError(f"{VERIFY_ENV}={raw_fraction!r} is not a number") from None
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"{VERIFY_ENV}={raw_fraction!r} is not a fraction between 0 and 1")
        raw_salt = environ.get(SALT_ENV, SaltMode.FEH1.value).strip().lower()
        try:
            salt_mode = SaltMode(raw_salt)
        except ValueError:
            raise ValueError(f"{SALT_ENV}={raw_salt!r}: expected one of {[m.value for m in SaltMode]}") from None
        return cls(enabled, fraction, salt_mode)


class Verdict(NamedTuple):
    """What to do with one request's blob.

    `hashes` is None when the engine must hash the prompt itself; `verify` says to hash it anyway and
    compare with `hashes`; `fallback` names the rule a present but unusable blob broke.
    """

    hashes: list[bytes] | None
    verify: bool = False
    fallback: Fallback | None = None


NO_BLOB = Verdict(None)


class FehState:
    """The engine's FEH state: the advertised config, trust, the verification sampler and the counters."""

    def __init__(self, settings: Settings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._rng = rng if rng is not None else random.Random()
        self._config: HashConfig | None = None
        self._salted_hashers: tuple[Hasher, Hasher] | None = None
        self._inactive_reason = "the engine has not sent its registration yet"
        self._trusting = True
        self._verified_once = False
        self._counts: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()

    # --- lifecycle -------------------------------------------------------------------------------------

    def activate(self, config: HashConfig, salted_hashers: tuple[Hasher, Hasher] | None = None) -> None:
        """The engine advertised `config`: from now on blobs that match it may be used.

        `salted_hashers` is (the engine's block hasher, its feh1-salted copy) in salt mode feh1, None in
        salt mode stock; see `hasher_for`.
        """
        with self._lock:
            self._config = config
            self._salted_hashers = salted_hashers

    def stay_inactive(self, reason: str) -> None:
        """The engine advertised nothing; `reason` goes into the stats (the log line says it once)."""
        with self._lock:
            self._config = None
            self._salted_hashers = None
            self._inactive_reason = reason

    @property
    def config(self) -> HashConfig | None:
        with self._lock:
            return self._config

    def hasher_for(self, block_hasher: Hasher, salted: bool) -> Hasher:
        """The block hasher a request gets: the feh1-salted copy of the engine's hasher for a salted request
        while FEH is advertised in salt mode feh1, else `block_hasher` itself.

        Unsalted requests keep the engine's own hasher because for them the salt rewrite changes nothing
        and would only cost a call per block; an engine that advertises nothing keeps vLLM's hashing exactly.
        """
        if not salted:
            return block_hasher
        with self._lock:
            pair = self._salted_hashers
        return pair[1] if pair is not None and pair[0] is block_hasher else block_hasher

    # --- per request -----------------------------------------------------------------------------------

    def judge(self, blob: object, num_prompt_tokens: int, eligible: bool, salted: bool) -> Verdict:
        """The verdict on one ADD's `prompt_block_hashes` (None when the request carried none).

        The order of the checks is the order of their cost and of their meaning: a request the recipe
        does not cover, or an engine that never offered FEH, falls back whatever the bytes say; then the
        bytes are parsed; a well-formed blob is used unless trust was withdrawn. `eligible` is
        negotiation rule 3 (`feh_eligible`) evaluated on the engine's request.
        """
        if blob is None:
            return NO_BLOB
        with self._lock:
            self._counts["blobs_received"] += 1
            fallback = self._rule_fallback(blob, eligible, salted)
            hashes: list[bytes] | None = None
            detail = ""
            if fallback is None:
                assert self._config is not None and isinstance(blob, bytes)  # _rule_fallback checked both
                try:
                    hashes = unpack_block_hashes(blob, self._config.block_size, num_prompt_tokens)
                except BlobError as exc:
                    fallback, detail = Fallback(exc.kind), str(exc)
            else:
                detail = fallback.value
            if fallback is None and not self._trusting:
                fallback, detail = Fallback.DISTRUSTED, "trust was withdrawn after a mismatch"
            if fallback is not None:
                self._fallbacks[fallback.value] += 1
                if self._fallbacks[fallback.value] == 1:  # one line per kind: a broken sender must not flood the log
                    logger.warning(
                        "FEH: shipped block hashes not used (%s); the engine hashes the prompt itself. Further "
                        "fallbacks of this kind are only counted (utility pyfront_feh_stats).",
                        detail,
                    )
                return Verdict(None, fallback=fallback)
            verify = not self._verified_once or self._rng.random() < self.settings.verify_fraction
            self._verified_once = True
            return Verdict(hashes, verify=verify)

    def _rule_fallback(self, blob: object, eligible: bool, salted: bool) -> Fallback | None:
        if self._config is None:
            return Fallback.INACTIVE
        if not isinstance(blob, bytes):
            return Fallback.TYPE
        if not eligible:
            return Fallback.INELIGIBLE
        if salted and self.settings.salt_mode is SaltMode.STOCK:
            return Fallback.SALTED
        return None

    def record_used(self, num_blocks: int) -> None:
        """Shipped hashes became the request's prompt block hashes; the engine hashed none of them."""
        with self._lock:
            self._counts["blobs_used"] += 1
            self._counts["prompt_blocks_shipped"] += num_blocks

    def record_engine_hashed(self, num_blocks: int) -> None:
        """The engine hashed a prompt itself (no blob, or one it did not use)."""
        with self._lock:
            self._counts["prompts_hashed"] += 1
            self._counts["prompt_blocks_hashed"] += num_blocks

    def record_verified(self, request_id: str, shipped: Sequence[bytes], computed: Sequence[bytes]) -> bool:
        """Compare a sampled blob with the engine's own hashes of the same prompt; False on a mismatch.

        A mismatch means the front end hashes something other than what this engine hashes (another
        recipe, none_hash or tokenization of the salt): every later blob from it is suspect, and a wrong
        hash that is *used* shares KV cache between different prompts. So trust is withdrawn for the
        rest of the engine's life, on the first mismatch, and the log says so at ERROR.
        """
        match = list(shipped) == list(computed)
        with self._lock:
            self._counts["blobs_verified"] += 1
            self._counts["prompt_blocks_verified"] += len(computed)
            if match:
                return True
            self._counts["mismatches"] += 1
            first_trusted_loss = self._trusting
            self._trusting = False
        if first_trusted_loss:
            first = next((i for i, (a, b) in enumerate(zip(shipped, computed, strict=False)) if a != b), None)
            logger.error(
                "FEH: the block hashes shipped with request %s differ from the engine's own (%s); the engine "
                "no longer trusts shipped hashes and hashes every prompt itself until it restarts. Check that "
                "the front end and the engine agree on the recipe, none_hash (PYTHONHASHSEED) and salt mode.",
                request_id,
                f"first difference at block {first}"
                if first is not None
                else f"{len(shipped)} vs {len(computed)} blocks",
            )
        return False

    # --- reporting -------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The counters and state, as the `pyfront_feh_stats` utility returns them (msgpack-encodable)."""
        with self._lock:
            config = self._config
            counts = {
                name: self._counts[name]
                for name in (
                    "blobs_received",
                    "blobs_used",
                    "blobs_verified",
                    "mismatches",
                    "prompts_hashed",
                    "prompt_blocks_shipped",
                    "prompt_blocks_hashed",
                    "prompt_blocks_verified",
                )
            }
            return {
                "active": config is not None,
                "inactive_reason": None if config is not None else self._inactive_reason,
                "config": None
                if config is None
                else {
                    "algorithm": config.algorithm,
                    "block_size": config.block_size,
                    "none_hash": config.none_hash.hex(),
                },
                "salt_mode": self.settings.salt_mode.value,
                "verify_fraction": self.settings.verify_fraction,
                "trusting": self._trusting,
                **counts,
                "fallbacks": dict(sorted(self._fallbacks.items())),
            }
