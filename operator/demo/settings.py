"""The demo's fixed names, its error and its one polling helper."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from vgpu_operator import names

Json = dict[str, Any]

Say = Callable[[str], None]

_T = TypeVar("_T")

#: The device-config ConfigMap (and its namespace) the operator is started with.
CONFIG_FILE_NAME: Final = "device-config.yaml"

OPERATOR_NAMESPACE: Final = "vgpu-operator"

CONFIG_MAP: Final = "vgpu-device-config"

DEFAULT_TIMEOUT_S: Final = 90.0

POLL_S: Final = 0.5

INVENTORIES: Final = f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"

CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class DemoError(RuntimeError):
    """The demo could not run to the end (not: a pod had to wait, which is expected)."""


def wait_for(what: str, check: Callable[[], _T | None], timeout_s: float) -> _T:
    """Call ``check`` until it returns something other than None or False."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)
