"""The server's packages import one way, in request order, and only the engine client and hashing below them.

`pyfront.server`'s docstring states the order; a module that imported a package before its own in that
order (say `text` importing `generate`) would make the request path loop back on itself.
"""

from __future__ import annotations

import ast
import tomllib

from tests.conftest import REPO_ROOT

ORDER = ["api", "generate", "chat", "text"]
"""The request path's packages, outermost first: each may import only those after it."""
SHARED = {"openai", "anthropic", "state", "errors", "config", "metrics", "ids", "pacing", "extensions"}
"""What every package may use: the request types (OpenAI's, Anthropic's), the serving state, the error table,
settings, metrics, request ids, admission pacing."""


def _imports(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyfront.server."):
            found.add(node.module.split(".")[2])
    return found


def test_packages_import_in_request_order() -> None:
    server = REPO_ROOT / "server"
    wrong = []
    for index, package in enumerate(ORDER):
        allowed = set(ORDER[index:]) | SHARED
        for path in sorted((server / package).rglob("*.py")):
            bad = _imports(path) - allowed
            if bad:
                wrong.append(f"{path.relative_to(REPO_ROOT)} imports {sorted(bad)}")
    assert not wrong, "\n".join(wrong)


def test_shared_modules_sit_below_the_request_path() -> None:
    server = REPO_ROOT / "server"
    wrong = []
    for name in sorted(SHARED):
        paths = sorted((server / name).rglob("*.py")) if (server / name).is_dir() else [server / f"{name}.py"]
        for path in paths:
            bad = _imports(path) - SHARED - {"text"}
            if bad:
                wrong.append(f"{path.relative_to(REPO_ROOT)} imports {sorted(bad)}")
    assert not wrong, "\n".join(wrong)


STRUCTURED_OUTPUTS = ["__init__", "structural_tag", "ebnf", "lark", "schema", "regex", "grammar"]
"""server/generate/structured_outputs/'s modules, the resolution first: each may import only those after it."""


def test_structured_outputs_modules_import_one_way() -> None:
    package = REPO_ROOT / "server" / "generate" / "structured_outputs"
    prefix = "pyfront.server.generate.structured_outputs"
    assert sorted(path.stem for path in package.glob("*.py")) == sorted(STRUCTURED_OUTPUTS)
    wrong = []
    for index, name in enumerate(STRUCTURED_OUTPUTS):
        path = package / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
                imported = node.module.removeprefix(prefix).lstrip(".") or "__init__"
                if imported not in STRUCTURED_OUTPUTS[index + 1 :]:
                    wrong.append(f"{path.relative_to(REPO_ROOT)} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages one by one (package-dir maps the folders): a new sub-package must be there."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder: name for name, folder in config["package-dir"].items()}
    found = set()
    for folder, name in folders.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(REPO_ROOT / folder).parts]))
    assert found == set(config["packages"])
