"""The lean tokenizer load (server/text/lean.py): a snapshot of what transformers built is written by the first load
and read by later ones without transformers, and the lean tokenizer answers everything pyfront asks exactly as the
transformers tokenizer does, on both bundled tokenizers and on offline tokenizers of other families."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name
from pyfront.server.text.detokenizer import DetokenizerFactory
from pyfront.server.text.lean import (
    MAX_SNAPSHOTS,
    SNAPSHOT_FORMAT,
    LeanTokenizer,
    SnapshotStore,
    Verdict,
    compact_backend_json,
    facts_of,
    verify,
)
from pyfront.server.text.segment_cache import SegmentTokenizer, sample_texts
from pyfront.server.text.tokenizer import Tokenizer
from tests.server.text.test_turn_fast_paths import _random_chat
from tests.tokenizers_offline import STYLES, build_tokenizer

ROOT = Path(__file__).resolve().parents[3]

OFFLINE_TEMPLATE = (
    "{% for m in messages %}{{ bos_token if loop.first else '' }}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)
"""A chat template for the offline tokenizers (they have none), reading the special tokens map."""


@cache
def offline_dir(style: str) -> str:
    directory = tempfile.mkdtemp(prefix=f"pyfront-lean-{style}-")
    build_tokenizer(style).save_pretrained(directory)
    return directory


NAMES = ["pyfront/qwen3-tokenizer", "pyfront/qwen3.6-tokenizer", *(f"offline:{s}" for s in (*STYLES, "single_word"))]


def _load(name: str, store: SnapshotStore | None) -> Tokenizer:
    if name.startswith("offline:"):
        return Tokenizer(offline_dir(name.removeprefix("offline:")), chat_template=OFFLINE_TEMPLATE, snapshots=store)
    return Tokenizer(name, snapshots=store)


@pytest.fixture(scope="module", params=NAMES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Tokenizer]:
    """(the transformers load that wrote the snapshot, the lean load that read it)."""
    store = SnapshotStore(tmp_path_factory.mktemp("snapshots"))
    full = _load(request.param, store)
    lean = _load(request.param, store)
    assert (full.mode, full.snapshot) == ("transformers", "written")
    assert (lean.mode, lean.snapshot) == ("lean", "loaded")
    assert isinstance(lean.hf, LeanTokenizer)
    return full, lean


def test_encode_decode_and_conversions_are_transformers(pair: tuple[Tokenizer, Tokenizer]) -> None:
    full, lean = pair
    hf, ours = full.hf, lean.hf
    rng = random.Random(5)
    added = list(hf.get_added_vocab())
    for text in sample_texts(added, samples=400, seed=7):
        for special in (False, True):
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
        assert lean.encode(text) == full.encode(text)
        assert lean.segments.encode(text) == full.segments.encode(text) == hf.encode(text, add_special_tokens=False)
    size = len(hf)
    pool = [*sorted(hf.added_tokens_decoder), *hf.all_special_ids]
    for _ in range(400):
        ids = [rng.choice(pool) if rng.random() < 0.3 else rng.randrange(size) for _ in range(rng.randint(1, 30))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
            assert ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) == hf.convert_ids_to_tokens(
                ids, skip_special_tokens=skip
            )
        assert lean.decode(ids) == full.decode(ids)
    every = list(range(size))
    tokens = hf.convert_ids_to_tokens(every)
    assert ours.convert_ids_to_tokens(every) == tokens
    assert ours.convert_tokens_to_ids([*tokens, "\u0000no such token", ""]) == hf.convert_tokens_to_ids(
        [*tokens, "\u0000no such token", ""]
    )
    for token in [*added, "</think>", "<tool_call>", "nope\u0000"]:
        assert lean.token_id(token) == full.token_id(token)
    assert ours.decode(pool[0]) == hf.decode(pool[0])
    assert ours.convert_ids_to_tokens(pool[0]) == hf.convert_ids_to_tokens(pool[0])


def test_facts_and_settings_are_transformers(pair: tuple[Tokenizer, Tokenizer]) -> None:
    full, lean = pair
    hf, ours = full.hf, lean.hf
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.all_special_tokens == hf.all_special_tokens
    assert ours.all_special_ids == hf.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id, ours.pad_token_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.unk_token_id,
        hf.pad_token_id,
    )
    assert len(ours) == len(hf) and ours.vocab_size == hf.vocab_size
    assert ours.get_added_vocab() == hf.get_added_vocab()
    assert ours.get_vocab() == hf.get_vocab()
    assert ours.chat_template == hf.chat_template
    assert ours.backend_tokenizer.to_str() == hf.backend_tokenizer.to_str()
    for attr in ("vocab_size", "eos_token_id", "extra_eos_token_ids", "generation_defaults", "has_chat_template"):
        assert getattr(lean, attr) == getattr(full, attr), attr
    assert lean.chat_template_source() == full.chat_template_source()
    # The start-up checks' verdicts came with the snapshot, not from running them again.
    assert (lean.segments.supported, lean.segments.reason, lean.segments.word_reason) == (
        full.segments.supported,
        full.segments.reason,
        full.segments.word_reason,
    )
    assert lean.fast_chat_reason is full.fast_chat_reason is None


def test_chats_render_and_tokenize_as_transformers(pair: tuple[Tokenizer, Tokenizer]) -> None:
    full, lean = pair
    rng = random.Random(23)
    rendered = 0
    for _ in range(150):
        case = _random_chat(rng)
        kwargs = {
            k: case[k] for k in ("tools", "documents", "chat_template_kwargs", "add_generation_prompt") if k in case
        }
        try:
            expected = full.hf.apply_chat_template(
                case["messages"],
                tools=case.get("tools"),
                documents=case.get("documents"),
                add_generation_prompt=case.get("add_generation_prompt", True),
                tokenize=False,
                **(case.get("chat_template_kwargs") or {}),
            )
        except Exception:
            continue
        text, ids = lean.tokenize_chat(case["messages"], **kwargs)
        assert text == expected
        assert ids == full.hf.encode(expected, add_special_tokens=False)
        rendered += 1
    assert rendered > 100
    assert lean._transformers_hf is None  # all of it without transformers


def test_streamed_detokenization_and_logprob_strings_are_the_same(pair: tuple[Tokenizer, Tokenizer]) -> None:
    full, lean = pair
    theirs, ours = DetokenizerFactory(full.hf), DetokenizerFactory(lean.hf)
    assert ours.fast and theirs.fast
    rng = random.Random(3)
    size = len(full.hf)
    for _ in range(100):
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 40))]
        for skip in (False, True):
            a = theirs.detokenizer(skip_special_tokens=skip, prompt_tail=ids[:3])
            b = ours.detokenizer(skip_special_tokens=skip, prompt_tail=ids[:3])
            assert [a.push(i) for i in ids[3:]] + [a.flush()] == [b.push(i) for i in ids[3:]] + [b.flush()]
        for index in ids:
            assert ours.token_text(index) == theirs.token_text(index)
            assert ours.decoded_token(index, ids[:4]) == theirs.decoded_token(index, ids[:4])


def test_a_chat_the_fast_render_does_not_take_renders_with_transformers_loaded_then(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    full = Tokenizer("pyfront/qwen3-tokenizer", snapshots=store)
    lean = Tokenizer("pyfront/qwen3-tokenizer", snapshots=store)
    assert lean.mode == "lean" and lean._transformers_hf is None
    messages = [{"role": "user", "content": "Hi"}]
    kwargs = {"chat_template_kwargs": {"return_dict": False}}  # a wrapper parameter: transformers' to take
    assert lean.render_chat(messages, **kwargs) == full.render_chat(messages, **kwargs)
    assert lean._transformers_hf is not None and lean.mode == "lean"
    assert lean.render_chat(messages) == full.render_chat(messages)


def test_a_lean_start_does_not_import_transformers(tmp_path: Path) -> None:
    full = Tokenizer("pyfront/qwen3-tokenizer", snapshots=SnapshotStore(tmp_path))
    expected = len(full.tokenize_chat([{"role": "user", "content": "Hello!"}])[1])
    code = (
        "import sys\n"
        "from pyfront.server.text.lean import SnapshotStore\n"
        "from pyfront.server.text.tokenizer import Tokenizer\n"
        f"tok = Tokenizer('pyfront/qwen3-tokenizer', snapshots=SnapshotStore({str(tmp_path)!r}))\n"
        "text, ids = tok.tokenize_chat([{'role': 'user', 'content': 'Hello!'}])\n"
        "print(tok.mode, 'transformers' in sys.modules, len(ids))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["lean", "False", str(expected)]


def test_the_key_follows_every_input(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    source = Path(resolve_tokenizer_name("pyfront/qwen3-tokenizer"))
    copy = tmp_path / "tok"
    copy.mkdir()
    for path in source.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    key = store.key(copy, None)
    assert key is not None and key == store.key(copy, None)
    assert store.key(copy, "{{ messages }}") not in (None, key)
    (copy / "model.safetensors").write_bytes(b"weights are not read by a tokenizer")
    assert store.key(copy, None) == key
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 12345
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    changed = store.key(copy, None)
    assert changed not in (None, key)
    (copy / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert store.key(copy, None) not in (None, key, changed)


def test_a_refused_tokenizer_keeps_loading_with_transformers(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    name = offline_dir("llama2")
    key = store.key(Path(name), None)
    assert key is not None
    store.save(key, None, Verdict(SNAPSHOT_FORMAT, refused="a test says no"))
    for _ in range(2):
        tok = Tokenizer(name, snapshots=store)
        assert (tok.mode, tok.snapshot) == ("transformers", "refused: a test says no")


def test_verify_finds_what_differs() -> None:
    hf = build_tokenizer("llama2")
    from tokenizers import Tokenizer as RustTokenizer

    def lean() -> LeanTokenizer:
        return LeanTokenizer(RustTokenizer.from_str(hf.backend_tokenizer.to_str()), facts_of(hf, None, None, None))

    texts = sample_texts(list(hf.get_added_vocab()), samples=50, seed=1)
    assert verify(hf, lean(), texts) is None
    broken = lean()
    broken.decode = lambda ids, skip_special_tokens=False: "x"  # type: ignore[method-assign]
    assert (verify(hf, broken, texts) or "").startswith("decode differs")
    broken = lean()
    broken.all_special_ids = [*broken.all_special_ids, 7]
    assert verify(hf, broken, texts) == "all_special_ids differs"
    other = lean()
    other._tokenizer.add_tokens(["zzz-new"])
    assert verify(hf, other, texts) == "the backend does not serialize back to the same JSON"

    class Overriding(type(hf)):  # type: ignore[misc]
        def decode(self, *args: Any, **kwargs: Any) -> Any:
            return super().decode(*args, **kwargs)

    hf.__class__ = Overriding
    try:
        assert verify(hf, lean(), texts) == "Overriding overrides decode"
    finally:
        hf.__class__ = Overriding.__mro__[1]


def test_an_unreadable_snapshot_is_written_again(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    Tokenizer("pyfront/qwen3-tokenizer", snapshots=store)
    (backend,) = tmp_path.glob("*.tokenizer.json")
    backend.write_text(backend.read_text()[:1000])  # a crash mid-write of an older pyfront, or a damaged disk
    again = Tokenizer("pyfront/qwen3-tokenizer", snapshots=store)
    assert (again.mode, again.snapshot) == ("transformers", "written")
    assert Tokenizer("pyfront/qwen3-tokenizer", snapshots=store).mode == "lean"


def test_the_store_keeps_the_most_recent_snapshots(tmp_path: Path) -> None:
    import os

    store = SnapshotStore(tmp_path)
    for i in range(MAX_SNAPSHOTS + 3):
        store.save(f"k{i:02d}", "{}", Verdict(SNAPSHOT_FORMAT, refused="r"))
        stamp = 1_000_000 + i
        os.utime(tmp_path / f"k{i:02d}.json", (stamp, stamp))
    verdicts = sorted(p.name for p in tmp_path.glob("*.json") if not p.name.endswith(".tokenizer.json"))
    assert len(verdicts) == MAX_SNAPSHOTS
    assert verdicts[0] == "k03.json"
    assert not (tmp_path / "k00.tokenizer.json").exists()


def test_an_unwritable_store_only_costs_the_snapshot(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    tok = Tokenizer("pyfront/qwen3-tokenizer", snapshots=SnapshotStore(blocker / "snapshots"))
    assert tok.mode == "transformers"
    assert tok.tokenize_chat([{"role": "user", "content": "Hi"}])[1]


@pytest.mark.parametrize("name", NAMES)
def test_the_backend_config_is_the_serialization(name: str) -> None:
    """SegmentTokenizer reads the backend's components instead of serializing it whole: the same JSON."""
    tok = _load(name, None)
    backend = tok.hf.backend_tokenizer
    whole = json.loads(backend.to_str())
    parts = SegmentTokenizer.backend_config(backend)
    for component in ("normalizer", "pre_tokenizer", "post_processor"):
        assert parts[component] == whole[component], component
    assert parts["model"] == {"type": whole["model"]["type"], "dropout": whole["model"].get("dropout")}
    assert parts["added_tokens"] == [
        {"id": t["id"], "content": t["content"], "normalized": t["normalized"]} for t in whole["added_tokens"]
    ]


