"""The lean tokenizer load: serve from the ``tokenizers`` backend transformers built, without importing transformers.

Why: transformers is most of pyfront's start-up and a fifth of its memory. Importing it takes ~0.75 s, AutoTokenizer
scans every model folder of transformers to resolve a class (~0.25 s), and the Qwen2 tokenizer class parses
tokenizer.json in Python and rebuilds its BPE (~0.4 s); the import alone is ~29 MB. What pyfront needs of a loaded
tokenizer is small: the Rust backend (encode, decode, the vocabulary), the special tokens, the chat templates. The
backend is not simply tokenizer.json: transformers 5's model classes rebuild it (``Qwen2Tokenizer`` sets its own
pre-tokenizer, normalizer and decoder, and ``TokenizersBackend`` its added tokens and post-processor), so reading
tokenizer.json with ``tokenizers`` alone could tokenize differently from vLLM, which loads with transformers.

So the backend is taken from transformers, once. The first start on a tokenizer loads it with transformers as
always, then writes a **snapshot** (:class:`SnapshotStore`): the backend transformers built, serialized by
``tokenizers`` itself, and the facts pyfront reads off the transformers object (special tokens, ids, templates), after
checking that :class:`LeanTokenizer` over that snapshot answers every call pyfront makes exactly as the transformers
object does (:func:`verify`: the serialization round trip, encodes, decodes, conversions, special tokens, and that
no method pyfront calls is overridden by the tokenizer's class). A later start finds the snapshot by a key over
everything the result depends on (the tokenizer files' contents, the chat template given on the command line, the
versions of transformers, tokenizers, jinja2 and Python, and the source of the modules that decide exactness) and
loads it with ``tokenizers`` alone. A snapshot that cannot be trusted is never written: the reason is recorded
instead, and that tokenizer keeps loading with transformers (logged once per start).

The other start-up checks pyfront runs on a tokenizer (the segment cache's equivalence test, the fast chat render's
comparison with ``apply_chat_template``) are deterministic functions of the same inputs, so their verdicts are kept
in the snapshot as well and a lean start does not repeat them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1
"""Bumped when what a snapshot holds, or how it is read, changes."""

MAX_SNAPSHOTS = 16
"""Snapshots kept in the store (the least recently used beyond it are deleted)."""

SOURCE_MODULES = ("lean.py", "tokenizer.py", "segment_cache.py", "chat_template.py")
"""The modules whose source is part of the key: they decide what a snapshot holds and which checks it passed."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".npz", ".ot")
"""Files of a model directory that no tokenizer reads: left out of the key (they can be gigabytes)."""

CALLED_METHODS = (
    "encode",
    "_encode_plus",
    "decode",
    "_decode",
    "convert_ids_to_tokens",
    "convert_tokens_to_ids",
    "_convert_token_to_id_with_added_voc",
    "get_added_vocab",
    "added_tokens_decoder",
    "special_tokens_map",
    "all_special_tokens",
    "all_special_ids",
    "__len__",
    "apply_chat_template",
    "get_chat_template",
)
"""What pyfront calls on a transformers tokenizer: a class that overrides one of them is not snapshotted (its answers
would come from code :class:`LeanTokenizer` does not have)."""


class TokenizerFacts(msgspec.Struct, forbid_unknown_fields=True):
    """What pyfront reads off a transformers tokenizer besides its backend, and the verdicts of the start-up checks
    that ran on it."""

    name_or_path: str
    length: int
    """``len(tokenizer)``: the vocabulary with the added tokens."""
    special_tokens_map: dict[str, Any]
    all_special_tokens: list[str]
    all_special_ids: list[int]
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    chat_template: str | dict[str, str] | None
    segment_reason: str | None
    """The segment cache's verdict (None: exact, on), as ``SegmentTokenizer.reason``."""
    word_reason: str | None
    """The segment cache's per-word path verdict, as ``SegmentTokenizer.word_reason``."""
    fast_chat_reason: str | None
    """Why the fast chat render is off (None: on)."""


class Verdict(msgspec.Struct, forbid_unknown_fields=True):
    """A snapshot's record: the facts (the backend is the file beside it), or why this tokenizer has none."""

    format: int
    facts: TokenizerFacts | None = None
    refused: str | None = None


