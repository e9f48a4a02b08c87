#!/usr/bin/env python3
"""Structure rules that ruff and mypy cannot state (issue 34), checked on the AST.

- No cross-module private reach in ``operator/``: ``obj._x`` where ``_x`` is not defined in
  the module that writes it (a private attribute, method or module global of another
  module), and no ``from ... import _x`` of another module's private name.
- No class in ``operator/scheduling/`` (its sub-packages included) inherits from another
  class of ours, unless the base is an enum, an error, a Protocol, a NamedTuple or a
  TypedDict.
- Anywhere in ``operator/``: no function over ``MAX_FUNCTION_LINES`` lines, no module over
  ``MAX_MODULE_LINES`` lines (issue 45).
- A public class name (a module-level class not starting with ``_``) is defined in one
  module of ``operator/`` only, the wire shapes of ``operator/wire/`` aside: a newcomer
  who reads ``Verdict`` knows which one (issue 45).
- Vendor words stay in ``operator/devices/``: no string outside it (docstrings aside)
  holds a vendor's resource name or annotation key (``nvidia.com/gpu``,
  ``hami.io/node-dcu-register``); the code elsewhere asks the vendor table
  (``devices.catalog``), so adding a vendor touches ``devices/`` only (issue 45).

Generated stubs (``*_pb2.py``) are not checked. Findings listed in
``hack/structure-baseline.txt`` (``path: rule: text``, no line numbers) are the debt left
from before the rules: they are reported as counts, and one that is gone must leave the
list (so it only shrinks). Exits 1 and prints each finding that is not listed, and each
listed one that is gone. ``--report`` prints the counts per rule and always exits 0.
Usage: ``python hack/check_structure.py [--report] [ROOT]``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "vgpu_operator"
#: The package of typed wire shapes (the API's objects as TypedDicts), whose names follow
#: the API's kinds and so may repeat a class name used elsewhere.
WIRE_SHAPES = "wire"
#: The folder vendor words belong in.
VENDOR_HOME = "devices"
#: A resource name or annotation key (``prefix/name``) that names a vendor or its device
#: kind: the vendors HAMi serves (their domains and HAMi's per-vendor keys).
VENDOR_WORD = re.compile(
    r"[\w.-]*(nvidia|hygon|dcu|cambricon|mlu|huawei|ascend|metax|iluvatar|mthreads|enflame"
    r"|kunlun)[\w.-]*/|/[\w.-]*(nvidia|hygon|dcu|cambricon|mlu|ascend|metax|iluvatar"
    r"|mthreads|enflame|kunlun)",
    re.IGNORECASE,
)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
#: Private names the standard library makes public (namedtuple, sys, os).
STDLIB_PRIVATE = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"})
#: Bases that make a class one of the kinds allowed to inherit.
EXEMPT_ROOTS = frozenset(
    {
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "IntFlag",
        "Exception",
        "BaseException",
        "ValueError",
        "KeyError",
        "RuntimeError",
        "LookupError",
        "TypeError",
        "Protocol",
        "NamedTuple",
        "TypedDict",
        "Generic",
    }
)


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    path: str
    line: int
    text: str
    #: What changes with unrelated edits (a length), left out of the baseline's name.
    detail: str = ""

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.path}:{self.line}: {self.rule}: {self.text}{detail}"

    @property
    def listed(self) -> str:
        """How the baseline names it (no line number: edits elsewhere move it)."""
        return f"{self.path}: {self.rule}: {self.text}"


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


def _own_names(tree: ast.Module) -> set[str]:
    """Every private name the module defines: attributes it assigns (``x._y = ...``),
    methods, functions, classes, module globals, class fields and slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if n.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in STDLIB_PRIVATE


def private_reaches(path: Path, tree: ast.Module, shown: str) -> Iterator[Finding]:
    own = _own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _is_private(alias.name):
                    yield Finding("private-import", shown, node.lineno, alias.name)
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                if node.attr in own:
                    continue
            elif node.attr in own:
                continue
            yield Finding("private-reach", shown, node.lineno, ast.unparse(node))


