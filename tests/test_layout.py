"""The server's packages import one way, in request order, and only the engine client and hashing below them.

`pyfront.server`'s docstring states the order; a module that imported a package before its own in that
order (say `text` importing `generate`) would make the request path loop back on itself.
"""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

ORDER = ["api", "generate", "chat", "text"]
"""The request path's packages, outermost first: each may import only those after it."""
SHARED = {"openai", "state", "errors", "config", "metrics"}
"""What every package may use: the request types, the serving state, the error table, settings, metrics."""


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