class LeanTokenizer:
    """The part of transformers' tokenizer interface pyfront uses, over a ``tokenizers.Tokenizer`` and its facts.

    Each method is what ``TokenizersBackend`` / ``PreTrainedTokenizerBase`` (transformers 5) do for one sequence, for
    a class that overrides none of :data:`CALLED_METHODS` and whose decode does no clean-up (:func:`verify` makes sure
    of both before a snapshot is written).
    """

    is_fast = True

    def __init__(self, backend: Any, facts: TokenizerFacts) -> None:
        self._tokenizer = backend
        self.facts = facts
        self.name_or_path = facts.name_or_path
        self.special_tokens_map = facts.special_tokens_map
        self.all_special_tokens = facts.all_special_tokens
        self.all_special_ids = facts.all_special_ids
        self.bos_token_id = facts.bos_token_id
        self.eos_token_id = facts.eos_token_id
        self.unk_token_id = facts.unk_token_id
        self.pad_token_id = facts.pad_token_id
        self.chat_template = facts.chat_template

    @property
    def backend_tokenizer(self) -> Any:
        return self._tokenizer

    def __len__(self) -> int:
        return self.facts.length

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        id_to_token = self._tokenizer.id_to_token
        if isinstance(ids, int):
            return id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        return [id_to_token(int(index)) for index in ids if int(index) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        token_to_id = self._tokenizer.token_to_id
        unk = self.unk_token_id
        if isinstance(tokens, str):
            found = token_to_id(tokens)
            return unk if found is None else found
        return [unk if (found := token_to_id(token)) is None else found for token in tokens]

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tokenizer.get_added_tokens_decoder()

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: index for index, token in sorted(self.added_tokens_decoder.items())}

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)


# ------------------------------------------------------------------ proving a snapshot


def facts_of(
    hf: Any, segment_reason: str | None, word_reason: str | None, fast_chat_reason: str | None
) -> TokenizerFacts:
    """The facts of a transformers tokenizer, as plain data."""
    template = hf.chat_template
    return TokenizerFacts(
        name_or_path=str(getattr(hf, "name_or_path", "") or ""),
        length=len(hf),
        special_tokens_map={key: str(value) for key, value in hf.special_tokens_map.items()},
        all_special_tokens=[str(token) for token in hf.all_special_tokens],
        all_special_ids=[int(index) for index in hf.all_special_ids],
        bos_token_id=hf.bos_token_id,
        eos_token_id=hf.eos_token_id,
        unk_token_id=hf.unk_token_id,
        pad_token_id=hf.pad_token_id,
        chat_template=dict(template) if isinstance(template, Mapping) else template,
        segment_reason=segment_reason,
        word_reason=word_reason,
        fast_chat_reason=fast_chat_reason,
    )


