"""The engine takes typed inputs (issue 45, item 4): pods, nodes, claims, slices, classes,
quotas, budgets and PodGroups are the ``wire`` shapes in ``scheduling/``, not
``Mapping[str, Any]``.

The few mappings left are JSON that has no shape of ours (a CEL input, a Karpenter
NodePool, whose template is copied into a NodeClaim as written); a new one fails here
with where it is, so the count only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SCHEDULING = Path(__file__).resolve().parents[3] / "operator" / "scheduling"

#: (module, the function or class field that takes it), each with why it stays untyped.
ALLOWED = {
    # The CEL environment's device map: attribute values of any of CEL's types.
    ("cel/claim_cel.py", "_by_domain"),
    # A Karpenter NodePool: read defensively field by field; its template is copied whole.
    ("autoscale/catalogue.py", "NodePool.template"),
    ("autoscale/catalogue.py", "read_node_pool"),
}


def _untyped(path: Path, root: Path = SCHEDULING) -> set[tuple[str, str]]:
    """Where ``path`` annotates a parameter, a return or a field ``Mapping[str, Any]``."""
    tree = ast.parse(path.read_text(), str(path))
    shown = str(path.relative_to(root))
    found: set[tuple[str, str]] = set()

    def untyped(annotation: ast.expr | None) -> bool:
        return annotation is not None and "Mapping[str, Any]" in ast.unparse(annotation)

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if untyped(node.returns) or any(untyped(a.annotation) for a in arguments):
                found.add((shown, node.name))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and untyped(item.annotation):
                    target = ast.unparse(item.target)
                    found.add((shown, f"{node.name}.{target}"))
    return found


def test_the_engine_takes_wire_shapes_not_untyped_mappings() -> None:
    found: set[tuple[str, str]] = set()
    for path in sorted(SCHEDULING.rglob("*.py")):
        found |= _untyped(path)
    new = sorted(found - ALLOWED)
    assert not new, (
        f"these take Mapping[str, Any] in scheduling/: {new}; take the shape from "
        "vgpu_operator.wire (a pod is a wire.Pod, a claim a wire.ResourceClaim...), or add "
        "the shape there"
    )
    assert found == ALLOWED, f"no longer untyped, remove from ALLOWED: {sorted(ALLOWED - found)}"


def test_the_check_finds_an_untyped_parameter(tmp_path: Path) -> None:
    module = tmp_path / "mod.py"
    module.write_text(
        "from typing import Any\nfrom collections.abc import Mapping\n\n"
        "def read(pod: Mapping[str, Any]) -> None: ...\n\n"
        "class Held:\n    obj: Mapping[str, Any] | None\n"
    )
    assert _untyped(module, tmp_path) == {("mod.py", "read"), ("mod.py", "Held.obj")}
