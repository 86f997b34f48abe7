"""The token facade: one loaded tokenizer, its chat template, EOS ids and generation defaults.

Everything here is synchronous and may be slow (rendering a long chat, tokenizing 100k tokens): the
server calls it on its render pool, and on the event loop only for small bodies (chat.render.INLINE_RENDER_MAX_BYTES).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import jinja2
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyfront.server.text.bundled_tokenizer import resolve_tokenizer_name
from pyfront.server.text.segment_cache import PromptTokens, SegmentTokenizer

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
    `hf` (the transformers tokenizer) feeds the detokenizer and the logprob formatting, which need
    the full vocabulary anyway.
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

    def tokenize_chat_after(
        self, messages: list[dict[str, Any]], previous: PromptTokens | None, **kwargs: Any
    ) -> PromptTokens:
        """``tokenize_chat``, reusing the ids of the prefix the prompt shares with ``previous`` (same ids)."""
        ...


class TokenizerError(ValueError):
    """The request cannot be rendered or tokenized (bad messages, template error): a 400."""


class _NotPlain(Exception):
    """A value outside plain JSON data: the fast chat render does not apply."""


def _plain_copy(value: Any) -> Any:
    """A fresh copy of plain JSON data (exact dict with str keys, list, str, int, float, bool, None).

    For such data it equals what transformers' ``_message_objects_to_dicts`` + ``_plain_template_data`` build
    (both copy containers and return exact scalars as they are); anything else raises ``_NotPlain``.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out[key] = _plain_copy(item)
        return out
    if kind is list:
        return [_plain_copy(item) for item in value]
    raise _NotPlain


_DICT_ATTRIBUTES = frozenset(dir(dict))
"""Every attribute a ``dict`` instance has: all come from ``dict`` and ``object`` (no instance ``__dict__``)."""

_BUILTIN_METHOD = type("".strip)
"""``builtin_function_or_method``: what ``content.strip``, ``message.get`` and the like are in a template."""


