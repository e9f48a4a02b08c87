"""Admission: the engine's mutated pod, turned into the parts a webhook may change.

``ClusterState.admit`` returns the whole pod as it should be created (scheduler name set,
defaults filled in). Kopf turns our changes into a JSON patch by diffing the body before
and after ``apply_mutation``; only the spec, labels and annotations are taken over, so
server-set metadata is never touched.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def apply_mutation(body: dict[str, Any], mutated: Mapping[str, Any]) -> None:
    """Make ``body`` carry ``mutated``'s spec, labels and annotations (in place)."""
    spec = mutated.get("spec")
    if isinstance(spec, Mapping) and spec != body.get("spec"):
        body["spec"] = copy.deepcopy(dict(spec))
    new_meta = mutated.get("metadata")
    if not isinstance(new_meta, Mapping):
        return
    meta = body.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        value = new_meta.get(key)
        if isinstance(value, Mapping) and value != meta.get(key):
            meta[key] = dict(value)
