"""The token facade: one loaded tokenizer, its chat template, EOS ids and generation defaults.

Everything here is synchronous and may be slow (rendering a long chat, tokenizing 100k tokens): the
server calls it on its render pool, and on the event loop only for small bodies (chat.render.INLINE_RENDER_MAX_BYTES).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name
from pyfront.server.text.chat_template import ChatRender, NotVerified
from pyfront.server.text.detokenizer import get_factory
from pyfront.server.text.lean import (
    SNAPSHOT_FORMAT,
    LeanTokenizer,
    SnapshotStore,
    Verdict,
    compact_backend_json,
    facts_of,
    verify,
)
from pyfront.server.text.segment_cache import PromptTokens, SegmentTokenizer, sample_texts

logger = logging.getLogger(__name__)


GENERATION_CONFIG_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)
"""The ``generation_config.json`` keys vLLM takes request defaults from (``get_diff_sampling_param``)."""


def generation_defaults_from_config(generation_config: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``ModelConfig.get_diff_sampling_param`` for ``--generation-config auto``.

    The non-null sampling keys of the model's ``generation_config.json`` (plus overrides the caller
    merged in), with ``max_new_tokens`` renamed to ``max_tokens``: the one list of those keys (the
    server's :class:`~pyfront.server.tokenizer.Tokenizer` builds its defaults with it). Pass the result as
    :func:`build_sampling_params`' ``generation_defaults``.
    """
    out = {key: generation_config[key] for key in GENERATION_CONFIG_KEYS if generation_config.get(key) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


class ChatTokenizer(Protocol):
    """What the server uses of its tokenizer: `Tokenizer` is one, and a test may hand the server another.

    The handlers, the chat renderer and the sampling-parameter builder see only these members;
    `hf` (transformers' tokenizer, or the `LeanTokenizer` that answers as it does) feeds the detokenizer and the
    logprob formatting, which need the full vocabulary anyway.
    """

    name: str
    hf: Any
    vocab_size: int
    eos_token_id: int | None
    extra_eos_token_ids: list[int]
    generation_defaults: dict[str, Any]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def token_id(self, token: str) -> int | None:
        """The id of a token given as text (e.g. ``</think>``), or None."""
        ...

    def tokenize_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
        """The rendered prompt and its ids (chat template applied); raises TokenizerError for a 400."""
        ...

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The rendered prompt (chat template applied); raises TokenizerError for a 400."""
        ...

    def tokenize_prompt(self, text: str, previous: PromptTokens | None) -> PromptTokens:
        """A rendered prompt's ids (no special tokens added), reusing those of the prefix it shares with
        ``previous`` (same ids as without it)."""
        ...


class TokenizerError(ValueError):
    """The request cannot be rendered or tokenized (bad messages, template error): a 400."""


VERIFIED_TRANSFORMERS = ("5.24.", "5.25.")
"""transformers releases whose apply_chat_template was read line by line against server/text/chat_template.py; with
others, chats render through apply_chat_template itself."""


REBUILD_INPUTS = ("_vocab", "_merges")
"""What transformers 5's model tokenizer classes keep after building their backend from it: ``Qwen2Tokenizer``,
``LlamaTokenizer`` and others store the vocab dict and the merges list they hand to ``tokenizers``' BPE (151k entries
each for Qwen: ~46 MB of Python objects, a quarter of the server's memory)."""


def _code_reads(code: Any, names: frozenset[str]) -> bool:
    """Whether a code object (or one nested in it) names one of ``names`` (an attribute, or a string constant as in
    ``getattr(self, "_vocab")``)."""
    if names.intersection(code.co_names):
        return True
    return any(
        (isinstance(const, str) and const in names) or (hasattr(const, "co_names") and _code_reads(const, names))
        for const in code.co_consts
    )


def release_rebuild_inputs(hf: Any) -> str:
    """Drop :data:`REBUILD_INPUTS` from a loaded tokenizer when nothing can read them again; say what was done.

    Exact: the backend was built from them and holds its own Rust copy (``BPE(vocab, merges)`` converts them), so
    encode, decode and the vocabulary are the backend's either way. They are dropped only when no method of the
    tokenizer's classes but ``__init__`` names them (checked on the code, so a class that reads them later, as
    transformers' ``WhisperTokenizer.save_vocabulary`` and ``LayoutXLMTokenizer._get_token_id`` do, keeps them), and
    pyfront itself never reads them.
    """
    present = [name for name in REBUILD_INPUTS if name in vars(hf)]
    if not present:
        return "nothing to release"
    names = frozenset(present)
    for cls in type(hf).__mro__:
        for attr_name, attr in vars(cls).items():
            if attr_name == "__init__":
                continue
            funcs = (
                (attr.fget, attr.fset, attr.fdel) if isinstance(attr, property) else (getattr(attr, "__func__", attr),)
            )
            for func in funcs:
                code = getattr(func, "__code__", None)
                if code is not None and _code_reads(code, names):
                    return f"kept {', '.join(present)}: {cls.__name__}.{attr_name} reads them"
    sizes = ", ".join(f"{name} ({len(vars(hf)[name])} entries)" for name in present)
    for name in present:
        delattr(hf, name)
    return f"released {sizes}"


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Tokenizer:
    """A Hugging Face tokenizer loaded offline, plus what the server needs to know about the model.

    Loaded one of two ways (``mode``): ``"transformers"`` (AutoTokenizer), or ``"lean"``, from a snapshot of what
    transformers built for the same files (server/text/lean.py), without importing transformers. With a
    ``snapshots`` store, a transformers load writes the snapshot a later start loads lean; without one (tests,
    library use), every load is a transformers load.
    """

    def __init__(
        self,
        name_or_path: str,
        *,
        chat_template: str | None = None,
        model_dir: str | None = None,
        generation_config: str = "auto",
        snapshots: SnapshotStore | None = None,
    ) -> None:
        """``generation_config``: where request defaults come from, as vLLM's ``--generation-config``: ``auto``
        (the model directory's generation_config.json), ``vllm`` (none), or a directory holding one."""
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.name = name_or_path
        self._path = resolve_tokenizer_name(name_or_path)
        self._template_override: str | None = None
        if chat_template is not None:
            template_path = Path(chat_template)
            self._template_override = template_path.read_text() if template_path.is_file() else chat_template
        self._transformers_hf: Any = None
        self._transformers_lock = threading.Lock()
        self.mode = "transformers"
        self.snapshot: str = "no snapshot store"
        """What became of the tokenizer snapshot at start-up: loaded, written, refused and why, or none."""
        key = None
        if snapshots is not None and Path(self._path).is_dir():
            key = snapshots.key(Path(self._path), self._template_override)
        loaded = snapshots.load(key) if snapshots is not None and key is not None else None
        self.hf: Any
        if loaded is not None and loaded[0] is not None:
            self._load_lean(loaded[0])
        else:
            self._load_transformers()
            if loaded is not None:  # a snapshot was refused for this tokenizer before: its reason
                self.snapshot = f"refused: {loaded[1]}"
                logger.info("tokenizer %s loads with transformers: its snapshot was refused (%s)", self.name, loaded[1])
            elif snapshots is not None and key is not None:
                self.snapshot = self._write_snapshot(snapshots, key)
        self.vocab_size = len(self.hf)
        self.eos_token_id: int | None = self.hf.eos_token_id
        config_dir = Path(model_dir or self._path)
        generation = _load_json(config_dir / "generation_config.json") if config_dir.is_dir() else {}
        eos = generation.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.eos_token_id is None and eos_ids:
            self.eos_token_id = eos_ids[0]
        self.extra_eos_token_ids = [t for t in eos_ids if t != self.eos_token_id]
        if generation_config == "vllm":
            source: dict[str, Any] = {}
        elif generation_config == "auto":
            source = generation
        else:
            source = _load_json(Path(generation_config) / "generation_config.json")
        self.generation_defaults = generation_defaults_from_config(source)
        """Request defaults (vLLM's ``get_diff_sampling_param``); the model's EOS ids come from its own file."""

    def _load_transformers(self) -> None:
        self.hf = self._transformers_tokenizer()
        if not getattr(self.hf, "is_fast", False):
            logger.warning("tokenizer %s is not a fast tokenizer: detokenization will be slower", self.name)
        self.has_chat_template = bool(getattr(self.hf, "chat_template", None))
        # Chat prompts re-send the whole history every turn: tokenize the text between added tokens once per
        # distinct segment (exact, checked at start-up; falls back to plain encode where it would not be).
        # The backend is shared, not copied (~120 MB for Qwen): the server never asks for truncation or padding,
        # so transformers never changes the backend's settings under the cache's feet.
        self.segments = SegmentTokenizer(self.hf, share_backend=True)
        self.released = release_rebuild_inputs(self.hf)
        """What :func:`release_rebuild_inputs` did with the Python copies of the vocab and merges."""
        logger.debug("tokenizer %s: %s", self.name, self.released)
        self._fast_chat: ChatRender | None = None
        self.fast_chat_reason: str | None = None
        """Why the fast chat render is off (None when it is on)."""
        self._enable_fast_chat()
        self._warm_up()

    def _load_lean(self, lean: LeanTokenizer) -> None:
        facts = lean.facts
        self.hf = lean
        self.mode = "lean"
        self.snapshot = "loaded"
        logger.info("tokenizer %s loaded from its snapshot, without transformers", self.name)
        self.has_chat_template = bool(facts.chat_template)
        self.segments = SegmentTokenizer(lean, share_backend=True, verdict=(facts.segment_reason, facts.word_reason))
        self.released = "nothing to release"
        self._fast_chat = ChatRender(facts.chat_template, facts.special_tokens_map)
        self.fast_chat_reason = None
        self._warm_up()

    def _transformers_tokenizer(self) -> Any:
        """The tokenizer as transformers loads it (in lean mode, loaded the first time something needs it)."""
        with self._transformers_lock:
            if self._transformers_hf is None:
                from transformers import AutoTokenizer  # slow import: only at start-up, or never in lean mode

                try:
                    hf = AutoTokenizer.from_pretrained(self._path, local_files_only=True)
                except Exception as exc:
                    raise RuntimeError(f"cannot load the tokenizer {self.name!r} offline: {exc}") from exc
                if self._template_override is not None:
                    hf.chat_template = self._template_override
                self._transformers_hf = hf
            return self._transformers_hf

    def _warm_up(self) -> None:
        # The detokenizer's check of its byte-level rule (a probe of a few hundred decodes) runs now, not in the
        # first request.
        get_factory(self.hf).stream_prefill((), skip_special_tokens=True)
        if self.has_chat_template:
            # Compile the template now: the first chat requests would otherwise pay for it (tens of ms).
            with contextlib.suppress(Exception):
                self.render_chat([{"role": "user", "content": "warm-up"}])

    def _write_snapshot(self, snapshots: SnapshotStore, key: str) -> str:
        """Check that a lean load would answer as this transformers load does; write the snapshot, or the reason
        there is none. Returns what was done (also logged)."""
        from tokenizers import Tokenizer as RustTokenizer

        hf = self.hf
        refused = None
        backend_json = None
        try:
            if self.fast_chat_reason is not None:
                refused = f"the fast chat render is off: {self.fast_chat_reason}"
            else:
                # The snapshot holds the compact form; verify() proves it loads back to this backend's JSON.
                backend_json = compact_backend_json(hf.backend_tokenizer.to_str())
                facts = facts_of(hf, self.segments.reason, self.segments.word_reason, self.fast_chat_reason)
                lean = LeanTokenizer(RustTokenizer.from_str(backend_json), facts)
                texts = sample_texts(list(lean.get_added_vocab()), samples=200, seed=0)
                for case in _FAST_CHAT_SAMPLES:
                    with contextlib.suppress(TokenizerError):
                        texts.append(self.render_chat(**_render_kwargs(case)))
                refused = verify(hf, lean, texts)
        except Exception as exc:  # a tokenizer this code does not know: no snapshot, and why
            refused = f"check failed: {type(exc).__name__}: {exc}"
        if refused is not None:
            snapshots.save(key, None, Verdict(SNAPSHOT_FORMAT, refused=refused))
            logger.info("tokenizer %s: no snapshot (%s); it loads with transformers", self.name, refused)
            return f"refused: {refused}"
        snapshots.save(key, backend_json, Verdict(SNAPSHOT_FORMAT, facts=facts))
        logger.info("tokenizer %s: snapshot written; later starts load it without transformers", self.name)
        return "written"

    def chat_template_source(self) -> str | None:
        """The chat template's source as the server renders chats with it (the ``tool_use`` one of a named set)."""
        template = getattr(self.hf, "chat_template", None)
        if isinstance(template, dict):
            return template.get("tool_use") or template.get("default")
        return template or None

    def _enable_fast_chat(self) -> None:
        """Turn the fast chat render on if it renders the sample chats exactly as apply_chat_template does."""
        self._fast_chat = None
        self.fast_chat_reason = None
        from transformers import __version__ as transformers_version
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        hf = self.hf
        if not transformers_version.startswith(VERIFIED_TRANSFORMERS):
            self.fast_chat_reason = (
                f"transformers {transformers_version} is not a release this render was checked against"
            )
            return
        for method in ("apply_chat_template", "get_chat_template"):
            if getattr(type(hf), method, None) is not getattr(PreTrainedTokenizerBase, method):
                self.fast_chat_reason = f"{type(hf).__name__} overrides {method}"
                return
        try:
            fast = ChatRender(hf.chat_template, hf.special_tokens_map)
        except NotVerified as exc:
            self.fast_chat_reason = str(exc)
            return
        if self.has_chat_template:
            for index, case in enumerate(_FAST_CHAT_SAMPLES):
                args = _render_args(case)
                try:
                    expected = self._apply_chat_template(*args)
                except Exception:
                    expected = None  # the template refuses this shape: the fast render must refuse it too
                try:
                    got = fast.render(*args)
                except Exception:
                    got = None
                if got != expected:
                    self.fast_chat_reason = f"fast chat render differs on sample {index}"
                    logger.warning("fast chat render disabled for %s: %s", self.name, self.fast_chat_reason)
                    return
        self._fast_chat = fast

    def _apply_chat_template(
        self,
        messages: Any,
        tools: Any,
        documents: Any,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template: str | None,
        kwargs: dict[str, Any],
    ) -> str:
        """transformers' own render (in lean mode, of the transformers tokenizer loaded for it)."""
        rendered = self._transformers_tokenizer().apply_chat_template(
            messages,
            tools=tools,
            documents=documents,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **kwargs,
        )
        return cast(str, rendered)  # tokenize=False: the rendered text

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        text = self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return cast(str, text)  # one id sequence: one str

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. ``"</think>"``), or None when the vocabulary lacks it."""
        tid = self.hf.convert_tokens_to_ids(token)
        return tid if isinstance(tid, int) and tid != self.hf.unk_token_id else None

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text exactly as transformers' apply_chat_template renders it."""
        if not self.has_chat_template and chat_template is None:
            raise TokenizerError("this model has no chat template; pass --chat-template or use /v1/completions")
        kwargs = dict(chat_template_kwargs or {})
        args = (messages, tools, documents, add_generation_prompt, continue_final_message, chat_template, kwargs)
        try:
            text = self._fast_chat.render(*args) if self._fast_chat is not None else None
            if text is None:  # not for the fast render (or it is off): transformers renders it
                if self.mode == "lean":
                    logger.info("a chat the fast render does not take: loading the transformers tokenizer for it")
                text = self._apply_chat_template(*args)
        except Exception as exc:  # jinja errors, raise_exception() in templates, bad message shapes
            raise TokenizerError(f"cannot render the chat template: {exc}") from None
        return text

    def tokenize_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
        """Render, then tokenize without adding special tokens again (the template has them)."""
        text = self.render_chat(messages, **kwargs)
        return text, self.segments.encode(text)

    def tokenize_prompt(self, text: str, previous: PromptTokens | None) -> PromptTokens:
        """Tokenize a rendered prompt only from where its text leaves ``previous`` (exact: see
        ``SegmentTokenizer.encode_after``). The whole prompt is rendered first (the template may change earlier
        turns' text: Qwen3 drops the reasoning of turns before the last user query)."""
        if previous is None:
            return self.segments.encode_prompt(text)
        return self.segments.encode_after(text, previous)


