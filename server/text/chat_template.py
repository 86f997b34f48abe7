"""Chat templates rendered exactly as transformers' ``apply_chat_template(..., tokenize=False)`` renders them, with
jinja2 alone: no transformers import, no transformers tokenizer object.

Why its own module: the lean tokenizer load (server/text/lean.py) serves without transformers, so the template
environment and the wrapper's steps have to be here. What they are, read against transformers 5.24 and 5.25
(``utils/chat_template_utils.py`` and ``PreTrainedTokenizerBase.apply_chat_template``, Apache-2.0):

- the environment: ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
  loopcontrols])`` with the ``tojson`` filter and the ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``
  globals (``_cached_compile_jinja_template``). The globals and filter below are transformers' own definitions.
  ``AssistantTracker`` adds the ``{% generation %}`` tag, whose block renders as its body unless the tracker is
  active, which only ``return_assistant_tokens_mask`` does (never here): :class:`GenerationTag` is that case;
- the template: ``get_chat_template`` (a named set picks ``tool_use`` when tools are given, else ``default``);
- the data: messages, tools, documents and template variables copied as plain JSON (``_normalize_chat_messages``
  drops the messages' ``None``-valued keys; ``_plain_template_data`` copies the rest), the reasoning aliases
  (``_alias_reasoning_fields``), the special tokens map under the template variables, and ``continue_final_message``
  (``render_jinja_template``'s tag-and-cut);
- the errors raised before the render, with their words.

Inputs outside plain JSON data and template variables named like the wrapper's own parameters are not taken here
(:meth:`ChatRender.render` returns None): the tokenizer facade sends those to transformers itself. The proof is by
comparison, never by assumption: the tokenizer facade compares this render with ``apply_chat_template`` on sample
chats before it uses it (server/text/tokenizer.py), and tests/server/text/ compare them on random tool and reasoning
conversations, templates and refusals.
"""

from __future__ import annotations

import json
import threading
import types
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

VERIFIED_JINJA = ("3.1.",)
"""jinja2 releases whose sandbox ``getattr`` / ``call``, ``Context.call``, ``Template.render`` and ``Namespace``'s
attribute store were read against ``_FastSandbox`` and :class:`TemplateNamespace`."""

_NAMESPACE_ATTRS = "_Namespace__attrs"
"""Where jinja's ``Namespace`` keeps its attributes (its name-mangled ``__attrs`` dict)."""

WRAPPER_PARAMETERS = frozenset(
    {
        # apply_chat_template's parameters
        "self",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "kwargs",
        # render_jinja_template's, and the names the template's own arguments take
        "conversations",
        "messages",
    }
)
"""Template variables that transformers' wrapper would take as its own arguments (a test checks the set against the
signatures of ``apply_chat_template`` and ``render_jinja_template``): a request that names one is left to
transformers."""

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning goes under; the first is the one chat templates read (transformers'
``_REASONING_FIELDS``)."""

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""What ``render_jinja_template`` appends to the final message to find where to cut the render."""


# ------------------------------------------------------------------ the environment, as transformers builds it


def raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers overrides jinja's filter, which escapes HTML characters, and exposes these options.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class TemplateDict:
    """transformers' ``dict`` global: a limited callable, so that templates cannot reach dict's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """transformers' ``namespace`` global: jinja's Namespace refusing underscore-prefixed names."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # Same signature trick as jinja's Namespace, so that `namespace(self=...)` still works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            if isinstance(name, str) and name.startswith("_"):  # _check_name's test, without its call per name
                TemplateNamespace._check_name(name)
        object.__setattr__(self, _NAMESPACE_ATTRS, attrs)  # Namespace.__init__'s store (attrs is a fresh dict)

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):  # _check_name's test, without its call on each set
            TemplateNamespace._check_name(name)
        # Namespace.__setitem__, without the two Python frames of its own __getattribute__ on the way
        object.__getattribute__(self, _NAMESPACE_ATTRS)[name] = value

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


class GenerationTag(jinja2.ext.Extension):
    """transformers' ``AssistantTracker`` with its tracker inactive: ``{% generation %}...{% endgeneration %}``
    renders its body. The tag parses the same way (a call block of the body), so templates compile the same."""

    tags = {"generation"}  # noqa: RUF012 - jinja's own class attribute

    def parse(self, parser: Any) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        block = jinja2.nodes.CallBlock(call, [], [], body)
        block.set_lineno(lineno)
        return block

    @jinja2.pass_eval_context
    def _generation_support(self, context: Any, caller: Any) -> str:
        return caller()


