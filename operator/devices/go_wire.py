"""Values read and written the way HAMi's Go code reads and writes them.

Go's ``strconv`` (integers with an optional sign and ASCII digits only, its boolean
words) and ``encoding/json`` (no NaN, case-insensitive object keys, ``null`` leaving a
field alone, HTML-safe escapes): the annotation codecs (``codec``) build on these so that
a value HAMi would refuse is refused here too, with ``errors.CodecError`` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from vgpu_operator import errors

# Go integer ranges of the fields HAMi declares as int32 / int / uint.
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1
UINT32_MAX: Final = 2**32 - 1

# Go's strconv.ParseInt with base 10: an optional sign and ASCII digits, nothing else
# (Python's int() would also take spaces, underscores and non-ASCII digits).
_GO_INT_RE: Final = re.compile(r"[+-]?[0-9]+")
UNSIGNED_RE: Final = re.compile(r"[0-9]+")
_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})

# --- scalar parsing --------------------------------------------------------------------


def parse_go_int(text: str, field: str, what: str, low: int, high: int) -> int:
    if _GO_INT_RE.fullmatch(text) is None:
        raise errors.CodecError(field, f"{what} is not an integer: {text!r}", text)
    number = int(text)
    if not low <= number <= high:
        raise errors.CodecError(field, f"{what} {number} is out of range [{low}, {high}]", text)
    return number


def parse_go_bool(text: str, field: str, what: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise errors.CodecError(field, f"{what} is not a boolean: {text!r}", text)


def forbid_separators(text: str, separators: str, field: str, what: str) -> None:
    bad = [s for s in separators if s in text]
    if bad:
        raise errors.CodecError(field, f"{what} {text!r} contains separator {bad[0]!r}", text)


# --- JSON as Go reads it ---------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; Go's does not, and neither fits an integer field.
    raise ValueError(f"{name} is not valid JSON")


def load_json(value: str, field: str) -> Any:
    try:
        return json.loads(value, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise errors.CodecError(field, f"invalid JSON: {exc}", value) from exc


def dump_json_like_go(data: Any) -> str:
    """Compact JSON escaped as Go's json.Marshal escapes it (HTML-safe, U+2028/9)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def json_int(raw: Any, field: str, what: str, low: int, high: int) -> int:
    # bool is an int subclass in Python, but `true` never fits a Go integer field.
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise errors.CodecError(field, f"{what} must be an integer, got {raw!r}")
    if not low <= raw <= high:
        raise errors.CodecError(field, f"{what} {raw} is out of range [{low}, {high}]")
    return raw


def json_str(raw: Any, field: str, what: str) -> str:
    if not isinstance(raw, str):
        raise errors.CodecError(field, f"{what} must be a string, got {raw!r}")
    return raw


def json_bool(raw: Any, field: str, what: str) -> bool:
    if not isinstance(raw, bool):
        raise errors.CodecError(field, f"{what} must be a boolean, got {raw!r}")
    return raw


def go_fields(obj: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Pick HAMi's fields out of a JSON object as Go does: keys match case-insensitively,
    a later key overrides an earlier one, ``null`` leaves the field unset."""
    wanted = {name.lower(): name for name in known}
    picked: dict[str, Any] = {}
    for key, raw in obj.items():
        name = wanted.get(key.lower())
        if name is None:
            continue
        # Go leaves a field untouched when it reads null into it.
        if raw is not None:
            picked[name] = raw
    return picked
