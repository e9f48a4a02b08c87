"""Kubernetes resource quantities ("500m", "4Gi", "1e3", 8) as exact fractions."""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Final

from vgpu_operator.errors import CodecError

_SUFFIXES: Final[dict[str, Fraction]] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_MAX_DECIMAL_EXPONENT: Final = 40
_PATTERN: Final = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>[a-zA-Z]{0,2}))$"
)


def parse_quantity(value: object, field: str = "quantity") -> Fraction:
    """Parse a quantity exactly; raise CodecError naming ``field`` when malformed."""
    if isinstance(value, bool):
        raise CodecError(field, "expected a quantity, got a boolean", str(value))
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise CodecError(field, "expected a finite quantity", str(value))
        return Fraction(value)
    if not isinstance(value, str):
        raise CodecError(field, "expected a quantity string or number", repr(value))
    parsed = _parse_text(value)
    if isinstance(parsed, str):
        raise CodecError(field, parsed, value)
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction | str:
    """The quantity a string spells, or why it spells none. Cached: every decision reads
    the same few strings ("1", "8192", "4Gi") again, and ``Fraction`` arithmetic is the
    costly part; the cache is bounded, so odd strings cannot grow it."""
    match = _PATTERN.match(text.strip())
    if match is None:
        return "not a Kubernetes quantity"
    number = Fraction(match["num"])
    if match["exp"]:
        power = int(match["exp"][1:])
        # Nothing past this fits any integer we use; the cap keeps "1e999999999" cheap.
        if abs(power) > _MAX_DECIMAL_EXPONENT:
            return "quantity exponent out of range"
        return number * Fraction(10) ** power
    suffix = match["suffix"] or ""
    if suffix not in _SUFFIXES:
        return f"unknown quantity suffix {suffix!r}"
    return number * _SUFFIXES[suffix]


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def parse_whole(value: object, field: str = "quantity") -> int:
    """Read a quantity that must be a whole number (``Quantity.AsInt64``): ``"32768"``,
    ``"1k"`` (1000), ``"1Ki"`` (1024), ``"1.5Ki"`` (1536), ``"2e3"``. Fractions
    (``"1.5"``, ``"500m"``), values outside int64 and anything unparsable raise
    ``CodecError`` naming ``field``. The one integer reader of the project."""
    amount = parse_quantity(value, field)
    if amount.denominator != 1:
        raise CodecError(field, f"quantity {value!r} is not a whole number")
    whole = int(amount)
    if not _INT64_MIN <= whole <= _INT64_MAX:
        raise CodecError(field, f"quantity {value!r} does not fit in int64")
    return whole


def as_int(value: object, field: str = "quantity") -> int | None:
    """``parse_whole``, or None when the value is not a readable whole number (for callers
    where a missing or bad value means "unknown", never "none requested")."""
    try:
        return parse_whole(value, field)
    except CodecError:
        return None
