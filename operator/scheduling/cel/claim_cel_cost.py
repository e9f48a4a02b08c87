"""A CEL selector's static cost, estimated as the API server estimates it.

The API server refuses a device selector whose worst-case cost, as cel-go's checker
estimates it (``checker/cost.go`` with Kubernetes' size bounds for the ``device``
variable), exceeds ``resource.k8s.io``'s ``CELSelectorExpressionMaxCost`` (1,000,000).
This module follows the same model over the parsed expression, close enough to land on
the same side of that limit for what selectors are written of (literals, comparisons,
attribute and capacity look-ups, calls, macros over lists):

- a literal costs 0, a name or field selection 1, an index 1, a call 1 (``&&``, ``||``
  and ``?:`` add no call cost: ``?:`` costs its condition and its dearer branch);
- a list literal 10 plus its elements, a map literal 30 plus its entries;
- a string function that walks its operand (``contains``, ``lowerAscii``, ``==`` on
  strings...) 1 plus a tenth of the operand's worst-case length;
- a string function that builds (``replace``, ``split``, ``join``, ``+``) is costed, and
  its result sized, as Kubernetes' library does (``apiserver/pkg/cel/library/cost.go``):
  ``replace`` and ``split`` a fifth of their operand's length (a walk and a copy), and
  ``replace`` may yield its operand with every shortest match of the replaced string
  replaced by the longest replacement, so that chained replaces grow (two hundredfold
  replaces of a 100-character literal yield a million characters, and a ``split`` of
  that costs 200,000); ``join`` a tenth of what it may yield (every element at its
  longest, and the separators);
- a macro (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) its range plus, per
  element, its body and the loop's own steps (3 for the predicates: the loop condition
  and the accumulator; about 12 for ``map``/``filter``, which build a list).

Worst-case sizes are Kubernetes' for a device: a map of domains or names holds at most
32 entries (``ResourceSliceMaxAttributesAndCapacitiesPerDevice``), a string attribute
at most 64 characters (``DeviceAttributeMaxValueLength``), a list literal exactly its
length. The expression's depth is bounded before this runs (``claim_cel``), so the walk
may recurse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

import lark

#: ``resource.k8s.io``'s ``CELSelectorExpressionMaxCost``.
MAX_COST: Final = 1_000_000
#: Worst-case entries of ``device.attributes``/``device.capacity`` and each domain's map.
MAP_ENTRIES: Final = 32
#: Worst-case length of a string (an attribute's value, the driver's name) or of a list
#: whose size nothing bounds better.
VALUE_LENGTH: Final = 64

_MACROS: Final = {"all": 3, "exists": 3, "exists_one": 3, "map": 12, "filter": 12}
_WALKS_STRING: Final = frozenset(
    {"contains", "startsWith", "endsWith", "indexOf", "lastIndexOf", "charAt"}
)
#: Functions whose result is a scalar (a bool, a number, one character).
_SCALAR_RESULTS: Final = frozenset(
    {
        "contains", "startsWith", "endsWith", "indexOf", "lastIndexOf", "charAt", "size",
        "matches", "compareTo", "isGreaterThan", "isLessThan", "asInteger", "sign",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Cost:
    cost: int
    #: Worst-case size of the value (length of a string, entries of a list or map).
    size: int = VALUE_LENGTH
    #: Least size of the value (a literal's exactly; anything else may be empty).
    least: int = 0
    #: Worst-case size of each element, for a list.
    item: int = VALUE_LENGTH


def estimate(tree: lark.Tree[Any]) -> int:
    """The expression's worst-case cost."""
    return _Estimator().of(tree).cost


def _walk(size: int) -> int:
    return math.ceil(0.1 * size)


def _children(tree: lark.Tree[Any]) -> list[lark.Tree[Any]]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _tokens(tree: lark.Tree[Any]) -> list[lark.Token]:
    return [c for c in tree.children if isinstance(c, lark.Token)]


