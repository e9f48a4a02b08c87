"""The node layer of configuration: what an administrator's Node annotations decide.

Seed 003 §2.3 orders the layers Pod annotation > Node annotation > ConfigMap. A Node may
carry the two policy annotations (used when the pod names none) and the card
restrictions (``use-``/``nouse-`` type and UUID per vendor), which apply to every pod on
that node; a pod's own restrictions narrow them further and cannot widen them.

HAMi v2.10 reads none of these from a Node; this layer is the seeds' addition. A value
that cannot be read is ignored and described in ``NodeLayer.problems`` (the operator
reports it as an Event on the Node), so a typo never blocks the node's other pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpu_operator import names
from vgpu_operator.config import parse_gpu_policy
from vgpu_operator.devices import vendor
from vgpu_operator.scheduling.policies import policies


@dataclass(frozen=True, slots=True)
class NodeLayer:
    """A node's readable policy and restriction annotations, and what could not be read.

    ``restrictions`` holds only the restriction annotations that name something, keyed
    by annotation name, so it can be consulted with the same predicates as a pod's.
    """

    node_policy: str | None = None
    gpu_policy: str | None = None
    restrictions: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


EMPTY = NodeLayer()


def restriction_keys(spec: vendor.VendorSpec) -> tuple[str, ...]:
    return (
        spec.use_type_annotation,
        spec.nouse_type_annotation,
        spec.use_uuid_annotation,
        spec.nouse_uuid_annotation,
    )


def read(annotations: Mapping[str, str], specs: Iterable[vendor.VendorSpec]) -> NodeLayer:
    """The node layer of a Node's annotations; unreadable values are left out."""
    problems: list[str] = []
    node_policy = _node_policy(annotations.get(names.NODE_SCHEDULER_POLICY), problems)
    gpu_policy = _gpu_policy(annotations.get(names.GPU_SCHEDULER_POLICY), problems)
    restrictions: dict[str, str] = {}
    for spec in specs:
        for key in restriction_keys(spec):
            value = annotations.get(key)
            if value is None or not value.strip():
                continue  # an empty restriction restricts nothing, as on a pod
            if not vendor.split_list(value):
                problems.append(f"{key}={value!r} names no card type or UUID; ignored")
                continue
            restrictions[key] = value
    if node_policy is None and gpu_policy is None and not restrictions and not problems:
        return EMPTY
    return NodeLayer(node_policy, gpu_policy, restrictions, tuple(problems))


def _node_policy(value: str | None, problems: list[str]) -> str | None:
    if value is None or not value.strip():
        return None
    if value.strip() in (policies.BINPACK, policies.SPREAD, policies.FRAGMENTATION):
        return value.strip()
    problems.append(
        f"{names.NODE_SCHEDULER_POLICY}={value!r} is not binpack, spread or fragmentation; ignored"
    )
    return None


def _gpu_policy(value: str | None, problems: list[str]) -> str | None:
    if value is None or not value.strip():
        return None
    try:
        tokens = parse_gpu_policy(value)
    except ValueError as exc:
        problems.append(f"{names.GPU_SCHEDULER_POLICY}={value!r}: {exc}; ignored")
        return None
    return ",".join(tokens)
