"""The webhook's patch: the engine's mutated pod, as a JSON patch Kopf sends back."""

from __future__ import annotations

import copy
from typing import Any, cast

import kopf

from vgpu_operator.handlers.admission import apply_mutation

ORIGINAL: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "1"}},
    "spec": {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    },
}


def mutated() -> dict[str, Any]:
    pod = copy.deepcopy(ORIGINAL)
    pod["spec"]["schedulerName"] = "vgpu-scheduler"
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = "100"
    pod["metadata"]["uid"] = "changed-by-nobody-we-trust"
    return pod


def test_spec_is_taken_over_and_server_metadata_is_not() -> None:
    body = copy.deepcopy(ORIGINAL)
    apply_mutation(body, mutated())
    assert body["spec"]["schedulerName"] == "vgpu-scheduler"
    assert body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    assert body["metadata"]["uid"] == "u"


def test_kopf_turns_the_mutation_into_json_patch_ops() -> None:
    patch = kopf.Patch(body=kopf.Body(cast(kopf.RawBody, copy.deepcopy(ORIGINAL))))
    target = mutated()
    patch.fns.append(lambda raw: apply_mutation(raw, target))  # type: ignore[arg-type]
    ops = patch.as_json_patch()
    assert {"op": "add", "path": "/spec/schedulerName", "value": "vgpu-scheduler"} in ops
    assert any(op["path"].startswith("/spec/containers/0/resources/limits") for op in ops)
    assert all(not op["path"].startswith("/metadata") for op in ops)


def test_nothing_to_change_makes_no_ops() -> None:
    patch = kopf.Patch(body=kopf.Body(cast(kopf.RawBody, copy.deepcopy(ORIGINAL))))
    same = copy.deepcopy(ORIGINAL)
    patch.fns.append(lambda raw: apply_mutation(raw, same))  # type: ignore[arg-type]
    assert patch.as_json_patch() == []


def test_new_annotations_are_added() -> None:
    body = copy.deepcopy(ORIGINAL)
    target = mutated()
    target["metadata"]["annotations"] = {"x": "y"}
    apply_mutation(body, target)
    assert body["metadata"]["annotations"] == {"x": "y"}