class _FastSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox with two exact shortcuts in attribute lookup and one in calls.

    A third shortcut is in ``call``: a template calls built-in methods (``content.strip()``, ``message.get(...)``)
    dozens of times per render, each through the sandbox's ``call`` and jinja's ``Context.call``. For an object of
    type ``builtin_function_or_method`` their checks all come out the same way: such an object has a fixed set of
    attributes, none of them ``unsafe_callable``, ``alters_data`` or ``jinja_pass_arg`` (its ``__call__``, a
    method-wrapper, has none either), so it is safely callable and gets no context argument. What is left of the
    two methods is run directly: drop the compiler's ``_block_vars`` / ``_loop_vars`` arguments, call, and turn a
    ``StopIteration`` into the same undefined. Methods the immutable sandbox forbids (``list.append``) are refused
    earlier, when the attribute is read, so they never get here.

    A chat template reads ``message.role``, ``message.content``, ``content.startswith(...)`` and the like dozens
    of times per message; in a profile of short chats, jinja's sandboxed ``getattr`` and its safety checks were
    ~40% of the render. For an exact ``dict`` and a name no dict has as an attribute, jinja's ``getattr`` raises
    and catches AttributeError, then returns ``obj[name]`` or undefined: ``getattr`` here goes there at once.
    ``is_safe_attribute`` of the sandbox depends on the object's type and the name only (``is_internal_attribute``
    and ``modifies_known_mutable`` are ``isinstance`` tests and set lookups; the value is not read), so for the
    exact types a template's data and loop variables have (``str``, ``list``, ``dict``, jinja's ``LoopContext``
    and the ``namespace`` class in the environment's globals) its answer is kept per (type, name): at most one
    entry per attribute those types have. Every other object goes through the sandbox's own methods.

    An instance is made by ``_FastChatRender.template`` from transformers' compiled environment (``overlay()``,
    so its filters, globals and extensions are transformers' own), then given this class.
    """

    _safe_attributes: dict[tuple[type, str], bool]
    _cached_types: frozenset[type]

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is not _BUILTIN_METHOD:
            return super().call(context, obj, *args, **kwargs)
        kwargs.pop("_block_vars", None)
        kwargs.pop("_loop_vars", None)
        try:
            return obj(*args, **kwargs)
        except StopIteration:
            return context.environment.undefined(
                "value was undefined because a callable raised a StopIteration exception"
            )

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind in self._cached_types:
            key = (kind, attr)
            safe = self._safe_attributes.get(key)
            if safe is None:
                safe = self._safe_attributes[key] = super().is_safe_attribute(obj, attr, value)
            return safe
        return super().is_safe_attribute(obj, attr, value)


class _FastChatRender:
    """``apply_chat_template(..., tokenize=False)`` for plain JSON messages, without the wrapper's generic work.

    transformers' wrapper walks every message twice with ``isinstance`` checks against ABCs, dataclasses and
    pydantic models (~0.7 ms for a 50-turn chat, about as long as the jinja render itself). For plain JSON
    input those walks amount to a copy that drops the messages' ``None``-valued keys, so this class does exactly
    that (``_plain_copy``), then the wrapper's remaining steps with transformers' own functions: the template
    lookup (``get_chat_template``), the compiled-template cache (``_compile_jinja_template``), the reasoning
    aliases (``_alias_reasoning_fields``), ``_plain_template_data`` of the tools, documents and template variables
    (special tokens + ``chat_template_kwargs``), and the same ``render`` call. Same compiled template, equal
    inputs: the same string. Everything else (continue_final_message, non-plain values, template variables named
    like the wrapper's own parameters, any exception) goes through ``apply_chat_template`` itself. It is enabled
    only for the transformers layout it was written against (``apply_chat_template`` not overridden, the helper
    functions present) and after a start-up comparison with ``apply_chat_template`` on sample chats.
    """

    VERIFIED_TRANSFORMERS = ("5.24.", "5.25.")
    """transformers releases whose apply_chat_template was read line by line against this class; others fall back."""

    VERIFIED_JINJA = ("3.1.",)
    """jinja2 releases whose sandbox ``getattr`` / ``call`` and ``Context.call`` were read against ``_FastSandbox``."""

    def __init__(self, hf: Any) -> None:
        import transformers
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.utils import chat_template_utils as ctu

        if not transformers.__version__.startswith(self.VERIFIED_TRANSFORMERS):
            raise _NotPlain(f"transformers {transformers.__version__} is not a release this render was checked against")
        if not jinja2.__version__.startswith(self.VERIFIED_JINJA):
            raise _NotPlain(f"jinja2 {jinja2.__version__} is not a release this render's sandbox was checked against")
        if getattr(type(hf), "apply_chat_template", None) is not PreTrainedTokenizerBase.apply_chat_template:
            raise _NotPlain(f"{type(hf).__name__} overrides apply_chat_template")
        self.hf = hf
        self.compile = ctu._compile_jinja_template
        self.templates: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.alias = ctu._alias_reasoning_fields
        self.plain = ctu._plain_template_data
        # apply_chat_template passes plain(special_tokens_map | kwargs); plain() copies a dict key by key in order
        # and the keys are str, so that equals plain(special_tokens_map) | plain(kwargs). The map is a property
        # rebuilt per call (~1.5 % of a short request's CPU) and the tokenizer never changes after loading, so it is
        # made plain once; its one list is shared by every render, which the immutable sandbox cannot change.
        self.special_tokens = self.plain(hf.special_tokens_map)
        reserved = {"messages", "self", "conversation", "conversations"}
        for fn in (PreTrainedTokenizerBase.apply_chat_template, ctu.render_jinja_template):
            reserved.update(inspect.signature(fn).parameters)
        self.reserved = frozenset(reserved)

    def render(
        self,
        messages: Any,
        tools: Any,
        documents: Any,
        add_generation_prompt: bool,
        continue_final_message: bool,
        chat_template: str | None,
        kwargs: dict[str, Any],
    ) -> str | None:
        """The rendered prompt, or None when the input is not for the fast path."""
        if continue_final_message or type(messages) is not list or not messages or not self.reserved.isdisjoint(kwargs):
            return None
        try:
            chat = []
            for message in messages:
                if type(message) is not dict:
                    return None
                chat.append({key: _plain_copy(value) for key, value in message.items() if value is not None})
                if any(type(key) is not str for key in message):
                    return None
            tool_schemas = None if tools is None else _plain_copy(tools)
            if tool_schemas is not None and (
                type(tool_schemas) is not list or any(type(tool) is not dict for tool in tool_schemas)
            ):
                return None
            docs = None if documents is None else _plain_copy(documents)
            if docs is not None and (type(docs) is not list or any(type(doc) is not dict for doc in docs)):
                return None
            hf = self.hf
            compiled = self.template(hf.get_chat_template(chat_template, tools))
            template_kwargs = {**self.special_tokens, **self.plain(kwargs)} if kwargs else self.special_tokens
            return compiled.render(
                messages=self.alias(chat),
                tools=tool_schemas,
                documents=docs,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        except Exception:  # _NotPlain, or an error apply_chat_template will report in its own words
            return None

    MAX_TEMPLATES = 8
    """Compiled templates kept (the model's own, and a few a request brought with --trust-request-chat-template)."""

    def template(self, source: str) -> Any:
        """``source`` compiled in a ``_FastSandbox`` overlay of the environment transformers compiles it in."""
        template = self.templates.get(source)
        if template is None:
            env = self.compile(source).environment.overlay()
            env.__class__ = _FastSandbox
            env._safe_attributes = {}
            namespace = env.globals.get("namespace")
            env._cached_types = frozenset(
                {str, list, dict, LoopContext, *([namespace] if isinstance(namespace, type) else [])}
            )
            template = env.from_string(source)
            # Its globals are a ChainMap over the environment's, copied into a new dict on every render; nothing
            # changes either after compiling, so one flat dict of the same items renders the same, faster.
            template.globals = dict(template.globals)
            with self.lock:
                if len(self.templates) >= self.MAX_TEMPLATES:
                    self.templates.pop(next(iter(self.templates)))
                self.templates[source] = template
        return template


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
    """A Hugging Face tokenizer loaded offline, plus what the server needs to know about the model."""

    def __init__(
        self,
        name_or_path: str,
        *,
        chat_template: str | None = None,
        model_dir: str | None = None,
        generation_config: str = "auto",
    ) -> None:
        """``generation_config``: where request defaults come from, as vLLM's ``--generation-config``: ``auto``
        (the model directory's generation_config.json), ``vllm`` (none), or a directory holding one."""
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer  # slow import: only at start-up

        path = resolve_tokenizer_name(name_or_path)
        try:
            self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:
            raise RuntimeError(f"cannot load the tokenizer {name_or_path!r} offline: {exc}") from exc
        if not getattr(self.hf, "is_fast", False):
            logger.warning("tokenizer %s is not a fast tokenizer: detokenization will be slower", name_or_path)
        self.name = name_or_path
        if chat_template is not None:
            template_path = Path(chat_template)
            self.hf.chat_template = template_path.read_text() if template_path.is_file() else chat_template
        self.vocab_size = len(self.hf)
        self.eos_token_id: int | None = self.hf.eos_token_id
        config_dir = Path(model_dir or path)
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
        self.has_chat_template = bool(getattr(self.hf, "chat_template", None))
        self._fast_chat: _FastChatRender | None = None
        self.fast_chat_reason: str | None = None
        """Why the fast chat render is off (None when it is on)."""
        # Chat prompts re-send the whole history every turn: tokenize the text between added tokens once per
        # distinct segment (exact, checked at start-up; falls back to plain encode where it would not be).
        # The backend is shared, not copied (~120 MB for Qwen): the server never asks for truncation or padding,
        # so transformers never changes the backend's settings under the cache's feet.
        self.segments = SegmentTokenizer(self.hf, share_backend=True)
        self.released = release_rebuild_inputs(self.hf)
        """What :func:`release_rebuild_inputs` did with the Python copies of the vocab and merges."""
        logger.debug("tokenizer %s: %s", name_or_path, self.released)
        if self.has_chat_template:
            # Compile the template now: the first chat requests would otherwise pay for it (tens of ms).
            with contextlib.suppress(Exception):
                self.render_chat([{"role": "user", "content": "warm-up"}])
        self._enable_fast_chat()

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
        try:
            fast = _FastChatRender(self.hf)
        except Exception as exc:  # another transformers layout, or an overridden apply_chat_template
            self.fast_chat_reason = str(exc) or type(exc).__name__
            return
        if self.has_chat_template:
            for case in _FAST_CHAT_SAMPLES:
                kwargs = dict(case.get("chat_template_kwargs") or {})
                args = (case["messages"], case.get("tools"), case.get("documents"), True, False, None, kwargs)
                try:
                    expected = self._apply_chat_template(*args)
                except Exception:
                    continue  # the template refuses this shape: nothing to compare
                if fast.render(*args) != expected:
                    self.fast_chat_reason = f"fast chat render differs on sample {_FAST_CHAT_SAMPLES.index(case)}"
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
        rendered = self.hf.apply_chat_template(
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
        if self._fast_chat is not None:
            text = self._fast_chat.render(*args)
            if text is not None:
                return text
        try:
            return self._apply_chat_template(*args)
        except Exception as exc:  # jinja errors, raise_exception() in templates, bad message shapes
            raise TokenizerError(f"cannot render the chat template: {exc}") from None

    def tokenize_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, list[int]]:
        """Render, then tokenize without adding special tokens again (the template has them)."""
        text = self.render_chat(messages, **kwargs)
        return text, self.segments.encode(text)

    def tokenize_chat_after(
        self, messages: list[dict[str, Any]], previous: PromptTokens | None, **kwargs: Any
    ) -> PromptTokens:
        """Render in full (the template may change earlier turns' text: Qwen3 drops the reasoning of turns
        before the last user query), then tokenize only from where the text leaves ``previous`` (exact: see
        ``SegmentTokenizer.encode_after``)."""
        text = self.render_chat(messages, **kwargs)
        if previous is None:
            return self.segments.encode_prompt(text)
        return self.segments.encode_after(text, previous)


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
]
