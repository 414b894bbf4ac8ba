"""The docs point at things that exist: every relative link and its anchor, and every path architecture.md names."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([\w./-]+)`")
PATH_LIKE = re.compile(r"(?:[\w-]+/)+[\w.-]*|[\w-]+\.(?:py|lua|sh)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#+ (.*)", line)
        if heading:
            name = slug(heading.group(1))
            count = seen.get(name, 0)
            seen[name] = count + 1
            found.add(name if count == 0 else f"{name}-{count}")  # GitHub numbers repeated headings
    return found


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = doc.parent / path if path else doc
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    return broken


def missing_paths(doc: Path, files: list[str]) -> list[str]:
    """Paths in backticks: a full one (its first folder at the root) must exist as written; a name given
    relative to its package's row must end some file or folder of the repository."""
    missing = []
    for token in sorted(set(CODE.findall(doc.read_text()))):
        if not PATH_LIKE.fullmatch(token):
            continue
        if (ROOT / token.split("/")[0]).is_dir() and "/" in token:
            found = (ROOT / token).exists()
        else:
            found = any(name.endswith("/" + token.rstrip("/")) for name in files)
        if not found:
            missing.append(token)
    return missing


def repository_files() -> list[str]:
    """Every file and folder under the root as "/a/b", hidden folders (.git, .venv) and caches left unwalked."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name != "__pycache__"]
        base = "/" + str(Path(folder).relative_to(ROOT))
        found += [f"{base}/{name}" for name in (*subfolders, *files)]
    return found


def test_every_relative_link_and_anchor_in_the_docs_resolves() -> None:
    assert {str(doc.relative_to(ROOT)): found for doc in DOCS if (found := broken_links(doc))} == {}


def test_every_path_architecture_names_exists() -> None:
    assert missing_paths(ROOT / "docs" / "architecture.md", repository_files()) == []


def test_the_checks_see_a_stale_path_and_a_stale_anchor(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Top\n`gateway/relay.py`, `executor/model.py`, `gateway/app.py`\n[a](doc.md#top) [b](doc.md#gone)\n")
    assert missing_paths(doc, repository_files()) == ["executor/model.py", "gateway/relay.py"]
    assert broken_links(doc) == ["doc.md#gone"]