def _render_kwargs(case: Mapping[str, Any]) -> dict[str, Any]:
    """A sample chat as ``Tokenizer.render_chat``'s arguments."""
    keys = ("tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    return {"messages": case["messages"], **{key: case[key] for key in keys if key in case}}


def _render_args(case: Mapping[str, Any]) -> tuple[Any, ...]:
    """A sample chat as the positional arguments of the renders."""
    kwargs = dict(case.get("chat_template_kwargs") or {})
    return (case["messages"], case.get("tools"), case.get("documents"), case.get("add_generation_prompt", True),
            case.get("continue_final_message", False), None, kwargs)  # fmt: skip


#: Chats the fast render is compared on at start-up (every shape the server sends: reasoning, tool calls with
#: arguments as objects, tool results, tools, documents, template variables, None-valued keys).
_FAST_CHAT_SAMPLES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief.", "name": None},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Simple.", "tool_calls": None},
            {"role": "user", "content": "And 3+3?\n\n<|im_end|>"},
        ],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5, None]}},
                    }
                ],
            },
            {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1"},
            {"role": "tool", "content": "<tool_response>x</tool_response>", "tool_call_id": "call_2"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            }
        ],
    },
    {
        "messages": [
            {"role": "user", "content": "Summarize the document."},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nIt is short.", "thinking": "alias"},
            {"role": "user", "content": "Thanks"},
        ],
        "documents": [{"title": "Doc", "text": "A short document."}],
        "chat_template_kwargs": {"enable_thinking": True, "custom_flag": [1, {"a": None}]},
    },
    {
        "messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
]
