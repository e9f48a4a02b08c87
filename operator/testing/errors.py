"""The control plane's errors and the JSON alias its modules share."""

from __future__ import annotations

import json
from typing import Any, TypeVar

JSON = dict[str, Any]

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, or a request to it failed."""


class BinariesNotFoundError(ControlPlaneError):
    """kube-apiserver, etcd or kwok is missing; ``make control-plane-bins`` builds them."""


class AdminRequestError(ControlPlaneError):
    """A request made with :meth:`ControlPlane.request` got an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        self.reason: str = parsed.get("reason", "") if isinstance(parsed, dict) else ""
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
