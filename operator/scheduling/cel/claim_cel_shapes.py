"""The CEL selector shapes evaluated on the scheduling loop; every other selector is
evaluated off it, in a process with a deadline (``control/cel_offload.py``).

Tenants write selectors, and a selector's time on the loop is time no other pod is
decided (issue 44: a 357-character selector the API server accepts took 1.6 s a device).
A step budget does not bound time well in a pure-Python interpreter (one step may build a
million strings), so the loop evaluates only shapes whose work is bounded by their text:
the shapes this project writes itself (its DeviceClasses' ``device.driver == "…" &&
device.attributes["…"].mode == "…"``, the webhook's card filters
``["a100"].exists(t, device.attributes["…"].type.lowerAscii().contains(t))`` and
``device.attributes["…"].uuid in ["…"]``), and a tenant's selector of the same shape,
which is as cheap whoever wrote it:

- at most ``claim_cel.INLINE_LENGTH`` characters;
- conditions (``&&``, ``||``, ``!``, ``?:``, comparisons, ``in``) over literals, ``device``
  and its fields, indexed by string literals (``device.attributes["domain"].name``);
- the methods and functions of ``_METHODS`` and ``_FUNCTIONS``, none of which builds a
  value larger than its operand (no ``replace``, ``split``, ``join``, ``+``, ``matches``);
- list literals of at most ``MAX_LIST`` literals, and ``exists``/``all`` only over such a
  list, with a body of the same shapes but no macro.

Such an expression visits at most its own nodes times ``MAX_LIST`` and walks strings no
longer than a device's attribute or its own literals; ``claim_cel.INLINE_STEPS`` stops
the few that still take more than a few milliseconds (an ``all`` over 32 literals whose
body is 15 conditions), which are evaluated off the loop from then on. ``candidate`` is a
look at the text before parsing (parsing is about 40 µs a character), ``inline`` the
check of the parse.
"""

from __future__ import annotations

import re
from typing import Any, Final

import lark

#: Longest expression parsed and evaluated on the scheduling loop.
INLINE_LENGTH: Final = 512
#: Most literals of a list literal, and so of a macro's range, in an inline shape.
MAX_LIST: Final = 32

_METHODS: Final = frozenset(
    {
        "lowerAscii", "upperAscii", "contains", "startsWith", "endsWith", "compareTo",
        "isGreaterThan", "isLessThan",
    }
)  # fmt: skip
_MACROS: Final = frozenset({"exists", "all"})
_FUNCTIONS: Final = frozenset({"quantity", "semver", "has"})
_CALLABLE: Final = _METHODS | _MACROS | _FUNCTIONS
#: Pass-through and condition nodes of celpy's grammar: allowed as they stand (their
#: children are checked), provided an arithmetic node has one child only (no ``+``).
_CONDITIONS: Final = frozenset(
    {
        "expr", "conditionalor", "conditionaland", "relation", "relation_eq", "relation_ne",
        "relation_lt", "relation_le", "relation_gt", "relation_ge", "relation_in", "unary",
        "unary_not", "unary_neg", "member", "primary", "paren_expr", "exprlist",
    }
)  # fmt: skip
_SINGLE_CHILD: Final = frozenset({"addition", "multiplication"})

_STRING_LITERAL: Final = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
_CALLED: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def candidate(expression: str) -> bool:
    """Whether the text may be an inline shape (short, and calling nothing outside the
    allowed names, string literals left out): only then is it parsed on the loop."""
    if len(expression) > INLINE_LENGTH or '"""' in expression or "'''" in expression:
        return False
    code = _STRING_LITERAL.sub('""', expression)
    return all(name in _CALLABLE for name in _CALLED.findall(code))


def inline(tree: lark.Tree[Any]) -> bool:
    """Whether the parsed expression is one of the shapes of the module docstring."""
    return _Shape().fits(tree, frozenset())


def _subtrees(tree: lark.Tree[Any]) -> list[lark.Tree[Any]]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _name(tree: lark.Tree[Any]) -> str:
    tokens = [c for c in tree.children if isinstance(c, lark.Token)]
    return str(tokens[0]) if tokens else ""


def _literal(tree: lark.Tree[Any]) -> bool:
    """Whether the subtree is a literal and nothing else (through pass-through nodes)."""
    return _only(tree, "literal")


def _only(tree: lark.Tree[Any], kind: str) -> bool:
    """Whether the subtree is a node of ``kind`` and nothing else (through pass-through
    nodes: conditions and single-child rules)."""
    node = tree
    while node.data != kind:
        children = _subtrees(node)
        if len(children) != 1 or node.data not in _CONDITIONS | _SINGLE_CHILD:
            return False
        node = children[0]
    return True


def _string_literal(tree: lark.Tree[Any]) -> bool:
    return _literal(tree) and next(tree.scan_values(lambda _: True), "")[:1] in ('"', "'")


class _Shape:
    def fits(self, tree: lark.Tree[Any], scope: frozenset[str]) -> bool:
        kind = str(tree.data)
        if kind == "literal":
            return True
        if kind == "ident":
            return _name(tree) in scope or _name(tree) == "device"
        if kind == "list_lit":
            return self._list(tree)
        if kind == "member_index":
            operand, index = _subtrees(tree)
            return _string_literal(index) and self.fits(operand, scope)
        if kind == "member_dot":
            return self.fits(_subtrees(tree)[0], scope)
        if kind == "member_dot_arg":
            return self._method(tree, scope)
        if kind == "ident_arg":
            return self._function(tree, scope)
        children = _subtrees(tree)
        if kind in _SINGLE_CHILD:
            return len(children) == 1 and self.fits(children[0], scope)
        return kind in _CONDITIONS and all(self.fits(c, scope) for c in children)

    def _list(self, tree: lark.Tree[Any]) -> bool:
        lists = _subtrees(tree)
        items = _subtrees(lists[0]) if lists else []
        return len(items) <= MAX_LIST and all(_literal(i) for i in items)

    def _method(self, tree: lark.Tree[Any], scope: frozenset[str]) -> bool:
        name = _name(tree)
        parts = _subtrees(tree)
        target = parts[0]
        args = _subtrees(parts[1]) if len(parts) > 1 else []
        if name in _MACROS:
            variable = _variable(args)
            return (
                variable is not None
                and not scope  # no macro inside a macro: the ranges would multiply
                and len(args) == 2
                and _is_list_literal(target)
                and self._list(_list_node(target))
                and self.fits(args[1], scope | {variable})
            )
        return name in _METHODS and all(self.fits(p, scope) for p in [target, *args])

    def _function(self, tree: lark.Tree[Any], scope: frozenset[str]) -> bool:
        name = _name(tree)
        parts = _subtrees(tree)
        args = _subtrees(parts[0]) if parts else []
        if name == "has":
            return len(args) == 1 and self.fits(args[0], scope)
        return name in _FUNCTIONS and len(args) == 1 and _string_literal(args[0])


def _variable(args: list[lark.Tree[Any]]) -> str | None:
    """A macro's loop variable: its first argument, a bare identifier."""
    if not args:
        return None
    node = args[0]
    while node.data != "ident":
        children = _subtrees(node)
        if len(children) != 1 or node.data not in _CONDITIONS | _SINGLE_CHILD:
            return None
        node = children[0]
    return _name(node)


def _list_node(tree: lark.Tree[Any]) -> lark.Tree[Any]:
    return next(tree.find_data("list_lit"))


def _is_list_literal(tree: lark.Tree[Any]) -> bool:
    """Whether the subtree is a list literal and nothing else."""
    return _only(tree, "list_lit")
