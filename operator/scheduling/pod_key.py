"""How the engine and the runtime name a pod: ``namespace/name``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NewType

#: ``namespace/name`` of a pod (the namespace defaults to ``default``).
PodKey = NewType("PodKey", str)


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return PodKey(f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}")
