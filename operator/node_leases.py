"""Node Leases: each node agent's heartbeat, as the kubelet's Leases in kube-node-lease.

One small ``coordination.k8s.io`` Lease per node, named after the node, in ``NAMESPACE``.
The agent renews it every heartbeat interval; its DeviceInventory (multi-KB, schema
validated, fanned out to every watcher) is written only when what it reports changes.
The operator takes a node's heartbeat as the later of the inventory's
``status.heartbeat`` (still set on every report, so an older agent keeps working) and its
Lease's ``renewTime``.

Pure: the manifests the agent writes, and the strict reading the operator makes of them.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any, Final

from vgpu_operator import names
from vgpu_operator.errors import CodecError
from vgpu_operator.timestamps import format_rfc3339, unix_time

#: Where every node's Lease lives (manifests/namespace.yaml; the roles name it too).
NAMESPACE: Final = "vgpu-node-leases"
API_VERSION: Final = "coordination.k8s.io/v1"
KIND: Final = "Lease"
COLLECTION: Final = f"/apis/{API_VERSION}/namespaces/{NAMESPACE}/leases"

# What the API server writes for a MicroTime (and accepts in RFC 3339): a full date and
# time with an explicit zone. Anything looser (a date alone, no zone) is not a heartbeat.
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")


def lease_path(node_name: str) -> str:
    return f"{COLLECTION}/{node_name}"


def renewal_spec(node_name: str, renewed: datetime.datetime, duration_s: int) -> dict[str, Any]:
    """The Lease's spec after a renewal: held by the node, renewed at ``renewed``."""
    return {
        "holderIdentity": node_name,
        "leaseDurationSeconds": duration_s,
        "renewTime": format_rfc3339(renewed, micro=True),
    }


def lease_manifest(
    node_name: str, renewed: datetime.datetime, duration_s: int, node_uid: str
) -> dict[str, Any]:
    """A new Lease for ``node_name``, owned by its Node so that it goes with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": node_name,
            "namespace": NAMESPACE,
            "labels": {names.MANAGED_BY_LABEL: names.MANAGED_BY_AGENT},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
            ],
        },
        "spec": renewal_spec(node_name, renewed, duration_s),
    }


def read_renewal(lease: Mapping[str, Any]) -> float:
    """When the Lease's node last renewed it, as a Unix time.

    Strict: a Lease is its node's heartbeat only when the node holds it (``holderIdentity``
    is the Lease's name) and ``renewTime`` is a full RFC 3339 time. Anything else raises
    ``CodecError``: an unreadable Lease never counts as fresh.
    """
    metadata = lease.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise CodecError("metadata.name", "a node Lease is named after its node")
    spec = lease.get("spec")
    if not isinstance(spec, Mapping):
        raise CodecError("spec", "missing")
    holder = spec.get("holderIdentity")
    if holder != name:
        raise CodecError("spec.holderIdentity", f"must be the node {name!r}", repr(holder))
    renew_time = spec.get("renewTime")
    if not isinstance(renew_time, str) or not _RFC3339.fullmatch(renew_time):
        raise CodecError("spec.renewTime", "not an RFC 3339 time", repr(renew_time))
    renewed = unix_time(renew_time)
    if renewed is None:
        raise CodecError("spec.renewTime", "not a valid time", renew_time)
    return renewed
