"""Kubernetes resource quantities ("500m", "4Gi", "1e3", 8) as exact fractions."""

from __future__ import annotations

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
    match = _PATTERN.match(value.strip())
    if match is None:
        raise CodecError(field, "not a Kubernetes quantity", value)
    number = Fraction(match["num"])
    if match["exp"]:
        power = int(match["exp"][1:])
        # Nothing past this fits any integer we use; the cap keeps "1e999999999" cheap.
        if abs(power) > _MAX_DECIMAL_EXPONENT:
            raise CodecError(field, "quantity exponent out of range", value)
        return number * Fraction(10) ** power
    suffix = match["suffix"] or ""
    if suffix not in _SUFFIXES:
        raise CodecError(field, f"unknown quantity suffix {suffix!r}", value)
    return number * _SUFFIXES[suffix]


def as_int(value: object, field: str = "quantity") -> int | None:
    """The quantity as an integer, or None when it is not a whole number (HAMi's AsInt64)."""
    try:
        parsed = parse_quantity(value, field)
    except CodecError:
        return None
    if parsed.denominator != 1:
        return None
    return int(parsed)
