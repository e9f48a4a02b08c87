"""Errors for bad input. Rejections (a pod that does not fit) are values, not errors."""

from __future__ import annotations


class VgpuError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(VgpuError):
    """A configuration value is invalid; `field` names it (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CodecError(VgpuError):
    """An annotation or wire value could not be decoded; `field` names the key."""

    def __init__(self, field: str, message: str, value: str | None = None) -> None:
        shown = "" if value is None else f" (value {value[:120]!r})"
        super().__init__(f"{field}: {message}{shown}")
        self.field = field
        self.message = message
        self.value = value


class ScenarioError(VgpuError):
    """A simulate scenario is malformed; `field` names the offending path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
