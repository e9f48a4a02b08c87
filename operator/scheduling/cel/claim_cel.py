"""DRA's CEL device selectors, evaluated as kube-scheduler evaluates them.

A DeviceClass or a claim request selects devices with CEL expressions over one variable,
``device``: ``driver``, ``allowMultipleAllocations``, ``attributes`` and ``capacity``, each
of the last two a map from a domain to that domain's names (a short attribute name belongs
to the device's driver: ``device.attributes["gpu.vgpu-operator.io"].index``). As upstream
(``k8s.io/dynamic-resource-allocation/cel``): an unknown domain reads as an empty map, an
unknown name in a domain is a runtime error; a capacity is a quantity, an attribute of
kind ``version`` a semantic version.

The implementation is ``cel-python`` (``celpy``), a pure-Python CEL interpreter: it lets
us add Kubernetes' own functions with their types (quantities and versions with methods,
the string extension library) and reports errors as values, with CEL's commutative
``&&`` and ``||``. The Rust-backed ``common-expression-language`` evaluates faster but
converts every value to a plain CEL type, so a quantity could not keep its methods; the
slower interpreter is paid once per expression and device (``SelectorCache``), which is
what a cluster's repeated templates need. Expressions are checked when compiled: one that
does not parse (CEL's optional syntax ``.?``/``[?`` among them) or calls a function outside
the supported set is refused with a message naming it (``CelRefused``), instead of failing
later per device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator

from vgpu_operator.scheduling.cel import claim_cel_cost, claim_cel_shapes
from vgpu_operator.scheduling.cel.cel_functions import (
    FUNCTIONS,
    SUPPORTED,
    CelBudgetExceeded,
    CostBudget,
    Quantity,
    Version,
    spending,
)


class CelRefused(Exception):
    """The expression cannot be evaluated here; the message says why."""


class CelRuntimeError(Exception):
    """The expression failed on a device (kube-scheduler refuses the whole claim then)."""


class CelTooCostly(CelRuntimeError):
    """The evaluation ran past this scheduler's runtime bound (steps or wall time)."""


class CelPending(Exception):
    """The verdict is being computed off the scheduling loop; decide the pod again later."""


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What a selector sees of one device. ``attributes`` and ``capacity`` are keyed by
    their fully qualified names (``domain/name``; short names already qualified with the
    driver); attribute values are ``(kind, value)`` as the slice types them."""

    driver: str
    allow_multiple: bool
    attributes: Mapping[str, tuple[str, Any]]
    capacity: Mapping[str, str]


class _DomainMap(celtypes.MapType):
    """``device.attributes``/``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if not super().__contains__(key):
            return celtypes.MapType()
        return super().__getitem__(key)


def _attribute(kind: str, value: Any) -> Any:
    if kind == "int":
        return celtypes.IntType(int(value))
    if kind == "bool":
        return celtypes.BoolType(bool(value))
    if kind == "version":
        return Version(str(value))
    return celtypes.StringType(str(value))


def _by_domain(values: Mapping[str, Any], convert: Callable[[Any], Any]) -> _DomainMap:
    domains: dict[str, dict[Any, Any]] = {}
    for qualified, value in values.items():
        domain, _, name = qualified.rpartition("/")
        domains.setdefault(domain, {})[celtypes.StringType(name)] = convert(value)
    return _DomainMap(
        {celtypes.StringType(d): celtypes.MapType(names) for d, names in domains.items()}
    )


def activation(device: DeviceView) -> dict[str, Any]:
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(device.driver),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    device.allow_multiple
                ),
                celtypes.StringType("attributes"): _by_domain(
                    device.attributes, lambda kv: _attribute(*kv)
                ),
                celtypes.StringType("capacity"): _by_domain(device.capacity, Quantity),
            }
        )
    }


# --- compiling and evaluating -------------------------------------------------------------

#: ``resource.k8s.io``'s ``CELSelectorExpressionMaxLength``.
MAX_LENGTH: Final = 10 * 1024
#: The deepest parse tree compiled. The interpreter recurses about four Python frames per
#: tree level (celpy raises the recursion limit to 2,500), so 300 levels stay far inside
#: it wherever the engine is called from. A level of parentheses is ten tree levels, a
#: chained ``&&``/``||`` one, a chained ``+`` or comparison two: about 30 nested
#: parentheses or 250 chained conditions.
MAX_DEPTH: Final = 300
#: Evaluation steps (parse-tree nodes visited) one verdict may take: about half a second
#: of the interpreter. Past it the claim is refused; kube-scheduler's own bound is its
#: runtime cost limit (1,000,000), which a slower interpreter cannot afford.
MAX_STEPS: Final = 100_000
#: Steps an evaluation on the scheduling loop may take (a few milliseconds): a bound
#: that the shapes evaluated there (``claim_cel_shapes``) stay far inside; a selector
#: that needs more is evaluated off the loop from then on (``SelectorCache.deferring``).
INLINE_STEPS: Final = 2_000
#: Static cost above which a selector is never tried on the loop, whatever its shape.
INLINE_COST: Final = 2_000
#: Longest expression compiled on the loop (parsing takes about 40 µs a character);
#: a longer one is compiled, checked and evaluated off the loop.
INLINE_LENGTH: Final = claim_cel_shapes.INLINE_LENGTH