@pytest.mark.parametrize("name", NAMES)
def test_the_snapshot_holds_compact_merges_that_load_back_to_the_same_backend(name: str) -> None:
    """A byte-level BPE's merges are stored as "a b" strings (the form tokenizer.json files ship with; less heap
    left fragmented by the load) and load back to a backend that serializes exactly as transformers' does."""
    from tokenizers import Tokenizer as RustTokenizer

    tok = _load(name, None)
    original = tok.hf.backend_tokenizer.to_str()
    compact = compact_backend_json(original)
    assert RustTokenizer.from_str(compact).to_str() == original
    model = json.loads(original)["model"]
    stored = json.loads(compact)["model"]["merges"] if model["type"] == "BPE" else None
    if name.startswith("pyfront/"):  # byte-level BPE: no merge part holds a space
        assert stored is not None and all(isinstance(m, str) for m in stored)
        assert [m.split(" ") for m in stored] == model["merges"]
    elif model["type"] != "BPE":
        assert compact == original


def test_merges_with_a_space_are_left_as_pairs() -> None:
    """Merges as "a b" strings would be ambiguous when a part holds a space (a BPE without byte-level or
    Metaspace pre-tokenization may have such tokens)."""
    config = {"model": {"type": "BPE", "vocab": {}, "merges": [["a b", "c"], ["d", "e"]]}}
    text = json.dumps(config)
    assert compact_backend_json(text) == text
    config["model"]["merges"] = [["a", "b"], ["ab", "c"]]
    assert json.loads(compact_backend_json(json.dumps(config)))["model"]["merges"] == ["a b", "ab c"]
    unigram = json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})
    assert compact_backend_json(unigram) == unigram


def test_a_snapshot_can_be_written_ahead_of_the_first_start(tmp_path: Path) -> None:
    """`python -m pyfront.server.text.lean MODEL` (the docker image runs it for the bundled tokenizer)."""
    command = [sys.executable, "-m", "pyfront.server.text.lean", "pyfront/qwen3-tokenizer", "--tokenizer-snapshot-dir"]
    first = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert "loaded with transformers; snapshot written" in first.stdout
    second = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert second.returncode == 0 and "loaded without transformers; snapshot loaded" in second.stdout
