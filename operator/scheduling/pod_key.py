"""How the engine and the runtime name a pod: ``namespace/name``."""

from __future__ import annotations

from typing import NewType

from vgpu_operator.wire import Pod

#: ``namespace/name`` of a pod (the namespace defaults to ``default``).
PodKey = NewType("PodKey", str)


def pod_key(pod: Pod) -> PodKey:
    meta = pod.get("metadata") or {}
    return PodKey(f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}")