_ENV: Final = celpy.Environment()


def _called_names(tree: Any) -> set[str]:
    """Every function or method name the parsed expression calls."""
    names: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and len(node.children) >= 2:
            names.add(str(node.children[1]))
        elif node.data == "ident_arg" and node.children:
            names.add(str(node.children[0]))
    return names


def _depth(tree: Any) -> int:
    """The parse tree's depth, without recursing."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    return deepest


class _BoundedEvaluator(Evaluator):
    """celpy's interpreter, charging a step per node it visits (macro bodies included) to
    the evaluation's budget, which the string functions charge too (``cel_functions``)."""

    def __init__(self, ast: Any, activation: Any, budget: CostBudget) -> None:
        super().__init__(ast, activation)
        self._budget = budget

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _BoundedEvaluator(ast, self.activation, self._budget)

    def _visit_tree(self, tree: Any) -> Any:
        # lark's Interpreter visits every node through here (``visit`` only the root).
        budget = self._budget
        budget.left -= 1
        if budget.left < 0:
            raise CelBudgetExceeded("ran out of evaluation steps")
        return super()._visit_tree(tree)


#: The most characters of an expression a message quotes (a tenant's may be 10 KiB).
SHOWN_LENGTH: Final = 80


def shown(expression: str) -> str:
    """The expression as messages quote it (a long one cut)."""
    cut = len(expression) > SHOWN_LENGTH
    return repr(expression[:SHOWN_LENGTH] + "..." if cut else expression)


def refusal(where: str, exc: CelRuntimeError) -> str:
    """The sentence that refuses a claim whose selector failed or ran out of bounds:
    ``where`` names the claim and request, the error the selector and what to change."""
    if isinstance(exc, CelTooCostly):
        return f"{where}: {exc}"
    return f"{where}: CEL runtime error: {exc}"


def _advice(spent: str) -> str:
    """What to change in a selector that ran out of its budget (``spent`` says where)."""
    if "budget at" in spent or "would build" in spent:
        return "build shorter strings and lists: fewer or smaller replace, split, join, +"
    return "smaller list literals, fewer nested all/exists/map/filter"


