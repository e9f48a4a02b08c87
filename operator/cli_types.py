"""Option types of the command line that refuse what the operator cannot use, with a
sentence naming what is allowed: click's ``FloatRange`` lets ``nan`` and ``inf`` through,
and a free string let ``--owner-kind a/b/c`` or a namespace no API server accepts reach
the operator, which then failed (or matched nothing) far from the option's name."""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Final

import click

#: Kubernetes' DNS-1123 label (namespaces, Service names) and subdomain (most object
#: names, API groups), as apimachinery's validation defines them.
_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
#: A kind is a DNS-1035 label once lowercased (the CRD validation's rule), which a
#: CamelCase Go type name always is.
_KIND: Final = re.compile(r"[A-Za-z]([-A-Za-z0-9]*[A-Za-z0-9])?")
#: A ConfigMap key (apimachinery's IsConfigMapKey).
_CONFIG_MAP_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")

_LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Seconds(click.ParamType[float]):
    """A finite number of seconds (or of ``unit``, "" for a plain number), at least
    ``minimum`` (above it when ``open_min``): click's ``FloatRange`` takes ``nan`` and
    ``inf``."""

    name = "seconds"

    def __init__(
        self, minimum: float = 0.0, *, open_min: bool = False, unit: str = "seconds"
    ) -> None:
        self.minimum = minimum
        self.open_min = open_min
        self.unit = unit
        self.name = unit or "number"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number{self._of()}; {self._allowed()}", param, ctx)
        too_small = number <= self.minimum if self.open_min else number < self.minimum
        if not math.isfinite(number) or too_small:
            self.fail(f"{value!r} is out of range; {self._allowed()}", param, ctx)
        return number

    def _of(self) -> str:
        return f" of {self.unit}" if self.unit else ""

    def _allowed(self) -> str:
        bound = "above" if self.open_min else "at least"
        return f"give a finite number{self._of()} {bound} {self.minimum:g}"


def Positive() -> Seconds:
    """A finite number above zero (a scaling factor, which ``inf`` would make nonsense)."""
    return Seconds(0.0, open_min=True, unit="")


class KubeName(click.ParamType[str]):
    """A Kubernetes object name: a DNS-1123 label (``label=True``) or subdomain."""

    def __init__(self, what: str, *, label: bool = False, empty_ok: bool = False) -> None:
        self.what = what
        self.label = label
        #: Whether "" is taken (an option whose empty value turns its feature off).
        self.empty_ok = empty_ok
        self.name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text and self.empty_ok:
            return text
        if self.label:
            fits = len(text) <= 63 and _DNS1123_LABEL.fullmatch(text) is not None
            rule = "at most 63 lowercase letters, digits and '-', starting and ending alphanumeric"
        else:
            fits = _is_subdomain(text)
            rule = (
                "at most 253 lowercase letters, digits, '-' and '.', each dot-separated "
                "part starting and ending alphanumeric"
            )
        if not fits:
            self.fail(f"{text!r} is not a valid {self.what}: use {rule}", param, ctx)
        return text


class ConfigMapKey(click.ParamType[str]):
    name = "key"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if len(text) > 253 or not _CONFIG_MAP_KEY.fullmatch(text) or text in (".", ".."):
            self.fail(
                f"{text!r} is not a valid ConfigMap key: use at most 253 letters, digits, "
                "'-', '_' and '.'",
                param,
                ctx,
            )
        return text


class OwnerKind(click.ParamType[str]):
    """``Kind`` or ``group/Kind``, as the defragmentation planner matches owners."""

    name = "[group/]kind"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        group, slash, kind = text.rpartition("/")
        valid_kind = len(kind) <= 63 and _KIND.fullmatch(kind) is not None
        valid_group = not slash or _is_subdomain(group)
        if not (valid_kind and valid_group):
            self.fail(
                f"{text!r} is not a controller kind: give Kind (letters, digits and '-', "
                "starting with a letter, as in LeaderWorkerSet) or group/Kind with a DNS "
                "subdomain as the group (as in example.com/Trainer)",
                param,
                ctx,
            )
        return text


class LogLevel(click.ParamType[str]):
    """One of the standard library's level names, any case; returned upper-case."""

    name = "level"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).upper()
        if text not in _LOG_LEVELS or not isinstance(logging.getLevelName(text), int):
            self.fail(
                f"{value!r} is not a log level: use one of {', '.join(_LOG_LEVELS)}", param, ctx
            )
        return text


def _is_subdomain(text: str) -> bool:
    return len(text) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(text) is not None
