"""References into docs/engine-protocol.md resolve: every reference to a section of it in the repository
(the file path, `#`, the heading's anchor) and every `(#anchor)` link inside the document names a heading
that exists.

Code comments cite sections by anchor instead of copying the facts, so a renamed heading must fail here
rather than leave dangling pointers.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "engine-protocol.md"
SEARCHED = ("engine_client", "hashing", "server", "tests", "benchmarks", "tools", "docker", "docs", "README.md")
REFERENCE = re.compile(r"docs/engine-protocol\.md((?:#[a-z0-9-]+)?)")
CHAINED = re.compile(r"(?:^|[\s(,])(#[a-z0-9][a-z0-9-]*)\b")  # "... and #outputs" after a full reference


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return "#" + text.replace(" ", "-")


def anchors() -> set[str]:
    found = set()
    in_code = False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(github_anchor(line.lstrip("#")))
    return found


def test_the_document_exists_and_its_own_links_resolve() -> None:
    known = anchors()
    assert {"#handshake", "#front-end-block-hashing-feh", "#block-hash-recipe"} <= known
    internal = set(re.findall(r"\]\((#[a-z0-9-]+)\)", DOC.read_text()))
    assert internal and internal <= known, sorted(internal - known)


def test_every_reference_in_the_repository_resolves() -> None:
    known = anchors()
    bad: list[str] = []
    checked = 0
    for top in SEARCHED:
        base = ROOT / top
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix not in (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ""):
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for line_no, line in enumerate(text.splitlines(), 1):
                for match in REFERENCE.finditer(line):
                    checked += 1
                    fragments = [match.group(1)] if match.group(1) else []
                    fragments += CHAINED.findall(line[match.end() :])
                    for fragment in fragments:
                        if fragment not in known:
                            bad.append(f"{path.relative_to(ROOT)}:{line_no}: {fragment}")
    assert checked > 20
    assert not bad, "\n".join(bad)
