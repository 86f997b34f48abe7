"""``tool_choice`` "required" and named functions: the output constraint and its parsing.

vLLM 0.32 forces a call in one of two ways:

* **JSON schema** (vLLM's ``get_json_schema_from_tools``, used when
  ``VLLM_ENFORCE_STRICT_TOOL_CALLING=0`` or the tool parser has no structural tag):
  ``required`` constrains the output to a JSON array of ``{"name", "parameters"}``
  objects, a named function to the bare arguments object. :func:`tool_choice_json_schema`
  gives the schema; :class:`RequiredToolCallsParser` and :class:`NamedToolCallParser`
  read the constrained output back into calls (streaming, like every parser here).
* **structural tag** (vLLM 0.32's default for ``hermes``): the output is constrained to
  Hermes ``<tool_call>`` blocks and read by the Hermes parser as for ``auto``.
  :func:`hermes_structural_tag` gives the tag (also for ``auto`` when a tool is
  ``strict`` or ``parallel_tool_calls`` is false).

Tools and tool choices are accepted as the request's JSON (dicts) or as objects with the
same attributes (``tool.function.name``, ``tool_choice.function.name``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pyfront.server.chat.parsers.json_stream import ArgumentsReader, CallObjectReader
from pyfront.server.chat.parsers.tool_calls import ToolCallParser, ToolCallStream, make_tool_call_id
from pyfront.server.errors import RequestValidationError

__all__ = [
    "NamedToolCallParser",
    "RequiredToolCallsParser",
    "constrained_tool_call_parser",
    "hermes_structural_tag",
    "normalize_tool_choice",
    "tool_choice_json_schema",
]

ToolChoiceKind = Literal["none", "auto", "required", "named"]


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _function(tool: Any) -> tuple[str, dict[str, Any] | None, bool | None]:
    """(name, parameters, strict) of a function tool."""
    function = _get(tool, "function")
    if function is None:
        raise RequestValidationError("only function tools are supported")
    parameters = _get(function, "parameters")
    return _get(function, "name"), (dict(parameters) if parameters is not None else None), _get(function, "strict")


def normalize_tool_choice(tool_choice: Any) -> tuple[ToolChoiceKind, str | None]:
    """("none" | "auto" | "required" | "named", the named function or None). None means "none"."""
    if tool_choice is None or tool_choice == "none":
        return "none", None
    if tool_choice in ("auto", "required"):
        return tool_choice, None
    function = _get(tool_choice, "function")
    name = _get(function, "name") if function is not None else None
    if not isinstance(name, str):
        raise RequestValidationError(f"unsupported tool_choice: {tool_choice!r}", "tool_choice")
    return "named", name


def _params_or_empty_object(params: dict[str, Any] | None) -> dict[str, Any]:
    return params if params else {"type": "object", "properties": {}}


def tool_choice_json_schema(
    tools: Sequence[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None = None
) -> dict[str, Any] | None:
    """The JSON schema vLLM constrains a forced call with, or None (``none`` / ``auto``).

    Named function: its parameters (``{"type": "object", "properties": {}}`` if it has
    none). ``required``: an array (``minItems`` 1, ``maxItems`` 1 when
    ``parallel_tool_calls`` is false) of ``{"name": <enum of one>, "parameters": ...}``
    objects, one ``anyOf`` branch per tool, with the tools' ``$defs`` merged at the top.
    Raises RequestValidationError (a 400) for a named function not in ``tools`` or clashing ``$defs``.
    """
    kind, name = normalize_tool_choice(tool_choice)
    if kind in ("none", "auto") or tools is None:
        return None
    functions = [_function(tool) for tool in tools]
    if kind == "named":
        for fn_name, params, _strict in functions:
            if fn_name == name:
                return _params_or_empty_object(copy.deepcopy(params))
        raise RequestValidationError(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
    branches: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for fn_name, params, _strict in functions:
        params = copy.deepcopy(params)
        if params is not None and "$defs" in params:
            tool_defs = params.pop("$defs")
            if not isinstance(tool_defs, dict):
                raise RequestValidationError(f"`$defs` in the parameters of tool '{fn_name}' must be an object.")
            for def_name, def_schema in tool_defs.items():
                if def_name in defs and defs[def_name] != def_schema:
                    raise RequestValidationError(
                        f"Tool definition '{def_name}' has multiple schemas, which is not supported."
                    )
                defs[def_name] = def_schema
        branches.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [fn_name]},
                    "parameters": _params_or_empty_object(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


_STRICT_LEVELS = {"auto": 0, "function": 1, "parameter": 2}


def hermes_structural_tag(
    tools: Sequence[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None = None,
    strict_level: str = "auto",
) -> dict[str, Any] | None:
    """The xgrammar structural tag vLLM 0.32 constrains Hermes tool calls with, or None.

    As ``structural_tag`` in ``structured_outputs``, it is ``json.dumps`` of this dict.
    None for ``none``, and for ``auto`` unless a tool has ``strict: true``,
    ``parallel_tool_calls`` is false, or ``strict_level`` (vLLM's ``--tool-strict-level``:
    auto, function, parameter) is raised. A tool's arguments follow its schema when it is
    strict (or at level ``parameter``), else any JSON. (vLLM also combines the tag with a
    request's own structured output for ``auto``; that case is not covered here.)
    """
    kind, name = normalize_tool_choice(tool_choice)
    if not tools or kind == "none":
        return None
    level = _STRICT_LEVELS[strict_level.strip().lower()]
    if parallel_tool_calls is False:
        level = max(level, _STRICT_LEVELS["function"])
    functions = [_function(tool) for tool in tools]
    if kind == "auto" and level == 0 and not any(strict is True for _n, _p, strict in functions):
        return None
    if kind == "named":
        functions = [f for f in functions if f[0] == name]
        if not functions:
            raise RequestValidationError(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
    tags: list[dict[str, Any]] = []
    for fn_name, params, strict in functions:
        strict_now = level >= _STRICT_LEVELS["parameter"] or strict is True
        schema: Any = params if strict_now and params is not None else True
        for begin, end in (("<tool_call>\n", "}\n</tool_call>"), ("<tool_call>", "}</tool_call>")):
            tags.append(
                {
                    "type": "tag",
                    "begin": begin + '{"name": "' + fn_name + '", "arguments": ',
                    "content": {
                        "type": "json_schema",
                        "json_schema": schema,
                        "style": "json",
                        "any_order": False,
                        "max_whitespace_cnt": None,
                        "excludes": [],
                    },
                    "end": end,
                }
            )
    single = parallel_tool_calls is False
    if kind == "auto":
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": single,
            "excludes": [],
        }
    else:
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "",
            "at_least_one": True,
            "stop_after_first": kind == "named" or single,
        }
    return {"type": "structural_tag", "format": fmt}


# -- reading constrained output --------------------------------------------------------

# RequiredToolCallsStream states.
_R_START = 0
_R_FIRST = 1  # after "[": an element or "]"
_R_NEXT = 2  # after ",": an element
_R_IN = 3
_R_AFTER = 4  # after an element: "," or "]"
_R_DONE = 5
_R_ERROR = 6
_WS = " \t\n\r"


class RequiredToolCallsStream(ToolCallStream):
    """Output constrained to ``[{"name": ..., "parameters": ...}, ...]``.

    Each element becomes a call once its name is read, its ``parameters`` streaming as
    arguments. There is never content (vLLM returns none for ``required``). Where vLLM
    returns no calls at all for output that fails validation, this keeps the calls begun
    before the break (arguments closed into valid JSON) and stops there.
    """

    def __init__(self, id_factory: Callable[[], str] = make_tool_call_id) -> None:
        super().__init__(id_factory)
        self._state = _R_START
        self._element: CallObjectReader | None = None
        self._index = -1

    def _read(self, text: str) -> None:
        pos, n = 0, len(text)
        while pos < n:
            state = self._state
            if state >= _R_DONE:
                return
            if state == _R_IN:
                element = self._element
                assert element is not None
                pos = element.feed(text, pos)
                self._element_step()
                if element.done:
                    self._close_element()
                    self._state = _R_AFTER
                elif element.broken:
                    self._close_element()
                    self._state = _R_ERROR
                continue
            c = text[pos]
            if c in _WS:
                pos += 1
                continue
            if state == _R_START:
                self._state = _R_FIRST if c == "[" else _R_ERROR
            elif state in (_R_FIRST, _R_NEXT):
                if c == "{":
                    self._element = CallObjectReader()
                    self._index = -1
                    self._state = _R_IN
                    continue  # the element reads its brace
                self._state = _R_DONE if c == "]" and state == _R_FIRST else _R_ERROR
            else:  # _R_AFTER
                if c == ",":
                    self._state = _R_NEXT
                else:
                    self._state = _R_DONE if c == "]" else _R_ERROR
            pos += 1

    def _element_step(self) -> None:
        element = self._element
        assert element is not None
        if self._index < 0 and element.name is not None:
            self._index = self._begin_call(element.name)
        if self._index >= 0:
            self._arguments(self._index, element.take_arguments())

    def _close_element(self) -> None:
        element = self._element
        assert element is not None
        rest = element.close()
        if self._index >= 0:
            self._arguments(self._index, rest)
        self._element = None

    def _end(self) -> None:
        if self._state == _R_IN:
            self._close_element()


class RequiredToolCallsParser(ToolCallParser):
    """Reads ``tool_choice: "required"`` output constrained by :func:`tool_choice_json_schema`."""

    name = "required"

    def stream(self) -> RequiredToolCallsStream:
        return RequiredToolCallsStream(self.id_factory)


class NamedToolCallStream(ToolCallStream):
    """Output constrained to the named function's arguments: the whole output is one call.

    The call starts at the first character of the value; an object streams. Output that
    is empty or whitespace gives neither call nor content (as vLLM); output that does not
    start like a JSON value is content (vLLM would make it the call's arguments).
    """

    def __init__(self, function_name: str, id_factory: Callable[[], str] = make_tool_call_id) -> None:
        super().__init__(id_factory)
        self._function_name = function_name
        self._reader = ArgumentsReader()
        self._index = -1
        self._ws = ""
        self._as_content = False

    def _read(self, text: str) -> None:
        if self._as_content:
            self._content(text)
            return
        if self._index < 0:
            stripped = text.lstrip(_WS)
            if not stripped:
                self._ws += text
                return
            if stripped[0] not in '{["-0123456789tfn':
                self._as_content = True
                self._content(self._ws + text)
                return
            self._index = self._begin_call(self._function_name)
        if not self._reader.done and not self._reader.error:
            self._reader.feed(text)
        self._arguments(self._index, self._reader.take())

    def _end(self) -> None:
        if self._index >= 0:
            self._arguments(self._index, self._reader.close())


class NamedToolCallParser(ToolCallParser):
    """Reads named-function output constrained by :func:`tool_choice_json_schema`."""

    name = "named"

    def __init__(self, function_name: str, *, id_factory: Callable[[], str] = make_tool_call_id) -> None:
        super().__init__(id_factory=id_factory)
        self.function_name = function_name

    def stream(self) -> NamedToolCallStream:
        return NamedToolCallStream(self.function_name, self.id_factory)


def constrained_tool_call_parser(
    tool_choice: Any, *, id_factory: Callable[[], str] = make_tool_call_id
) -> ToolCallParser | None:
    """The parser for JSON-schema-constrained output of ``tool_choice``, or None (``none`` / ``auto``)."""
    kind, name = normalize_tool_choice(tool_choice)
    if kind == "required":
        return RequiredToolCallsParser(id_factory=id_factory)
    if kind == "named":
        assert name is not None
        return NamedToolCallParser(name, id_factory=id_factory)
    return None
