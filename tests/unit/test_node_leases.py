"""node_leases: the Lease the agent writes, and the strict reading the operator makes of it."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from vgpu_operator import node_leases
from vgpu_operator.errors import CodecError

RENEWED = datetime.datetime(2026, 3, 1, 12, 0, 5, 250000, tzinfo=datetime.UTC)


def lease(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-0", "namespace": node_leases.NAMESPACE},
        "spec": {"holderIdentity": "gpu-0", "renewTime": "2026-03-01T12:00:05.250000Z", **spec},
    }


def test_the_agents_lease_reads_back_as_its_renewal() -> None:
    written = node_leases.lease_manifest("gpu-0", RENEWED, 120, "uid-1")
    assert written["metadata"]["namespace"] == "vgpu-node-leases"
    assert written["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-1"}
    ]
    assert written["spec"] == {
        "holderIdentity": "gpu-0",
        "leaseDurationSeconds": 120,
        "renewTime": "2026-03-01T12:00:05.250000Z",  # a MicroTime, as the API writes it
    }
    assert node_leases.read_renewal(written) == RENEWED.timestamp()


@pytest.mark.parametrize(
    "renew_time",
    [
        pytest.param("2026-03-01T12:00:05Z", id="no-fraction"),
        pytest.param("2026-03-01T13:00:05.250000+01:00", id="offset"),
        pytest.param("2026-03-01T12:00:05.250000000Z", id="nanoseconds"),
    ],
)
def test_every_rfc3339_form_reads(renew_time: str) -> None:
    expected = RENEWED.replace(microsecond=0) if renew_time.endswith("05Z") else RENEWED
    assert node_leases.read_renewal(lease(renewTime=renew_time)) == expected.timestamp()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"renewTime": None}, "spec.renewTime", id="no-renew-time"),
        pytest.param({"renewTime": ""}, "spec.renewTime", id="empty"),
        pytest.param({"renewTime": "yesterday"}, "spec.renewTime", id="words"),
        pytest.param({"renewTime": "2026-03-01"}, "spec.renewTime", id="date-only"),
        pytest.param({"renewTime": "2026-03-01T12:00:05"}, "spec.renewTime", id="no-zone"),
        pytest.param({"renewTime": "2026-02-30T12:00:05Z"}, "spec.renewTime", id="no-such-day"),
        pytest.param({"renewTime": 1772366405}, "spec.renewTime", id="a-number"),
        pytest.param({"holderIdentity": "gpu-1"}, "spec.holderIdentity", id="another-holder"),
        pytest.param({"holderIdentity": None}, "spec.holderIdentity", id="no-holder"),
    ],
)
def test_an_unreadable_lease_is_no_heartbeat(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(CodecError) as refused:
        node_leases.read_renewal(lease(**spec))
    assert refused.value.field == field


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"metadata": {"name": "gpu-0"}}, id="no-spec"),
        pytest.param({"metadata": {}, "spec": {"holderIdentity": ""}}, id="no-name"),
        pytest.param({"spec": "gpu-0"}, id="no-metadata"),
    ],
)
def test_a_malformed_lease_is_no_heartbeat(obj: dict[str, Any]) -> None:
    with pytest.raises(CodecError):
        node_leases.read_renewal(obj)
