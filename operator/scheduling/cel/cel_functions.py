"""Kubernetes' CEL library for DRA's device selectors (``claim_cel``): quantities and
semantic versions with their methods, and the string extension functions, each bounded
in what it may build (``MAX_STRING``), as the Kubernetes API server bounds them."""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final, cast

from celpy import celtypes

from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError


class CelBudgetExceeded(Exception):
    """Raised inside an evaluation that ran out of steps (becomes CelTooCostly)."""


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
        return celtypes.IntType(next((n for n, e in enumerate(s) if e == sub), -1))
    text, needle, offset = _string(s, "indexOf"), _string(sub, "indexOf"), _index(start)
    if offset < 0:
        raise _out_of_range(offset)
    if needle == "":
        return celtypes.IntType(min(offset, len(text)))
    if offset >= len(text):
        return celtypes.IntType(-1)
    return celtypes.IntType(text.find(needle, offset))


def _last_index_of(s: Any, sub: Any, *start: Any) -> celtypes.IntType:
    if isinstance(s, list):
        found = [n for n, e in enumerate(s) if e == sub]
        return celtypes.IntType(found[-1] if found else -1)
    text, needle = _string(s, "lastIndexOf"), _string(sub, "lastIndexOf")
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
    text, first = _string(s, "substring"), _index(start)
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


def _lower_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_string(s, "lowerAscii").translate(_TO_LOWER))


def _upper_ascii(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_string(s, "upperAscii").translate(_TO_UPPER))


def _trim(s: Any) -> celtypes.StringType:
    return celtypes.StringType(_string(s, "trim").strip(_GO_SPACE))


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
    if len(text) + times * max(0, len(after) - len(before)) > MAX_STRING:
        raise CelBudgetExceeded(f"replace would build more than {MAX_STRING} characters")
    return _text(text.replace(before, after, count))


def _split(s: Any, sep: Any, n: Any = -1) -> celtypes.ListType:
    text, separator, limit = _string(s, "split"), _string(sep, "split"), _index(n)
    if limit == 0:
        return celtypes.ListType()
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
    return _text(separator.join(_string(i, "join") for i in items))


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