class _Estimator:
    def __init__(self) -> None:
        #: Comprehension variables in scope -> their worst-case size.
        self._scope: dict[str, int] = {}

    def of(self, tree: lark.Tree[Any]) -> Cost:
        method = getattr(self, "_" + str(tree.data), None)
        if method is not None:
            result: Cost = method(tree)
            return result
        return self._sum(tree)

    def _sum(self, tree: lark.Tree[Any], extra: int = 0) -> Cost:
        """Unknown or pass-through node: its children's cost; one child passes its sizes."""
        parts = [self.of(c) for c in _children(tree)]
        if len(parts) == 1:
            return replace(parts[0], cost=parts[0].cost + extra)
        return Cost(sum(p.cost for p in parts) + extra, VALUE_LENGTH)

    # --- operators ------------------------------------------------------------------
    def _expr(self, tree: lark.Tree[Any]) -> Cost:
        parts = [self.of(c) for c in _children(tree)]
        if len(parts) == 3:  # cond ? a : b
            dearer = max(parts[1:], key=lambda p: p.cost)
            return Cost(parts[0].cost + dearer.cost, max(parts[1].size, parts[2].size))
        return parts[0]

    def _relation(self, tree: lark.Tree[Any]) -> Cost:
        parts = [self.of(c) for c in _children(tree)]
        if len(parts) == 1:
            return parts[0]
        # relation_xx(left) right
        op_tree = _children(tree)[0]
        left, right = parts
        if op_tree.data == "relation_in":
            return Cost(left.cost + right.cost + 1 + right.size, 1)
        if op_tree.data in ("relation_eq", "relation_ne"):
            return Cost(left.cost + right.cost + 1 + _walk(min(left.size, right.size)), 1)
        return Cost(left.cost + right.cost + 1, 1)

    def _addition(self, tree: lark.Tree[Any]) -> Cost:
        parts = [self.of(c) for c in _children(tree)]
        if len(parts) == 1:
            return parts[0]
        left, right = parts
        size = left.size + right.size
        item = max(left.item, right.item)
        return Cost(left.cost + right.cost + 1 + _walk(size), size, item=item)

    def _multiplication(self, tree: lark.Tree[Any]) -> Cost:
        return self._sum(tree, 1 if len(_children(tree)) > 1 else 0)

    def _unary(self, tree: lark.Tree[Any]) -> Cost:
        parts = [self.of(c) for c in _children(tree)]
        if len(parts) == 1:
            return parts[0]
        return Cost(parts[-1].cost + 1, parts[-1].size)  # ! or - applied

    # --- values -----------------------------------------------------------------------
    def _literal(self, tree: lark.Tree[Any]) -> Cost:
        token = _tokens(tree)[0]
        if token.type in ("STRING_LIT", "MLSTRING_LIT", "BYTES_LIT"):
            least, most = _string_sizes(str(token))
            return Cost(0, most, least)
        return Cost(0, 1, 1)

    def _ident(self, tree: lark.Tree[Any]) -> Cost:
        name = str(_tokens(tree)[0])
        return Cost(1, self._scope.get(name, VALUE_LENGTH))

    def _list_lit(self, tree: lark.Tree[Any]) -> Cost:
        items = self._items(tree)
        longest = max((i.size for i in items), default=0)
        return Cost(10 + sum(i.cost for i in items), len(items), len(items), longest)

    def _map_lit(self, tree: lark.Tree[Any]) -> Cost:
        items = self._items(tree)
        return Cost(30 + sum(i.cost for i in items), len(items) // 2)

    def _items(self, tree: lark.Tree[Any]) -> list[Cost]:
        lists = _children(tree)
        return [self.of(e) for e in _children(lists[0])] if lists else []

    def _member_dot(self, tree: lark.Tree[Any]) -> Cost:
        operand = self.of(_children(tree)[0])
        name = str(_tokens(tree)[0])
        size = MAP_ENTRIES if name in ("attributes", "capacity") else VALUE_LENGTH
        return Cost(operand.cost + 1, size)

    def _member_index(self, tree: lark.Tree[Any]) -> Cost:
        operand, index = (self.of(c) for c in _children(tree))
        # An index into a domain's map (or a domain's names) yields a map of names; into
        # a list known to hold larger values (a split's), one of those.
        size = operand.item if operand.item > VALUE_LENGTH else MAP_ENTRIES
        return Cost(operand.cost + index.cost + 1, size)

    # --- calls ------------------------------------------------------------------------
    def _member_dot_arg(self, tree: lark.Tree[Any]) -> Cost:
        trees = _children(tree)
        name = str(_tokens(tree)[0])
        target = self.of(trees[0])
        args = _children(trees[1]) if len(trees) > 1 else []
        step = _MACROS.get(name)
        if step is not None and len(args) >= 2:
            return self._macro(name, step, target, args)
        costs = [self.of(a) for a in args]
        spent = target.cost + sum(c.cost for c in costs) + 1
        built = _string_call(name, target, costs)
        if built is not None:
            return replace(built, cost=spent + built.cost)
        call = 0
        if name in _WALKS_STRING:
            call += _walk(target.size)
        if name == "matches" and costs:
            call += _walk(target.size) * math.ceil(0.25 * costs[0].size)
        size = 1 if name in _SCALAR_RESULTS else target.size
        return Cost(spent + call, size)

    def _macro(self, name: str, step: int, target: Cost, args: list[lark.Tree[Any]]) -> Cost:
        """A comprehension: its range, and per element its body and the loop's steps;
        the loop variable is as large as the range's elements."""
        variable = _variable(args[0])
        saved = self._scope.get(variable) if variable else None
        if variable:
            self._scope[variable] = target.item
        try:
            bodies = [self.of(a) for a in args[1:]]
        finally:
            if variable and saved is not None:
                self._scope[variable] = saved
            elif variable:
                self._scope.pop(variable, None)
        cost = target.cost + target.size * (sum(b.cost for b in bodies) + step)
        if name == "map":
            return Cost(cost, target.size, item=bodies[-1].size)
        if name == "filter":
            return Cost(cost, target.size, item=target.item)
        return Cost(cost, 1)

    def _ident_arg(self, tree: lark.Tree[Any]) -> Cost:
        name = str(_tokens(tree)[0])
        trees = _children(tree)
        args = [self.of(a) for a in _children(trees[0])] if trees else []
        call = 1
        if name == "matches" and len(args) == 2:
            call += _walk(args[0].size) * math.ceil(0.25 * args[1].size)
        size = args[0].size if args else 1
        return Cost(sum(a.cost for a in args) + call, size)


def _string_sizes(token: str) -> tuple[int, int]:
    """A string literal's least and largest length (its characters between the quotes;
    an escape may stand for fewer, so an escaped literal's least is 0)."""
    body = token.lstrip("rRbB")
    quotes = 3 if body[:3] in ('"""', "'''") else 1
    most = max(0, len(body) - 2 * quotes)
    return (0 if "\\" in body else most), most


def _string_call(name: str, target: Cost, args: list[Cost]) -> Cost | None:
    """A string function that yields a string or list as large as what it walks or
    builds: its own cost (beyond the call's 1) and its result's sizes, as Kubernetes'
    library estimates them; None for any other function."""
    if name in ("lowerAscii", "upperAscii", "trim", "substring"):
        return Cost(_walk(target.size), target.size)
    if name == "replace" and len(args) >= 2:
        return Cost(2 * _walk(target.size), _replaced_size(target, args[0], args[1]))
    if name == "split":
        # Split by "" yields every character; a literal limit bounds the parts.
        parts = args[1].size if len(args) > 1 and args[1].least == args[1].size else target.size
        return Cost(2 * _walk(target.size), parts, item=target.size)
    if name == "join":
        separators = max(0, target.size - 1) * (args[0].size if args else 0)
        size = target.size * target.item + separators
        return Cost(_walk(size), size)
    return None


def _replaced_size(target: Cost, old: Cost, new: Cost) -> int:
    """The longest a ``replace`` may yield: each shortest match of ``old`` replaced by the
    longest ``new`` (an empty ``old`` matches around every character)."""
    if old.least == 0:
        return (target.size + 1) * new.size + target.size
    if new.size <= old.least:
        return target.size
    return math.ceil(target.size / old.least) * new.size


def _variable(tree: lark.Tree[Any]) -> str | None:
    """The loop variable a macro's first argument names (an ident)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.data == "ident":
            return str(_tokens(node)[0])
        stack.extend(reversed(_children(node)))
    return None