def _overridden(hf: Any) -> str | None:
    """The first of :data:`CALLED_METHODS` the tokenizer's class defines differently from transformers' backend."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if not isinstance(hf, TokenizersBackend):
        return f"{type(hf).__name__} is not a TokenizersBackend"
    for name in CALLED_METHODS:
        if getattr(type(hf), name, None) is not getattr(TokenizersBackend, name, None):
            return f"{type(hf).__name__} overrides {name}"
    return None


def compact_backend_json(backend_json: str) -> str:
    """``backend_json`` with a BPE model's merges written as ``"a b"`` strings instead of ``["a", "b"]`` pairs.

    Why: ``tokenizers`` serializes merges as pairs, and parsing 151k two-element arrays leaves ~3 MB more of the heap
    fragmented for good than the ``"a b"`` form tokenizer.json files ship with (Qwen's: 44.3 against 41.1 MB after
    the load, measured with malloc_trim). The string form is ambiguous only when a merge's part holds a space, so
    such a model is left as it is. The caller proves the result by loading it and comparing its serialization with
    ``backend_json`` (:func:`verify` does); this function only rewrites.
    """
    config = json.loads(backend_json)
    model = config.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return backend_json
    merges = model.get("merges")
    if not isinstance(merges, list) or not all(
        isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) and p and " " not in p for p in m)
        for m in merges
    ):
        return backend_json
    model["merges"] = [f"{a} {b}" for a, b in merges]
    return json.dumps(config, ensure_ascii=False)


def verify(hf: Any, lean: LeanTokenizer, texts: Sequence[str], *, samples: int = 200, seed: int = 0) -> str | None:
    """Why ``lean`` may not stand in for ``hf`` (None: it answers every call pyfront makes as ``hf`` does).

    Checked: the class overrides nothing pyfront calls and its decode does no clean-up; the backend serializes to
    the same JSON; and on ``texts`` (and random id sequences) encode with and without special tokens, decode with and
    without skipping them, the id <-> token conversions, the added vocabulary and every fact.
    """
    problem = _overridden(hf)
    if problem is not None:
        return problem
    if getattr(hf, "split_special_tokens", False):
        return "split_special_tokens is set"
    if hf.clean_up_tokenization_spaces and (
        type(hf.backend_tokenizer.model).__name__ != "BPE"
        or hf.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output
    ):
        return "decode cleans up tokenization spaces"
    if lean.backend_tokenizer.to_str() != hf.backend_tokenizer.to_str():
        return "the backend does not serialize back to the same JSON"
    rng = random.Random(seed)
    size = len(hf)
    added = sorted(hf.added_tokens_decoder)
    special = list(hf.all_special_ids)
    pool = [*added, *special, *(rng.randrange(size) for _ in range(512))]
    sequences = [[rng.choice(pool) for _ in range(rng.randint(1, 12))] for _ in range(samples)]
    sequences += [[rng.randrange(size) for _ in range(rng.randint(1, 24))] for _ in range(samples)]
    sequences += [[index] for index in pool]
    checks: list[tuple[str, Callable[[Any], Any]]] = [
        ("len", len),
        ("vocab_size", lambda t: t.vocab_size),
        ("special_tokens_map", lambda t: t.special_tokens_map),
        ("all_special_tokens", lambda t: t.all_special_tokens),
        ("all_special_ids", lambda t: t.all_special_ids),
        ("token ids", lambda t: (t.bos_token_id, t.eos_token_id, t.unk_token_id, t.pad_token_id)),
        ("get_added_vocab", lambda t: t.get_added_vocab()),
        ("chat_template", lambda t: t.chat_template),
        (
            "convert_tokens_to_ids",
            lambda t: t.convert_tokens_to_ids([*t.all_special_tokens, "\u0000not a token\u0000"]),
        ),
    ]
    for name, check in checks:
        if check(lean) != check(hf):
            return f"{name} differs"
    for text in texts:
        for add_special_tokens in (False, True):
            if lean.encode(text, add_special_tokens=add_special_tokens) != hf.encode(
                text, add_special_tokens=add_special_tokens
            ):
                return f"encode differs on {text[:80]!r}"
    for ids in sequences:
        for skip in (False, True):
            if lean.decode(ids, skip_special_tokens=skip) != hf.decode(ids, skip_special_tokens=skip):
                return f"decode differs on {ids}"
            if lean.convert_ids_to_tokens(ids, skip_special_tokens=skip) != hf.convert_ids_to_tokens(
                ids, skip_special_tokens=skip
            ):
                return f"convert_ids_to_tokens differs on {ids}"
        tokens = hf.convert_ids_to_tokens(ids)
        if lean.convert_tokens_to_ids(tokens) != hf.convert_tokens_to_ids(tokens):
            return f"convert_tokens_to_ids differs on {tokens}"
        if lean.convert_ids_to_tokens(ids[0]) != hf.convert_ids_to_tokens(ids[0]):
            return f"convert_ids_to_tokens differs on {ids[0]}"
    return None


# ------------------------------------------------------------------ the store


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)


class SnapshotStore:
    """Tokenizer snapshots in one directory: ``KEY.json`` (a :class:`Verdict`) and ``KEY.tokenizer.json`` (the
    backend), written atomically (several API server processes may write the same one at once: the last rename
    wins, and both wrote the same bytes)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    @staticmethod
    def default_directory() -> Path:
        """``$PYFRONT_TOKENIZER_SNAPSHOT_DIR``, else ``$PYFRONT_CACHE_DIR/tokenizer-snapshots`` (default
        ``~/.cache/pyfront``, where the bundled tokenizers are built too)."""
        if directory := os.environ.get("PYFRONT_TOKENIZER_SNAPSHOT_DIR"):
            return Path(directory).expanduser()
        cache = os.environ.get("PYFRONT_CACHE_DIR") or str(Path.home() / ".cache" / "pyfront")
        return Path(cache).expanduser() / "tokenizer-snapshots"

    def key(self, tokenizer_dir: Path, chat_template: str | None) -> str | None:
        """The snapshot key of a tokenizer directory (None: it cannot have one, e.g. its files cannot be read)."""
        import jinja2
        import tokenizers

        digest = hashlib.sha256()
        digest.update(f"format {SNAPSHOT_FORMAT}\n".encode())
        versions = (_version("transformers"), tokenizers.__version__, jinja2.__version__, platform.python_version())
        digest.update("transformers {} tokenizers {} jinja2 {} python {}\n".format(*versions).encode())
        digest.update(f"chat_template {chat_template!r}\n".encode())
        here = Path(__file__).parent
        try:
            for module in SOURCE_MODULES:
                digest.update(f"source {module}\n".encode())
                _hash_file(digest, here / module)
            files = sorted(
                path
                for path in [*tokenizer_dir.iterdir(), *tokenizer_dir.glob("additional_chat_templates/*")]
                if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES)
            )
            for path in files:
                digest.update(f"file {path.relative_to(tokenizer_dir)}\n".encode())
                _hash_file(digest, path)
        except OSError as exc:
            logger.info("no tokenizer snapshot for %s: %s", tokenizer_dir, exc)
            return None
        return digest.hexdigest()[:32]

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.directory / f"{key}.json", self.directory / f"{key}.tokenizer.json"

    def load(self, key: str) -> tuple[LeanTokenizer | None, str | None] | None:
        """``(the lean tokenizer, None)``, ``(None, why not)`` for a tokenizer that has no trusted snapshot, or None
        when the store knows nothing of this key (or cannot read it)."""
        verdict_path, backend_path = self._paths(key)
        try:
            verdict = msgspec.json.decode(verdict_path.read_bytes(), type=Verdict)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if verdict.format != SNAPSHOT_FORMAT:
            return None
        if verdict.facts is None:
            return None, verdict.refused or "refused"
        from tokenizers import Tokenizer as RustTokenizer

        try:
            backend = RustTokenizer.from_file(str(backend_path))
        except Exception as exc:  # missing, truncated by a crash, or from another tokenizers build
            logger.warning("tokenizer snapshot %s unreadable (%s): loading with transformers", backend_path, exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(verdict_path)  # recently used: kept when the store is pruned
        return LeanTokenizer(backend, verdict.facts), None

    def save(self, key: str, backend_json: str | None, verdict: Verdict) -> None:
        """Write a snapshot (the backend first: a verdict is never there without its backend); errors are logged."""
        verdict_path, backend_path = self._paths(key)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if backend_json is not None:
                self._write(backend_path, backend_json.encode())
            self._write(verdict_path, msgspec.json.encode(verdict))
            self._prune()
        except OSError as exc:
            logger.warning("cannot write the tokenizer snapshot to %s: %s", self.directory, exc)

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _prune(self) -> None:
        verdicts = sorted(
            (p for p in self.directory.glob("*.json") if not p.name.endswith(".tokenizer.json")),
            key=lambda p: p.stat().st_mtime,
        )
        for old in verdicts[: max(0, len(verdicts) - MAX_SNAPSHOTS)]:
            for path in self._paths(old.name.removesuffix(".json")):
                with contextlib.suppress(OSError):
                    path.unlink()


def main(argv: list[str] | None = None) -> int:
    """``python -m pyfront.server.text.lean MODEL [--chat-template T]``: write the tokenizer snapshot ahead of the first
    start (an image build, a deployment step), as `pyfront serve MODEL` would at its first start; prints what was
    done."""
    import argparse

    from pyfront.server.text.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(prog="python -m pyfront.server.text.lean", description=main.__doc__)
    parser.add_argument("model", help="a model or tokenizer directory, or a bundled tokenizer name")
    parser.add_argument("--chat-template", default=None, help="as `pyfront serve --chat-template`")
    parser.add_argument("--tokenizer-snapshot-dir", default=None, help="as `pyfront serve`'s (default: its default)")
    args = parser.parse_args(argv)
    store = SnapshotStore(args.tokenizer_snapshot_dir or SnapshotStore.default_directory())
    tokenizer = Tokenizer(args.model, chat_template=args.chat_template, snapshots=store)
    print(f"{args.model}: loaded {'without' if tokenizer.mode == 'lean' else 'with'} transformers; snapshot "
          f"{tokenizer.snapshot} ({store.directory})")  # fmt: skip
    return 0 if tokenizer.snapshot in ("written", "loaded") else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
