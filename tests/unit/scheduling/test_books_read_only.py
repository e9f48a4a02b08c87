"""The books' view is read-only in fact (issue 45, item 3): what ``BooksView`` hands out
(node and pod entries, the maps of them, the PodGroups and their claims) refuses a write at
run time, as ``mypy`` refuses it; and no module outside the books writes their state
behind their writer (``control/``, ``scheduling/gangs/``: no private reach into the
books, no in-place change of an entry)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from builders import make_pod
from unit.scheduling.test_claim_books import NODE, state

from vgpu_operator.scheduling.books.overlay import Overlay
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.cluster import ClusterState

PACKAGE = Path(__file__).resolve().parents[3] / "operator"


def _engine() -> ClusterState:
    engine = state()
    bound = (
        make_pod("w0", "ml").container(gpu=1, gpumem=1000).on_node(NODE, "GPU-0,NVIDIA,1000,0:;")
    )
    obj = bound.obj()
    obj["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    engine.set_pod(obj)
    engine.books.note_pod_group("ml/g", {"spec": {"disruptionMode": {"single": {}}}})
    return engine


@pytest.mark.parametrize("kind", ["live", "overlay"])
def test_a_write_through_the_view_fails(kind: str) -> None:
    engine = _engine()
    view: BooksView = engine.books if kind == "live" else Overlay(engine.books)
    node = view.nodes[NODE]
    entry = view.pods["ml/w0"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.score = 99.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.dirty = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.reserved = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.nodes["other"] = node  # type: ignore[index]
    with pytest.raises(TypeError):
        view.pods["ml/other"] = entry  # type: ignore[index]
    with pytest.raises(TypeError):
        del view.pods["ml/w0"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        view.group_claims["ml/g"] = None  # type: ignore[index]
    with pytest.raises(AttributeError):
        view.groups.note("ml/g", None)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        view.groups.joined(entry)  # type: ignore[attr-defined]
    # Nothing changed: the writes were refused, not half done.
    assert engine.books.pods["ml/w0"] is entry
    assert not entry.reserved
    assert list(engine.books.groups.members("ml/g")) == ["ml/w0"]
    assert engine.books.groups.rule("ml/g") is not None


def test_the_writers_changes_show_through_the_views_a_reader_holds() -> None:
    """The views are live and cost no copy: what the writer does later shows in them."""
    engine = _engine()
    pods, groups, claims = engine.books.pods, engine.books.groups, engine.books.group_claims
    engine.books.note_pod_group("ml/g", None)
    assert groups.rule("ml/g") is None
    assert "ml/g" not in claims
    engine.remove_pod("ml/w0")
    assert "ml/w0" not in pods
    assert list(groups.members("ml/g")) == []


def _modules(*parts: str) -> list[Path]:
    found: list[Path] = []
    for part in parts:
        where = PACKAGE.joinpath(*part.split("/"))
        found.extend(sorted(where.rglob("*.py")) if where.is_dir() else [where])
    assert found, parts
    return found


def _private_reaches_into_books(path: Path) -> list[str]:
    """``<something books>._name`` reads or calls, and in-place writers of entries."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = ast.unparse(node.value)
            if "books" in owner and not node.attr.startswith("__"):
                found.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
        if isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in ("change_node", "__setattr__"):
                found.append(f"{path.name}:{node.lineno}: {name}")
        if isinstance(node, ast.ImportFrom) and any(a.name == "change_node" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: imports change_node")
    return found


def test_control_and_gangs_call_no_private_mutator_of_the_books() -> None:
    paths = _modules("control", "scheduling/gangs", "simulation_gangs.py")
    assert [hit for path in paths for hit in _private_reaches_into_books(path)] == []


def test_only_the_books_change_an_entry_in_place() -> None:
    """``change_node`` is the books' own key to their frozen node entries."""
    books = PACKAGE / "scheduling" / "books"
    outside = [p for p in PACKAGE.rglob("*.py") if books not in p.parents]
    hits = [h for p in outside for h in _private_reaches_into_books(p) if "change_node" in h]
    assert hits == []


def test_the_check_sees_a_private_reach(tmp_path: Path) -> None:
    """The scan above finds what it looks for (a write through ``books._pods``)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f(state):\n    state.books._pods.clear()\n    change_node(state)\n")
    assert len(_private_reaches_into_books(sample)) == 2
