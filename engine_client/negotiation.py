"""Decide whether front-end block hashing is on, from every engine's registration.

Hashes go out only when `VLLM_NATIVE_FEH=1` and every engine advertised the same
`native_frontend_hash_config` (docs/engine-protocol.md#feh-negotiation, rule 1); otherwise pyfront behaves exactly as a
stock front end and says why in one log line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pyfront.engine_client.protocol import EngineCoreReadyResponse
from pyfront.hashing import HashConfig, default_none_hash

logger = logging.getLogger(__name__)

FEH_ENV = "VLLM_NATIVE_FEH"
ADVERTISEMENT_KEY = "native_frontend_hash_config"


class FehRequest(Protocol):
    """The request fields rule 3 reads: pyfront's EngineCoreRequest and vLLM's own (the engine-side plugin) both fit."""

    @property
    def prompt_token_ids(self) -> object: ...
    @property
    def lora_request(self) -> object: ...
    @property
    def mm_features(self) -> object: ...
    @property
    def prompt_embeds(self) -> object: ...
    @property
    def resumable(self) -> object: ...


def feh_eligible(request: FehRequest) -> bool:
    """Whether front-end block hashes may go with this request: plain token prompts only.

    docs/engine-protocol.md#feh-negotiation, rule 3. The front end applies it before sending hashes, and the
    engine-side plugin (pyfront.engine_client.vllm_plugin) applies it again before using any it receives.

    For LoRA, multimodal, prompt-embedding and resumable requests the engine hashes extra keys that the
    feh1 recipe does not model, so hashes sent for them could share KV cache between different inputs.
    """
    return (
        request.prompt_token_ids is not None
        and request.lora_request is None
        and not request.mm_features
        and request.prompt_embeds is None
        and not request.resumable
    )


def feh_enabled_by_env(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(FEH_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Negotiation:
    """The outcome: a config to hash with, or None and the reason why not."""

    config: HashConfig | None
    reason: str


def _differences(a: HashConfig, b: HashConfig) -> str:
    parts = []
    if a.algorithm != b.algorithm:
        parts.append(f"algorithm {b.algorithm!r} vs {a.algorithm!r}")
    if a.block_size != b.block_size:
        parts.append(f"block_size {b.block_size} vs {a.block_size}")
    if a.none_hash != b.none_hash:
        parts.append(f"none_hash {b.none_hash[:6].hex()}.. vs {a.none_hash[:6].hex()}..")
    return ", ".join(parts)


def negotiate(registrations: Mapping[int, EngineCoreReadyResponse], env_enabled: bool) -> Negotiation:
    """Agree on one hash config across all engines (rank -> registration), or explain why not."""
    if not env_enabled:
        return Negotiation(None, f"{FEH_ENV} is not set to 1: prompts are sent unhashed")
    if not registrations:
        return Negotiation(None, "no engines: prompts are sent unhashed")
    configs: dict[int, HashConfig] = {}
    for rank in sorted(registrations):
        advertised = registrations[rank].feh_config
        if advertised is None:
            return Negotiation(
                None, f"engine rank {rank} does not advertise {ADVERTISEMENT_KEY}: prompts are sent unhashed"
            )
        try:
            configs[rank] = advertised.to_hash_config()
        except ValueError as exc:
            return Negotiation(
                None,
                f"engine rank {rank} advertises an unusable hash config ({exc}): prompts are sent unhashed",
            )
    first_rank = min(configs)
    first = configs[first_rank]
    for rank, config in configs.items():
        if config != first:
            return Negotiation(
                None,
                f"engine rank {rank} advertises a different hash config than rank {first_rank} "
                f"({_differences(first, config)}): prompts are sent unhashed",
            )
    if first.none_hash != default_none_hash():
        # Rule 2: the advertised value wins; a different local value only means another PYTHONHASHSEED.
        logger.info("engines advertise a none_hash other than this process's default; using theirs")
    return Negotiation(
        first, f"all {len(configs)} engine(s) advertise {first.describe()}: prompts are hashed by pyfront"
    )
