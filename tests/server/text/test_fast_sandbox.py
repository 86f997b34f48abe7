"""_FastSandbox (server/text/chat_template.py): templates compiled in it, without transformers, render exactly as in
transformers' own sandbox, and every sandbox refusal stays a refusal (same text, or the same exception type and
message)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from transformers.utils import chat_template_utils as ctu

from pyfront.server.text.chat_template import CompiledTemplates, _FastSandbox

MESSAGES = [
    {"role": "system", "content": "Be brief.", "items": "a key named like a dict method", "keys": 3},
    {"role": "user", "content": "  hi <think>x</think> there  ", "tool_calls": [{"function": {"name": "f"}}]},
    {"role": "assistant", "content": "", "reasoning_content": "r"},
]

TEMPLATES = [
    # ordinary lookups: attributes of dicts, strings, loops and namespaces
    "{% for m in messages %}{{ m.role }}:{{ m.content.strip() }}|{{ m.missing is defined }}{% endfor %}",
    "{% set ns = namespace(n=0, found=false) %}{% for m in messages %}{% set ns.n = ns.n + loop.index %}"
    "{% if loop.first %}F{% endif %}{% if loop.last %}L{{ loop.index0 }}{% endif %}{% endfor %}{{ ns.n }}",
    "{{ messages[0].items() | list | length }}|{{ messages[0]['items'] }}|{{ messages[0].keys() | list | length }}"
    "|{{ messages[0].keys is callable }}|{{ messages[1].get('role') }}",
    "{{ messages[1].content.split('<think>')[0] }}{{ messages[1].content.startswith('  hi') }}",
    "{% for m in messages %}{{ m.tool_calls[0].function.name if m.tool_calls else '-' }}{% endfor %}",
    "{{ messages | tojson }}{{ '%s-%d'|format('a', 3) }}{{ '{0}'.format('b') }}",
    "{{ messages[0].values() | list | length }}{{ messages[0].copy is defined }}",
    # built-in methods called in loops, blocks, macros, with keywords, and raising
    "{% for m in messages %}{{ m.content.replace('i', 'I', 1) }}{{ m.get('role', 'none') }}"
    "{% for c in m.content.split() %}{{ c.upper() }}{% endfor %}{% endfor %}",
    "{% set x %}{{ messages[1].content.strip().title() }}{% endset %}{{ x }}"
    "{{ messages[1].content.split(maxsplit=1) }}",
    "{% macro f(s) %}{{ s.lower().endswith('.') }}{% endmacro %}{{ f(messages[0].content) }}",
    "{{ messages[0].content.index('zz') }}",
    "{{ messages[0].content.strip(1) }}",
    "{% call messages[0].content.strip() %}x{% endcall %}",
    # transformers' environment: trim_blocks and lstrip_blocks, the generation tag, loop controls, its globals
    "{% for m in messages %}\n    {% if loop.index > 1 %}\n{{ m.role }}\n    {% endif %}\n{% endfor %}\n",
    "{% for m in messages %}{% generation %}[{{ m.role }}]{% endgeneration %}{% endfor %}",
    "{% for m in messages %}{% if loop.index == 2 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
    "{{ messages[0] | tojson(indent=2, sort_keys=true) }}{{ 'é<>&' | tojson }}"
    "{{ [1, 2] | tojson(separators=(',', ':')) }}",
    "{{ dict(a=1, b=[2]) | tojson }}{{ dict.fromkeys(['x', 'y'], 0) | tojson }}{{ strftime_now('%Y') | length }}",
    "{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a + ns.b }}",
    # every attribute of a loop, and the str methods the sandbox wraps (format, format_map), read directly, from a
    # namespace and from a loop's items
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
    "{{ loop.last }}{{ loop.length }}{{ loop.depth }}{{ loop.depth0 }}{{ loop.previtem is defined }}"
    "{{ loop.nextitem is defined }}{{ loop.cycle('a', 'b') }}{{ loop.changed(m.role) }}{{ loop.missing }}{% endfor %}",
    "{% for c in ['{0}{1}', '{a}'] %}{{ loop.previtem.format('x', 'y') if loop.previtem else '-' }}"
    "{{ c.format_map({'a': 1}) if loop.last else '' }}{% endfor %}",
    "{% set ns = namespace(f=''.format, m='{a}'.format_map) %}{{ ns.f('x') }}{{ ns.m({'a': 2}) }}"
    "{% set ns.g = '{0}'.format %}{{ ns.g(3) }}{{ '{0.__class__}'.format(1) }}",
    "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "{% set ns = namespace(f='{0.__class__}'.format) %}{{ ns.f(1) }}",
    # what the sandbox refuses
    "{% set ns = namespace(_a=1) %}{{ ns._a }}",
    "{% set ns = namespace() %}{% set ns._b = 2 %}{{ ns._b }}",
    "{{ dict.__class__ }}{{ dict.fromkeys.__self__ }}",
    "{{ messages.__class__ }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ messages[0].__class__.__subclasses__() }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].clear() }}",
    "{{ messages[0].update({'role': 'x'}) }}{{ messages[0].role }}",
    "{{ messages[0].pop('role') }}",
    "{% set ns = namespace() %}{{ ns.__init__ }}",
    "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
    "{{ raise_exception('refused') }}",
    "{{ ''.format.__globals__ }}",
    "{{ (messages[0].get).__self__ }}",
]


@cache
def fast() -> CompiledTemplates:
    return CompiledTemplates()


def outcome(template: Any) -> tuple[str, str]:
    try:
        return "ok", template.render(messages=[dict(m) for m in MESSAGES])
    except Exception as exc:  # the refusal itself is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("source", TEMPLATES)
def test_renders_and_refuses_as_transformers_sandbox(source: str) -> None:
    ours = fast().template(source)
    assert isinstance(ours.environment, _FastSandbox)
    theirs = ctu._compile_jinja_template(source)
    assert type(theirs.environment) is not _FastSandbox
    for _ in range(2):  # the second time from the cached safety answers
        assert outcome(ours) == outcome(theirs)


def test_refusals_stay_refusals() -> None:
    results = {source: outcome(fast().template(source)) for source in TEMPLATES}
    assert results["{{ messages.append(1) }}"][0] == "SecurityError"
    assert results["{{ messages[0].clear() }}"][0] == "SecurityError"
    assert results["{{ raise_exception('refused') }}"] == ("TemplateError", "refused")
    for source in TEMPLATES[TEMPLATES.index("{{ messages.__class__ }}") :]:
        kind, text = results[source]
        assert kind != "ok" or not any(leak in text for leak in ("class", "function", "dict", "object")), source


def test_templates_are_kept_within_the_bound() -> None:
    render = CompiledTemplates()
    for i in range(render.MAX_TEMPLATES + 5):
        render.template(f"{{{{ {i} }}}}")
    assert len(render.templates) == render.MAX_TEMPLATES
    assert render.template("{{ 3 + 4 }}").render() == "7"


def test_a_builtin_raising_stop_iteration_renders_undefined_as_in_the_sandbox() -> None:
    source = "[{{ nxt(it) }}][{{ nxt(it, 'default') }}]"
    results = []
    for template in (fast().template(source), ctu._compile_jinja_template(source)):
        results.append(template.render(nxt=next, it=iter([])))
    assert results[0] == results[1] == "[][default]"


def test_builtin_methods_skip_the_sandbox_call_and_others_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut is taken for built-in methods and the environment's ``namespace`` and ``dict`` only: a Python
    function (or ``dict.fromkeys``, a bound method) still goes through the sandbox's call (where is_safe_callable and
    pass_context are honoured)."""
    from jinja2.sandbox import SandboxedEnvironment

    seen: list[Any] = []
    original = SandboxedEnvironment.call

    def counting(self: Any, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(obj)
        return original(self, context, obj, *args, **kwargs)

    monkeypatch.setattr(SandboxedEnvironment, "call", counting)

    def helper(value: str) -> str:
        return value * 2

    template = fast().template(
        "{{ messages[0].content.strip().upper() }}{{ helper('ab') }}{% set ns = namespace(a=1) %}{{ ns.a }}"
        "{{ dict(b=2).b }}{{ dict.fromkeys('c', 3).c }}"
    )
    assert template.render(messages=MESSAGES, helper=helper) == "BE BRIEF.abab123"
    assert [getattr(obj, "__name__", None) for obj in seen] == ["helper", "fromkeys"]


def test_str_methods_carry_the_name_they_are_read_by() -> None:
    """`_FastSandbox.getattr` asks jinja's ``wrap_str_format`` only about ``format`` and ``format_map`` on a str: that
    is exact because each method of a str is named as the attribute it is read by (no aliases)."""
    import types

    for name in dir(str):
        value = getattr("", name)
        if isinstance(value, (types.MethodType, types.BuiltinMethodType)):
            assert value.__name__ == name, name
