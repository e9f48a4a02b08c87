"""How the engine and the runtime name a pod: ``namespace/name``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``namespace/name`` of a pod (the namespace defaults to ``default``).
PodKey = str


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
