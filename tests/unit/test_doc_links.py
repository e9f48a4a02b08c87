"""Every relative link in README.md and docs/*.md resolves, and every ``docs/*.md`` the
project names anywhere (manifests' comments, the chart, the code) exists: the
MutatingWebhookConfiguration's comment sent readers to a ``docs/webhook.md`` that was
never written. Paths quoted in backticks resolve too (from the repository root, the
document's folder, the package folder ``operator/`` or ``hack/gpu-check/``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: ``[text](target)`` and ``![alt](target)``, and reference definitions ``[x]: target``.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_QUOTED_PATH = re.compile(r"`([A-Za-z0-9_.\-/]+\.(?:md|yaml|py|json|sh|toml|mk|png))`")
_DOCS_MENTION = re.compile(r"\bdocs/[A-Za-z0-9_.\-/]+\.md\b")
#: Outputs a command writes (not in the repository).
_GENERATED = (".gpu-check/",)
#: Where quoted paths are read from, besides the root and the document's folder.
_BASES = (ROOT / "operator", ROOT / "hack" / "gpu-check")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = _without_code_blocks(document.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.MULTILINE)}


def _links(document: Path) -> list[str]:
    text = _without_code_blocks(document.read_text())
    return [m.group(1) for m in (*_INLINE.finditer(text), *_REFERENCE.finditer(text))]


def _problems(document: Path) -> list[str]:
    problems = []
    for link in _links(document):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("//"):
            continue  # http:, https:, mailto:
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            problems.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            problems.append(f"{link}: no heading #{anchor} in {target.name}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves(document: Path) -> None:
    assert _problems(document) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_quoted_path_exists(document: Path) -> None:
    missing = []
    for match in _QUOTED_PATH.finditer(document.read_text()):
        quoted = match.group(1)
        if quoted.startswith(_GENERATED) or ("/" not in quoted and quoted.endswith(".png")):
            continue
        if "/" not in quoted and not quoted.endswith(".md"):
            continue  # a bare file name (`device-config.yaml`) names no place
        bases = (ROOT, document.parent, *_BASES)
        if not any((base / quoted).exists() for base in bases):
            missing.append(quoted)
    assert missing == []


def _mentioning_files() -> list[Path]:
    found = [*DOCUMENTS, ROOT / "Makefile"]
    for folder, pattern in (
        ("manifests", "*.yaml"),
        ("charts", "*.yaml"),
        ("operator", "*.py"),
        ("hack", "*"),
        ("examples", "*"),
        ("crds", "*.yaml"),
    ):
        found += [p for p in (ROOT / folder).rglob(pattern) if p.is_file()]
    return found


def test_every_docs_page_the_project_names_exists() -> None:
    missing = set()
    for path in _mentioning_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for mention in _DOCS_MENTION.findall(text):
            if not (ROOT / mention).exists():
                missing.add(f"{path.relative_to(ROOT)}: {mention}")
    assert sorted(missing) == []


def test_the_link_check_sees_a_dead_link(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing heading are both reported."""
    (tmp_path / "other.md").write_text("# Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[a](missing.md) [b](other.md#nope) [c](other.md#real-heading) [d](#top)\n# Top\n"
    )
    assert _problems(page) == [
        "missing.md: no such file",
        "other.md#nope: no heading #nope in other.md",
    ]
