"""Kubernetes' CEL library for DRA's device selectors (``claim_cel``): quantities and
semantic versions with their methods, and the string extension functions, each bounded
in what it may build (``MAX_STRING``), as the Kubernetes API server bounds them.

Each function that walks or builds strings or lists is charged to the evaluation's
``CostBudget`` before it does the work, as cel-go's runtime cost charges it (a tenth of a
step per character walked or built: ``replace`` and ``split`` their operand twice,
``join`` its result twice, ``+`` both operands, ``contains`` the product of both
lengths), plus a step per element a function builds: this interpreter makes an object per
element, which costs about what a step does, where cel-go's cost model counts none. A
``split("")`` of a million characters is thus refused before it builds a million strings
(1.6 s of this interpreter), where only its steps were counted before."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from fractions import Fraction
from typing import Any, Final, cast

from celpy import celtypes
from celpy import evaluation as celpy_evaluation

from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError


class CelBudgetExceeded(Exception):
    """Raised inside an evaluation that ran out of steps (becomes CelTooCostly)."""


class CostBudget:
    """What one evaluation may still spend, in steps: a parse-tree node visited is one,
    a function's walk or build what ``charge`` says."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def spend(self, steps: int, what: str) -> None:
        self.left -= steps
        if self.left < 0:
            raise CelBudgetExceeded(what)


_BUDGET: ContextVar[CostBudget | None] = ContextVar("cel_budget", default=None)


@contextlib.contextmanager
def spending(budget: CostBudget) -> Iterator[CostBudget]:
    """Charge the functions called meanwhile (in this thread) to ``budget``."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def charge(characters: int, elements: int, what: str) -> None:
    """Charge the current evaluation a tenth of a step per character walked or built and
    a step per element built, before the work is done (no budget: not evaluating)."""
    budget = _BUDGET.get()
    if budget is not None:
        steps = math.ceil(0.1 * characters) + elements
        budget.spend(steps, f"ran out of its budget at {what}")


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


#: The longest string a string function may build (a selector's strings are an
#: attribute's 64 characters or literals of a 10 KiB expression; ``replace`` chained on
#: a literal could otherwise grow without bound between two evaluation steps).
MAX_STRING: Final = 1 << 20


def _text(value: str) -> celtypes.StringType:
    if len(value) > MAX_STRING:
        raise CelBudgetExceeded(f"a string function built {len(value)} characters")
    return celtypes.StringType(value)


def _string(value: Any, function: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{function} needs a string, not {type(value).__name__}")
    return str(value)


def _index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"an index must be an int, not {type(value).__name__}")
    return int(value)


def _out_of_range(index: int) -> ValueError:
    # cel-go's ext.Strings says exactly this for charAt, indexOf, lastIndexOf, substring.
    return ValueError(f"index out of range: {index}")


# cel-go's ext.Strings (v0.29, Kubernetes 1.37's; ``ext/strings.go``): indexes count code
# points, a negative index is an error and so is one past the end for charAt and
# substring (indexOf and lastIndexOf answer -1 there), the case functions change ASCII
# letters only, trim strips what Go's unicode.IsSpace calls space.


def _char_at(s: Any, i: Any) -> celtypes.StringType:
    text, index = _string(s, "charAt"), _index(i)
    if index < 0 or index > len(text):
        raise _out_of_range(index)
    return celtypes.StringType(text[index : index + 1])


def _index_of(s: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    if isinstance(s, list):  # Kubernetes' lists library: the first equal element
        charge(0, len(s), f"indexOf, which would walk a list of {len(s)}")
        return celtypes.IntType(next((n for n, e in enumerate(s) if e == sub), -1))
    text, needle, offset = _walked(s, "indexOf"), _string(sub, "indexOf"), _index(start)
    if offset < 0:
        raise _out_of_range(offset)
    if needle == "":
        return celtypes.IntType(min(offset, len(text)))
    if offset >= len(text):
        return celtypes.IntType(-1)
    return celtypes.IntType(text.find(needle, offset))


def _last_index_of(s: Any, sub: Any, *start: Any) -> celtypes.IntType:
    if isinstance(s, list):
        charge(0, len(s), f"lastIndexOf, which would walk a list of {len(s)}")
        found = [n for n, e in enumerate(s) if e == sub]
        return celtypes.IntType(found[-1] if found else -1)
    text, needle = _walked(s, "lastIndexOf"), _string(sub, "lastIndexOf")
    if not start:
        if needle == "":
            return celtypes.IntType(len(text))
        offset = len(text) - 1
    else:
        offset = _index(start[0])
    if offset < 0:
        if not start:
            return celtypes.IntType(-1)  # an empty string holds nothing
        raise _out_of_range(offset)
    if needle == "":
        return celtypes.IntType(min(offset, len(text)))
    if offset >= len(text):
        return celtypes.IntType(-1)
    # A match starting at ``offset`` or before it.
    return celtypes.IntType(text.rfind(needle, 0, offset + len(needle)))


def _substring(s: Any, start: Any, *end: Any) -> celtypes.StringType:
    text, first = _walked(s, "substring"), _index(start)
    last = _index(end[0]) if end else len(text)
    if first > last:
        raise ValueError(f"invalid substring range. start: {first}, end: {last}")
    if first < 0 or first > len(text):
        raise _out_of_range(first)
    if last < 0 or last > len(text):
        raise _out_of_range(last)
    return celtypes.StringType(text[first:last])


_TO_LOWER: Final = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_TO_UPPER: Final = {c + 32: c for c in range(ord("A"), ord("Z") + 1)}
#: Go's unicode.IsSpace (strings.TrimSpace): Python's str.strip also strips \x1c-\x1f.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _walked(s: Any, function: str) -> str:
    """``s`` as a string, its walk charged (cel-go: a tenth of a step per character)."""
    text = _string(s, function)
    charge(len(text), 0, f"{function}, which would walk {len(text)} characters")
    return text


def _lower_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_walked(s, "lowerAscii").translate(_TO_LOWER))


def _upper_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_walked(s, "upperAscii").translate(_TO_UPPER))


def _trim(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_walked(s, "trim").strip(_GO_SPACE))


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> celtypes.StringType:
    text, before, after, count = (
        _string(s, "replace"),
        _string(old, "replace"),
        _string(new, "replace"),
        _index(n),
    )
    # Bound the result before building it (see MAX_STRING).
    times = text.count(before) if before else len(text) + 1
    if count >= 0:
        times = min(times, count)
    size = len(text) + times * (len(after) - len(before))
    if size > MAX_STRING:
        raise CelBudgetExceeded(f"replace would build more than {MAX_STRING} characters")
    walked = f"replace, which would walk {len(text)} and build {size} characters"
    charge(len(text) + size, 0, walked)
    return _text(text.replace(before, after, count))


def _split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    text, separator, limit = _string(s, "split"), _string(sep, "split"), _index(n)
    if limit == 0:
        return celtypes.ListType()
    pieces = len(text) if separator == "" else text.count(separator) + 1
    if limit > 0:
        pieces = min(pieces, limit)
    charge(
        2 * len(text),
        pieces,
        f"split, which would walk {len(text)} characters and build {pieces} strings of them",
    )
    if separator == "":  # Go: into code points, the last one holding the rest
        parts = (
            list(text)
            if limit < 0 or limit >= len(text)
            else [*text[: limit - 1], text[limit - 1 :]]
        )
    else:
        parts = text.split(separator, limit - 1) if limit > 0 else text.split(separator)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(items: Any, sep: Any = "") -> celtypes.StringType:
    if not isinstance(items, list):
        raise TypeError("join needs a list of strings")
    separator = _string(sep, "join")
    parts = [_string(i, "join") for i in items]
    size = sum(len(p) for p in parts) + len(separator) * max(0, len(parts) - 1)
    if size > MAX_STRING:
        raise CelBudgetExceeded(f"join would build more than {MAX_STRING} characters")
    charge(2 * size, 0, f"join, which would build {size} characters")
    return _text(separator.join(parts))


# --- CEL's standard functions that walk or build, charged ------------------------------


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, dict)) else 1


def _concatenate(a: Any, b: Any) -> Any:
    """``+``: a concatenation (strings, lists) is charged both operands, as cel-go's
    runtime cost charges a string's; numbers add as celpy adds them."""
    if isinstance(a, (str, list)) and isinstance(b, (str, list)):
        size = _sized(a) + _sized(b)
        if isinstance(a, str) and size > MAX_STRING:
            raise CelBudgetExceeded(f"+ would build more than {MAX_STRING} characters")
        elements = size if isinstance(a, list) else 0
        charge(size, elements, f"+, which would build {size} characters or elements")
    return a + b


