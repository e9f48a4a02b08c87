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

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, cast

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError


class CelRefused(Exception):
    """The expression cannot be evaluated here; the message says why."""


class CelRuntimeError(Exception):
    """The expression failed on a device (kube-scheduler refuses the whole claim then)."""


# --- Kubernetes' quantity and semver types --------------------------------------------------


class Quantity(celtypes.StringType):
    """A Kubernetes quantity as CEL sees it (``quantity("10Gi")``, a device's capacity)."""

    value: Fraction

    def __new__(cls, text: str) -> Quantity:
        try:
            value = parse_quantity(text, "quantity")
        except CodecError as exc:
            raise ValueError(str(exc)) from None
        made = cast(Quantity, super().__new__(cls, text))
        made.value = value
        return made


_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)


class Version(celtypes.StringType):
    """A semantic version (``semver("1.2.3")``, an attribute of kind ``version``)."""

    parts: tuple[int, int, int]
    pre: str

    def __new__(cls, text: str) -> Version:
        match = _SEMVER.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version")
        made = cast(Version, super().__new__(cls, text))
        made.parts = (int(match[1]), int(match[2]), int(match[3]))
        made.pre = match[4] or ""
        return made

    def key(self) -> tuple[tuple[int, int, int], int, str]:
        # A pre-release sorts before its release (simplified: pre-releases by text).
        return (self.parts, 0 if self.pre else 1, self.pre)


def _compare(a: Any, b: Any) -> celtypes.IntType:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        left: Any = a.value
        right: Any = b.value
    elif isinstance(a, Version) and isinstance(b, Version):
        left, right = a.key(), b.key()
    else:
        raise TypeError(f"compareTo needs two quantities or two versions, not {a!r} and {b!r}")
    return celtypes.IntType((left > right) - (left < right))


def _quantity(text: Any) -> Quantity:
    return Quantity(str(text))


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        Quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(text: Any, *_normalize: Any) -> Version:
    return Version(str(text))


def _is_semver(text: Any, *_normalize: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER.match(str(text)) is not None)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value.denominator != 1:
        raise ValueError(f"quantity {q} is not an integer")
    return celtypes.IntType(int(q.value))


def _number(value: Fraction) -> Quantity:
    if value.denominator == 1:
        return Quantity(str(value.numerator))
    return Quantity(f"{float(value)!r}")


def _add(q: Quantity, other: Any) -> Quantity:
    amount = other.value if isinstance(other, Quantity) else Fraction(int(other))
    return _number(q.value + amount)


def _sub(q: Quantity, other: Any) -> Quantity:
    amount = other.value if isinstance(other, Quantity) else Fraction(int(other))
    return _number(q.value - amount)


def _str(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A string function whose result is a CEL string (or list of them)."""

    def wrapped(*args: Any) -> Any:
        result = fn(*args)
        if isinstance(result, str):
            return celtypes.StringType(result)
        if isinstance(result, list):
            return celtypes.ListType([celtypes.StringType(s) for s in result])
        return result

    return wrapped


def _split(s: str, sep: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    return s.split(sep, limit - 1) if limit > 0 else s.split(sep)


#: Kubernetes' CEL library beyond CEL's standard functions, as far as a device selector
#: can use it: quantities, semantic versions, and the string extensions.
FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "isInteger": lambda q: celtypes.BoolType(q.value.denominator == 1),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "add": _add,
    "sub": _sub,
    "major": lambda v: celtypes.IntType(v.parts[0]),
    "minor": lambda v: celtypes.IntType(v.parts[1]),
    "patch": lambda v: celtypes.IntType(v.parts[2]),
    "lowerAscii": _str(lambda s: s.lower()),
    "upperAscii": _str(lambda s: s.upper()),
    "trim": _str(lambda s: s.strip()),
    "replace": _str(lambda s, old, new, n=-1: s.replace(old, new, int(n))),
    "split": _str(lambda s, sep, n=-1: _split(s, sep, int(n))),
    "join": _str(lambda items, sep="": sep.join(items)),
    "indexOf": lambda s, sub, start=0: celtypes.IntType(s.find(sub, int(start))),
    "lastIndexOf": lambda s, sub: celtypes.IntType(s.rfind(sub)),
    "substring": _str(lambda s, start, end=None: s[int(start) : None if end is None else int(end)]),
    "charAt": _str(lambda s, i: s[int(i)] if int(i) < len(s) else ""),
}

#: CEL's own functions and macros that celpy provides.
_STANDARD: Final = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches", "has", "all", "exists",
        "exists_one", "map", "filter", "int", "uint", "double", "string", "bool", "bytes",
        "type", "dyn", "duration", "timestamp",
    }
)  # fmt: skip
SUPPORTED: Final = _STANDARD | frozenset(FUNCTIONS)


# --- the device variable ----------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled selector."""

    expression: str
    program: Any

    def matches(self, device: DeviceView) -> bool:
        """Whether the device is selected; raises CelRuntimeError when the expression
        fails on it (a missing attribute, a wrong type) or yields no bool."""
        try:
            result = self.program.evaluate(activation(device))
        except CELEvalError as exc:
            detail = exc.args[0] if exc.args else exc
            raise CelRuntimeError(f"{self.expression!r}: {detail}") from None
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
            raise CelRuntimeError(f"{self.expression!r}: {exc}") from None
        if not isinstance(result, celtypes.BoolType):
            raise CelRuntimeError(f"{self.expression!r} yields {result!r}, not a bool")
        return bool(result)


def compile_selector(expression: str) -> Selector:
    """Raises CelRefused for an expression that does not parse or that calls a function
    the engine does not provide."""
    try:
        tree = _ENV.compile(expression)
    except CELParseError as exc:
        raise CelRefused(f"CEL expression {expression!r} does not parse here: {exc}") from None
    unknown = sorted(_called_names(tree) - SUPPORTED)
    if unknown:
        raise CelRefused(
            f"CEL expression {expression!r} calls {', '.join(unknown)}, which this scheduler "
            "does not evaluate"
        )
    return Selector(expression, _ENV.program(tree, functions=FUNCTIONS))


class SelectorCache:
    """Compiled selectors, and each one's verdict per device (a verdict depends only on
    the device as published, so it holds until the device's slice changes: the key the
    caller gives must change with it)."""

    def __init__(self) -> None:
        self._compiled: dict[str, Selector | CelRefused] = {}
        self._verdicts: dict[tuple[str, Any], bool | CelRuntimeError] = {}

    def compile(self, expression: str) -> Selector:
        found = self._compiled.get(expression)
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
            try:
                verdict = selector.matches(device)
            except CelRuntimeError as exc:
                verdict = exc
            self._verdicts[key] = verdict
        if isinstance(verdict, CelRuntimeError):
            raise verdict
        return verdict

    def forget_devices(self, keep: Callable[[Any], bool]) -> None:
        """Drop verdicts of devices no longer published (keep those ``keep`` accepts)."""
        self._verdicts = {k: v for k, v in self._verdicts.items() if keep(k[1])}