def _detail(exc: CELEvalError) -> str:
    """celpy's error, with the function's own words when it raised them."""
    args = exc.args
    if len(args) >= 3 and args[2]:
        return " ".join(str(a) for a in args[2])
    return str(args[0]) if args else str(exc)


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled selector."""

    expression: str
    program: Any
    #: Its static cost, as the API server estimates it.
    cost: int = 0
    #: Whether its verdicts are computed off the scheduling loop only.
    off_loop: bool = False

    def matches(self, device: DeviceView, steps: int = MAX_STEPS) -> bool:
        """Whether the device is selected; raises CelRuntimeError when the expression
        fails on it (a missing attribute, a wrong type) or yields no bool, CelTooCostly
        when it takes more than ``steps`` evaluation steps."""
        try:
            with spending(CostBudget(steps)) as budget:
                evaluator = _BoundedEvaluator(
                    self.program.ast, self.program.new_activation(), budget
                )
                result = evaluator.evaluate(activation(device))
        except CelBudgetExceeded as exc:
            raise CelTooCostly(
                f"{shown(self.expression)} {exc} (more than {steps} steps on a device of "
                f"{device.driver}): this scheduler evaluates CEL more slowly than "
                f"kube-scheduler; make the selector cheaper ({_advice(str(exc))})"
            ) from None
        except CELEvalError as exc:
            raise CelRuntimeError(f"{shown(self.expression)}: {_detail(exc)}") from None
        except RecursionError:
            raise CelTooCostly(f"{shown(self.expression)} nests too deeply to evaluate") from None
        except Exception as exc:  # a library function's own failure is the selector's
            raise CelRuntimeError(f"{shown(self.expression)}: {exc}") from None
        if not isinstance(result, celtypes.BoolType):
            raise CelRuntimeError(f"{shown(self.expression)} yields {result!r}, not a bool")
        return bool(result)


def compile_selector(expression: str) -> Selector:
    """Raises CelRefused for an expression that is too long, too deep or too costly (as
    the API server estimates it), that does not parse, or that calls a function the engine
    does not provide."""
    if len(expression) > MAX_LENGTH:
        raise CelRefused(
            f"CEL expression of {len(expression)} characters is longer than "
            f"{MAX_LENGTH} (the API server's limit); shorten it"
        )
    quoted = shown(expression)
    try:
        tree = _ENV.compile(expression)
    except CELParseError as exc:
        raise CelRefused(f"CEL expression {quoted} does not parse here: {exc}") from None
    except RecursionError:
        raise CelRefused(f"CEL expression {quoted} nests too deeply to parse") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise CelRefused(
            f"CEL expression {quoted} nests too deeply for this scheduler (its parse tree "
            f"is {depth} levels deep, at most {MAX_DEPTH} here: about 30 nested "
            "parentheses or 250 chained conditions); flatten it, or split it into several "
            "selectors (a request's selectors must all match)"
        )
    unknown = sorted(_called_names(tree) - SUPPORTED)
    if unknown:
        raise CelRefused(
            f"CEL expression {quoted} calls {', '.join(unknown)}, which this scheduler "
            "does not evaluate"
        )
    cost = claim_cel_cost.estimate(tree)
    if cost > claim_cel_cost.MAX_COST:
        raise CelRefused(
            f"CEL expression {quoted} is too complex: its estimated cost {cost} exceeds "
            f"the limit {claim_cel_cost.MAX_COST} (as the API server estimates it); use "
            "smaller list literals or fewer nested macros"
        )
    # Only the shapes of ``claim_cel_shapes`` are evaluated on the scheduling loop: a
    # step budget bounds the work of any other, not its time there.
    off_loop = cost > INLINE_COST or not claim_cel_shapes.inline(tree)
    return Selector(expression, _ENV.program(tree, functions=FUNCTIONS), cost, off_loop)


#: A verdict: selected or not, or the error the expression raised on the device.
Verdict = bool | CelRuntimeError
#: Where a request's selectors were written: its DeviceClass's name and how many of the
#: selectors are the class's (they come first; the request's own follow).
Written = tuple[str, int]


def position(index: int, written: Written) -> str:
    """How a message names a request's ``index``-th selector."""
    class_name, of_class = written
    if index < of_class:
        return f"DeviceClass {class_name}'s selectors[{index}]"
    return f"selectors[{index - of_class}]"


def compile_all(
    cache: SelectorCache, expressions: Sequence[str], written: Written
) -> tuple[Selector, ...]:
    """A request's selectors, compiled; CelRefused names the one refused."""
    compiled = []
    for index, expression in enumerate(expressions):
        try:
            compiled.append(cache.compile(expression))
        except CelRefused as exc:
            raise CelRefused(f"{position(index, written)}: {exc}") from None
    return tuple(compiled)


def all_select(
    selectors: Sequence[Selector],
    cache: SelectorCache,
    key: Any,
    view: DeviceView,
    written: Written,
) -> bool:
    """Whether every selector selects the device. A CelRuntimeError (of the kind raised)
    names the selector that failed; CelPending passes as the cache raises it."""
    for index, selector in enumerate(selectors):
        try:
            if not cache.matches(selector, key, view):
                return False
        except CelRuntimeError as exc:
            raise type(exc)(f"{position(index, written)} {exc}") from None
    return True