_DICT_ATTRIBUTES = frozenset(dir(dict))
"""Every attribute a ``dict`` instance has: all come from ``dict`` and ``object`` (no instance ``__dict__``)."""

_BUILTIN_METHOD = type("".strip)
"""``builtin_function_or_method``: what ``content.strip``, ``message.get`` and the like are in a template."""

_METHOD_TYPES = (types.MethodType, types.BuiltinMethodType)
"""The values jinja's ``wrap_str_format`` looks at further (it returns None for anything else)."""

_STR_FORMATS = frozenset({"format", "format_map"})
"""The method names jinja's ``wrap_str_format`` wraps."""

_FAST_GETATTR_TYPES = frozenset({str, LoopContext, TemplateNamespace})
"""Exact types whose attributes ``_FastSandbox.getattr`` reads itself once the sandbox found the name safe."""


class _FastSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox with two exact shortcuts in attribute lookup and one in calls.

    A template calls built-in methods (``content.strip()``, ``message.get(...)``) dozens of times per render, each
    through the sandbox's ``call`` and jinja's ``Context.call``. For an object of type ``builtin_function_or_method``
    their checks all come out the same way: such an object has a fixed set of attributes, none of them
    ``unsafe_callable``, ``alters_data`` or ``jinja_pass_arg`` (its ``__call__``, a method-wrapper, has none either),
    so it is safely callable and gets no context argument. The same holds for the environment's ``namespace`` and
    ``dict`` globals (the class :class:`TemplateNamespace` and a :class:`TemplateDict`: classes of this module that
    define none of those attributes, on themselves or on their ``__call__``; Qwen's templates call ``namespace`` once
    per render, 3.9 us through the sandbox's checks, whose attribute misses raise and catch, against 1.2 us). What
    is left of the two methods is run directly: drop the compiler's ``_block_vars`` / ``_loop_vars`` arguments,
    call, and turn a ``StopIteration`` into the same undefined.
    Methods the immutable sandbox forbids (``list.append``) are refused earlier, when the attribute is read, so they
    never get here.

    A chat template reads ``message.role``, ``message.content``, ``content.startswith(...)`` and the like dozens
    of times per message; in a profile of short chats, jinja's sandboxed ``getattr`` and its safety checks were
    ~40% of the render. For an exact ``dict`` and a name no dict has as an attribute, jinja's ``getattr`` raises
    and catches AttributeError, then returns ``obj[name]`` or undefined: ``getattr`` here goes there at once.
    ``is_safe_attribute`` of the sandbox depends on the object's type and the name only (``is_internal_attribute``
    and ``modifies_known_mutable`` are ``isinstance`` tests and set lookups; the value is not read), so for the
    exact types a template's data and loop variables have (``str``, ``list``, ``dict``, jinja's ``LoopContext``
    and the ``namespace`` class in the environment's globals) its answer is kept per (type, name): at most one
    entry per attribute those types have. With that answer kept, ``getattr`` on an exact ``str`` (``content.strip``),
    a namespace (``ns.found``) or a ``LoopContext`` (``loop.index``, ``loop.first``: two or three reads per message)
    runs the sandbox's own steps without its calls: the attribute, jinja's ``wrap_str_format`` only where it can
    wrap (a method, or on a str one named ``format`` or ``format_map``), and the kept answer, True. Every other
    object goes through the sandbox's own methods.
    """

    _CACHED_TYPES = frozenset({str, list, dict, LoopContext, TemplateNamespace})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
        self.filters["tojson"] = tojson
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now
        self.globals["dict"] = TemplateDict()
        self.globals["namespace"] = TemplateNamespace
        self._safe_attributes: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if kind in _FAST_GETATTR_TYPES and self._safe_attributes.get((kind, attribute)) is True:
            # The sandbox's getattr for an attribute found safe before: getattr, then `wrap_str_format`, then the
            # safety check (cached, True). `wrap_str_format` wraps only a method named format or format_map bound
            # to a str. On an exact str the method an attribute names has that name (str has no aliases: a test
            # checks), so only those two names can be wrapped; what a namespace holds or a loop's item is can be
            # any value, so those go through the check as before.
            if kind is TemplateNamespace:  # Namespace.__getattribute__ for a name it holds, without its frames
                attrs = object.__getattribute__(obj, _NAMESPACE_ATTRS)
                if attribute not in attrs:
                    return super().getattr(obj, attribute)  # its AttributeError, item lookup and undefined
                value = attrs[attribute]
            else:
                try:
                    value = getattr(obj, attribute)
                except AttributeError:
                    return super().getattr(obj, attribute)  # its item lookup and undefined
                if kind is str:
                    if attribute in _STR_FORMATS:
                        wrapped = self.wrap_str_format(value)
                        if wrapped is not None:
                            return wrapped
                    return value
            if isinstance(value, _METHOD_TYPES):
                wrapped = self.wrap_str_format(value)
                if wrapped is not None:
                    return wrapped
            return value
        return super().getattr(obj, attribute)

    def render(self, template: jinja2.Template, variables: dict[str, Any]) -> str:
        """``template.render(**variables)`` (jinja 3.1's ``Template.render`` of a sync environment) without its
        wrapper layers: the context its ``new_context`` makes (the template's globals, then the variables), the
        root render function joined, and the environment's handling of an exception (its traceback rewritten)."""
        parent = dict(template.globals)
        parent.update(variables)
        context = self.context_class(self, parent, template.name, template.blocks, globals=template.globals)
        try:
            rendered: str = self.concat(template.root_render_func(context))
        except Exception:
            self.handle_exception()
        return rendered

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is not _BUILTIN_METHOD and obj is not TemplateNamespace and type(obj) is not TemplateDict:
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
        if kind in self._CACHED_TYPES:
            key = (kind, attr)
            safe = self._safe_attributes.get(key)
            if safe is None:
                safe = self._safe_attributes[key] = super().is_safe_attribute(obj, attr, value)
            return safe
        return super().is_safe_attribute(obj, attr, value)


class CompiledTemplates:
    """Chat templates compiled once each in one :class:`_FastSandbox` (the model's own, and a few a request brought
    with --trust-request-chat-template), at most :attr:`MAX_TEMPLATES`; thread-safe."""

    MAX_TEMPLATES = 8

    def __init__(self) -> None:
        if not jinja2.__version__.startswith(VERIFIED_JINJA):
            raise NotVerified(f"jinja2 {jinja2.__version__} is not a release the template sandbox was checked against")
        self.environment = _FastSandbox()
        self.templates: dict[str, jinja2.Template] = {}
        self.lock = threading.Lock()

    def template(self, source: str) -> jinja2.Template:
        template = self.templates.get(source)
        if template is None:
            template = self.environment.from_string(source)
            # Its globals are a ChainMap over the environment's, copied into a new dict on every render; nothing
            # changes either after compiling, so one flat dict of the same items renders the same, faster.
            template.globals = dict(template.globals)
            with self.lock:
                if len(self.templates) >= self.MAX_TEMPLATES:
                    self.templates.pop(next(iter(self.templates)))
                self.templates[source] = template
        return template


class NotVerified(Exception):
    """This render was not checked against the installed jinja2 (or the data is not plain JSON): not used."""


class _NotPlain(Exception):
    """A value outside plain JSON data: the render does not take it."""


def plain_copy(value: Any) -> Any:
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
            out[key] = plain_copy(item)
        return out
    if kind is list:
        return [plain_copy(item) for item in value]
    raise _NotPlain


def alias_reasoning_fields(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """transformers' ``_alias_reasoning_fields``: ``reasoning_content`` (and ``thinking``, which gpt-oss templates
    read) filled from whichever name the message's reasoning came under."""
    aliased = []
    for message in chat:
        reasoning = None
        for key in REASONING_FIELDS:  # the first one set (a loop, not a generator per message)
            reasoning = message.get(key)
            if reasoning is not None:
                break
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def select_template(templates: str | Mapping[str, str] | None, chat_template: str | None, tools: Any) -> str:
    """transformers' ``get_chat_template``: the template source a render uses, with its errors' words."""
    if type(templates) is not str and isinstance(templates, Mapping):  # the usual one template: no ABC check
        if chat_template is not None and chat_template in templates:
            return templates[chat_template]
        if chat_template is None:
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(
                "This model has multiple chat templates with no default specified! Please either pass a chat "
                "template or the name of the template you wish to use to the `chat_template` argument. Available "
                f"template names are {sorted(templates.keys())}."
            )
    elif chat_template is None:
        if templates is not None:
            return templates
        raise ValueError(
            "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
            "argument was passed! For information about writing templates and setting the "
            "tokenizer.chat_template attribute, please see the documentation at "
            "https://huggingface.co/docs/transformers/main/en/chat_templating"
        )
    return chat_template


class ChatRender:
    """``apply_chat_template(..., tokenize=False)`` for plain JSON chats, from the tokenizer's templates and special
    tokens map (see the module docstring for what it reproduces and how that is checked)."""

    def __init__(self, templates: str | Mapping[str, str] | None, special_tokens_map: Mapping[str, Any]) -> None:
        self.templates = templates
        self.compiled = CompiledTemplates()
        # apply_chat_template passes plain(special_tokens_map | kwargs); plain() copies a dict key by key in order
        # and the keys are str, so that equals plain(special_tokens_map) | plain(kwargs). The map is made plain once;
        # its one list is shared by every render, which the immutable sandbox cannot change.
        self.special_tokens: dict[str, Any] = plain_copy(dict(special_tokens_map))

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
        """The rendered prompt; None when the input is not for this render (not plain JSON data, or a template
        variable named like a wrapper parameter). The template's own errors, and the wrapper's, are raised."""
        if not WRAPPER_PARAMETERS.isdisjoint(kwargs) or type(messages) is not list:
            return None
        try:
            chat = []
            for message in messages:
                if type(message) is not dict:
                    return None
                copy = {}
                for key, value in message.items():  # one loop, no comprehension or generator per message
                    if type(key) is not str:
                        return None
                    if value is not None:
                        copy[key] = plain_copy(value)
                chat.append(copy)
            tool_schemas = None if tools is None else plain_copy(tools)
            docs = None if documents is None else plain_copy(documents)
            template_kwargs = {**self.special_tokens, **plain_copy(kwargs)} if kwargs else self.special_tokens
        except _NotPlain:
            return None
        if tool_schemas is not None and (
            type(tool_schemas) is not list or any(type(tool) is not dict for tool in tool_schemas)
        ):
            return None  # transformers turns callables into schemas, and refuses anything else: its words
        source = select_template(self.templates, chat_template, tools)
        if not chat:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        if continue_final_message and add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
                "when you want the model to continue the final message, and add_generation_prompt when you want to "
                "add a header that will prompt it to start a new assistant message instead."
            )
        compiled = self.compiled.template(source)
        if docs is not None and any(type(document) is not dict for document in docs):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        chat = alias_reasoning_fields(chat)
        final = None
        if continue_final_message:
            final = self._tag_final_message(chat, source)
        variables = {"messages": chat, "tools": tool_schemas, "documents": docs}
        variables["add_generation_prompt"] = add_generation_prompt
        variables.update(template_kwargs)  # no key in common with the four: WRAPPER_PARAMETERS
        rendered = self.compiled.environment.render(compiled, variables)
        if final is not None:
            rendered = self._cut_at_tag(rendered, final)
        return rendered

    @staticmethod
    def _tag_final_message(chat: list[dict[str, Any]], source: str) -> str:
        """``render_jinja_template``'s ``continue_final_message`` (with ``True``: the ``content`` field): tag the
        final message's text; returns the text the render must contain."""
        field = "content"
        final = chat[-1].get(field)
        if final is None:
            raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
        if field not in source:
            raise ValueError(
                f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
            )
        if isinstance(final, list):
            for block in reversed(final):
                if "text" in block:
                    text: str = block["text"]
                    block["text"] = text + CONTINUE_TAG
                    return text
            raise ValueError(
                "continue_final_message is set but we could not find any text to continue in the final message!"
            )
        chat[-1][field] = final + CONTINUE_TAG
        return final

    @staticmethod
    def _cut_at_tag(rendered: str, final: str) -> str:
        if final.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat after "
                "applying the chat template! This can happen if the chat template deletes portions of "
                "the final message. Please verify the chat template and final message in your chat to "
                "ensure they are compatible."
                f"Final message to continue: {final.strip()}\nRendered chat:\n{rendered}"
            )
        tag_loc = rendered.rindex(CONTINUE_TAG.strip())
        if rendered[tag_loc : tag_loc + len(CONTINUE_TAG)] == CONTINUE_TAG:
            return rendered[:tag_loc]  # the template preserves spacing
        return rendered[:tag_loc].rstrip()  # trailing spacing was trimmed: cut more cautiously