class ClassIndex:
    """Every class of the package by name, with its bases' names."""

    def __init__(self) -> None:
        self.bases: dict[str, set[str]] = {}

    def add(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found = {_base_name(b) for b in node.bases} - {""}
                self.bases.setdefault(node.name, set()).update(found)

    def exempt(self, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether the class is an enum, error, Protocol, NamedTuple or TypedDict."""
        if name in EXEMPT_ROOTS or name.endswith("Error"):
            return True
        if name in seen or name not in self.bases:
            return False
        return any(self.exempt(b, seen | {name}) for b in self.bases[name])


def inheritance(tree: ast.Module, shown: str, index: ClassIndex) -> Iterator[Finding]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            name = _base_name(base)
            if name in index.bases and not index.exempt(name):
                yield Finding("inherits", shown, node.lineno, f"{node.name}({name})")


def sizes(tree: ast.Module, shown: str, source: str) -> Iterator[Finding]:
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        yield Finding("module-lines", shown, 1, f"over {MAX_MODULE_LINES}", f"{lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                text = f"{node.name} over {MAX_FUNCTION_LINES}"
                yield Finding("function-lines", shown, node.lineno, text, f"{length} lines")


def class_names(trees: dict[str, ast.Module]) -> Iterator[Finding]:
    """Each definition of a public module-level class name that another module (the wire
    shapes aside) defines too."""
    defined: dict[str, list[tuple[str, int]]] = {}
    for shown, tree in trees.items():
        if Path(shown).parts[1:2] == (WIRE_SHAPES,):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append((shown, node.lineno))
    for name, places in sorted(defined.items()):
        if len(places) < 2:
            continue
        for shown, line in places:
            others = ", ".join(p for p, _ in places if p != shown)
            yield Finding("class-name", shown, line, f"{name} also in {others}")


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants (prose may give a vendor's name as an example)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def vendor_words(tree: ast.Module, shown: str) -> Iterator[Finding]:
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found = VENDOR_WORD.search(node.value)
            if found:
                yield Finding("vendor-word", shown, node.lineno, repr(node.value[:60]))


def check(root: Path) -> list[Finding]:
    package = root / "operator"
    trees = {
        path: (path.read_text(), ast.parse(path.read_text(), str(path)))
        for path in sorted(package.rglob("*.py"))
        if not path.name.endswith("_pb2.py")
    }
    index = ClassIndex()
    for _source, tree in trees.values():
        index.add(tree)
    findings: list[Finding] = []
    for path, (source, tree) in trees.items():
        shown = str(path.relative_to(root))
        parts = path.relative_to(package).parts
        findings.extend(private_reaches(path, tree, shown))
        findings.extend(sizes(tree, shown, source))
        if parts[0] == "scheduling":  # and its sub-packages
            findings.extend(inheritance(tree, shown, index))
        if parts[0] != VENDOR_HOME and not path.name.endswith("_pb2_grpc.py"):
            findings.extend(vendor_words(tree, shown))
    findings.extend(
        class_names(
            {
                str(path.relative_to(root)): tree
                for path, (_source, tree) in trees.items()
                if not path.name.endswith("_pb2_grpc.py")
            }
        )
    )
    return findings


def read_baseline(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--report", action="store_true", help="print counts, always pass")
    args = parser.parse_args(argv)
    root = Path(args.root)
    findings = check(root)
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.rule] = counts.get(finding.rule, 0) + 1
    if args.report:
        for rule in RULES:
            print(f"{rule}: {counts.get(rule, 0)}")
        return 0
    left = read_baseline(root / "hack" / "structure-baseline.txt")
    failed = False
    for finding in findings:
        if finding.listed in left:
            left.remove(finding.listed)
        else:
            print(finding)
            failed = True
    for gone in left:
        print(f"hack/structure-baseline.txt: listed but gone (remove the line): {gone}")
        failed = True
    return 1 if failed else 0


RULES = (
    "private-reach",
    "private-import",
    "inherits",
    "module-lines",
    "function-lines",
    "class-name",
    "vendor-word",
)

if __name__ == "__main__":
    sys.exit(main())