class SelectorCache:
    """Compiled selectors, and each one's verdict per device (a verdict depends only on
    the device as published, so it holds until the device's slice changes: the key the
    caller gives must change with it).

    By default a missing verdict is computed at once (bounded by ``MAX_STEPS``): the CLI's
    simulation and tests. The operator sets ``deferring``: then only a cheap selector is
    evaluated on the scheduling loop (at most ``INLINE_STEPS``); any other missing verdict
    is queued (``take_pending``) for an evaluator off the loop, which ``record``s it, and
    ``matches`` raises CelPending meanwhile."""

    #: Expressions whose compilation and verdicts are kept: tenants write the expressions,
    #: so the cache forgets the least recently used beyond this (their verdicts with them).
    MAX_EXPRESSIONS: Final = 4096

    def __init__(self) -> None:
        self.deferring = False
        #: Every expression with something cached, least recently used first.
        self._recent: dict[str, None] = {}
        self._compiled: dict[str, Selector | CelRefused] = {}
        self._verdicts: dict[tuple[str, Any], Verdict] = {}
        #: Pairs waiting for the evaluator, with the device as the selector sees it.
        self._pending: dict[tuple[str, Any], DeviceView] = {}
        #: Pairs handed to the evaluator and not recorded yet.
        self._in_flight: set[tuple[str, Any]] = set()
        #: Every device a selector was asked about: a costly selector is sent for all of
        #: them at once, not node by node as decisions meet them.
        self._devices: dict[Any, DeviceView] = {}
        #: Expressions that ran past INLINE_STEPS on the loop once.
        self._costly: set[str] = set()
        #: Whether a ``matches`` raised CelPending since ``pending_seen`` was last asked.
        self._pending_seen = False

    def _touch(self, expression: str) -> None:
        self._recent.pop(expression, None)
        self._recent[expression] = None
        if len(self._recent) > self.MAX_EXPRESSIONS:
            self._forget_oldest(len(self._recent) - self.MAX_EXPRESSIONS * 3 // 4)

    def _forget_oldest(self, count: int) -> None:
        """Forget the ``count`` least recently used expressions (a quarter at a time, so
        the verdicts are filtered once per many insertions)."""
        oldest = list(self._recent)[:count]
        gone = set(oldest)
        for expression in oldest:
            del self._recent[expression]
            self._compiled.pop(expression, None)
        self._costly -= gone
        self._verdicts = {k: v for k, v in self._verdicts.items() if k[0] not in gone}
        self._pending = {k: v for k, v in self._pending.items() if k[0] not in gone}
        self._in_flight = {k for k in self._in_flight if k[0] not in gone}

    def compile(self, expression: str) -> Selector:
        self._touch(expression)
        found = self._compiled.get(expression)
        if found is None and self.deferring and not claim_cel_shapes.candidate(expression):
            # Not even parsed on the loop (too long, or it calls what no inline shape
            # calls): checked and evaluated off the loop, a refusal comes back as its
            # verdicts.
            return Selector(expression, None, off_loop=True)
        if found is None:
            try:
                found = compile_selector(expression)
            except CelRefused as exc:
                found = exc
            self._compiled[expression] = found
        if isinstance(found, CelRefused):
            raise found
        return found

    def matches(self, selector: Selector, device_key: Any, device: DeviceView) -> bool:
        key = (selector.expression, device_key)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._evaluate(selector, key, device)
        if isinstance(verdict, CelRuntimeError):
            raise verdict
        return verdict

    def _evaluate(self, selector: Selector, key: tuple[str, Any], device: DeviceView) -> Verdict:
        verdict: Verdict = False
        if self.deferring:
            self._devices[key[1]] = device
            if not selector.off_loop and selector.expression not in self._costly:
                try:
                    verdict = selector.matches(device, INLINE_STEPS)
                except CelTooCostly:
                    self._costly.add(selector.expression)  # all its pairs off the loop now
                except CelRuntimeError as exc:
                    verdict = exc
                if selector.expression not in self._costly:
                    self._verdicts[key] = verdict
                    return verdict
            if key not in self._in_flight:
                self._pending[key] = device
            self._pending_seen = True
            raise CelPending(
                "its CEL selectors are being evaluated off the scheduling loop; the pod is "
                "decided again when the verdicts are in"
            )
        try:
            verdict = selector.matches(device)
        except CelRuntimeError as exc:
            verdict = exc
        self._verdicts[key] = verdict
        return verdict

    def pending_seen(self) -> bool:
        """Whether a decision met a pending verdict since the last call (and reset)."""
        seen, self._pending_seen = self._pending_seen, False
        return seen

    def take_pending(self) -> list[tuple[str, Any, DeviceView]]:
        """The pairs to evaluate off the loop, now in flight: each queued pair, and for a
        selector queued, every other device seen so far without its verdict."""
        expressions = {e for e, _ in self._pending}
        for expression in expressions:
            for device_key, view in self._devices.items():
                pair = (expression, device_key)
                if pair not in self._verdicts and pair not in self._in_flight:
                    self._pending.setdefault(pair, view)
        taken = [(e, k, v) for (e, k), v in self._pending.items()]
        self._in_flight.update(self._pending)
        self._pending.clear()
        return taken

    def release(self, expression: str, device_key: Any) -> None:
        """A pair handed out and not evaluated: the next decision that meets it asks again."""
        self._in_flight.discard((expression, device_key))

    def record(self, expression: str, device_key: Any, verdict: Verdict) -> None:
        """An evaluator's verdict for one pair."""
        pair = (expression, device_key)
        self._in_flight.discard(pair)
        if expression not in self._recent:
            return  # forgotten meanwhile: the next decision that needs it asks again
        if device_key in self._devices or not self.deferring:
            self._verdicts[pair] = verdict

    def forget_devices(self, keep: Callable[[Any], bool]) -> None:
        """Drop verdicts of devices no longer published (keep those ``keep`` accepts)."""
        self._verdicts = {k: v for k, v in self._verdicts.items() if keep(k[1])}
        self._devices = {k: v for k, v in self._devices.items() if keep(k)}
        self._pending = {k: v for k, v in self._pending.items() if keep(k[1])}
        self._in_flight = {k for k in self._in_flight if keep(k[1])}