def _contains(s: Any, sub: Any) -> Any:
    if isinstance(s, str) and isinstance(sub, str):
        walk = math.ceil(0.1 * len(s)) * max(1, math.ceil(0.1 * len(sub)))
        charge(0, walk, f"contains, which would walk {len(s)} characters")
    return celpy_evaluation.function_contains(s, sub)


def _starts_with(s: Any, prefix: Any) -> Any:
    charge(_sized(prefix), 0, "startsWith")
    return celpy_evaluation.function_startsWith(s, prefix)


def _ends_with(s: Any, suffix: Any) -> Any:
    charge(_sized(suffix), 0, "endsWith")
    return celpy_evaluation.function_endsWith(s, suffix)


def _matches(text: Any, pattern: Any) -> Any:
    # cel-go: the walk of the text times a quarter of the pattern's length.
    steps = math.ceil(0.1 * (1 + _sized(text))) * math.ceil(0.25 * _sized(pattern))
    charge(0, steps, f"matches, which would walk {_sized(text)} characters")
    return celpy_evaluation.function_matches(text, pattern)


def _in(item: Any, container: Any) -> Any:
    if isinstance(container, list):
        charge(0, len(container), f"in, which would walk a list of {len(container)}")
    return celpy_evaluation.operator_in(item, container)


#: Kubernetes' CEL library beyond CEL's standard functions, as far as a device selector
#: can use it: quantities, semantic versions, and the string extensions; and CEL's own
#: functions that walk or build, charged.
FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "_+_": _concatenate,
    "_in_": _in,
    "contains": _contains,
    "startsWith": _starts_with,
    "endsWith": _ends_with,
    "matches": _matches,
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
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "trim": _trim,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _substring,
    "charAt": _char_at,
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
