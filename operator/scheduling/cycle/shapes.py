"""A pending pod's shape: everything a decision reads of it, and nothing that names it.

Two pods of one shape (the replicas of a Deployment, the pods of a Job) are placed by the
same rules on every node: the same requests, annotations, node terms, namespace. So the
reasons one of them fits nowhere are the reasons the other does (``verdicts``), and one
diagnosis serves both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from vgpu_operator.wire import Pod

#: The spec fields a decision reads (besides the containers' resources).
_SPEC_FIELDS = ("nodeSelector", "affinity", "tolerations")


def shape_of(pod: Pod) -> str:
    """A digest of what the engine reads of ``pod`` (as admitted): its namespace and
    annotations, each container's resources, the node selector, affinity and
    tolerations. Names, labels, images and status are left out."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    read = [
        meta.get("namespace") or "default",
        meta.get("annotations") or {},
        [_resources(c) for c in spec.get("initContainers") or ()],
        [_resources(c) for c in spec.get("containers") or ()],
        [spec.get(name) for name in _SPEC_FIELDS],
    ]
    text = json.dumps(read, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _resources(container: Any) -> Any:
    return container.get("resources") if isinstance(container, Mapping) else None
