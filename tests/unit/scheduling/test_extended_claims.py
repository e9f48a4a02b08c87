"""Extended resources backed by DRA (KEP-5004, issue 39): a plain ``nvidia.com/gpu`` pod
served by this driver's DeviceClass through the pod's special claim."""

from __future__ import annotations

import copy
from typing import Any

from unit.scheduling.test_claim_preemption import deallocated, engine, running

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import catalog, dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import extended_claims
from vgpu_operator.scheduling.vendors import Vendors

NODE = "dra-a"


def state(extended: str | None = "nvidia.com/gpu") -> ClusterState:
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        if extended and device_class["metadata"]["name"] == dra.SHARED_CLASS:
            device_class = copy.deepcopy(device_class)
            device_class["spec"]["extendedResourceName"] = extended
        engine.set_device_class(device_class)
    cards = [
        dra.CardShape(f"GPU-{i}", i, "L40S", "NVIDIA-L40S", 10240, 100, 4, "hami-core")
        for i in range(2)
    ]
    engine.set_slice(dra.slice_wire(NODE, cards, 1, None))
    return engine


def pod(limits: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "initContainers": [{"name": "init", "resources": {"limits": {"cpu": "1"}}}],
            "containers": [
                {"name": "side", "resources": {}},
                {"name": "main", "resources": {"limits": limits}},
            ],
        },
    }


def test_a_gpu_pod_gets_its_special_claim_made_and_allocated() -> None:
    engine = state()
    decision = engine.schedule(pod({"cpu": "1", "nvidia.com/gpu": "1"}), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    assert decision.node == NODE
    [write] = decision.claim_writes
    created = write.create
    assert created is not None
    meta = created["metadata"]
    assert meta["name"].startswith("p-extended-resources-")
    assert len(meta["name"]) == 26
    assert meta["annotations"] == {extended_claims.ANNOTATION: "true"}
    [owner] = meta["ownerReferences"]
    assert owner["uid"] == "uid-p"
    assert owner["controller"] is True
    # Index 2: init container, then containers; resource 1 of ["cpu", "nvidia.com/gpu"].
    [request] = created["spec"]["devices"]["requests"]
    assert request["name"] == "container-2-request-1"
    assert request["exactly"]["deviceClassName"] == dra.SHARED_CLASS
    assert request["exactly"]["count"] == 1
    assert write.allocation is not None
    [result] = write.allocation["devices"]["results"]
    assert result["request"] == "container-2-request-1"
    assert write.pod_status == {
        "resourceClaimName": meta["name"],
        "requestMappings": [
            {
                "containerName": "main",
                "resourceName": "nvidia.com/gpu",
                "requestName": "container-2-request-1",
            }
        ],
    }


def test_hami_memory_and_cores_become_the_requests_capacity() -> None:
    engine = state()
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
    decision = engine.schedule(pod(limits), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    [write] = decision.claim_writes
    assert write.create is not None
    [request] = write.create["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["capacity"] == {"requests": {"memory": "3000Mi", "cores": "30"}}
    assert write.allocation is not None
    results = write.allocation["devices"]["results"]
    assert len({r["device"] for r in results}) == 2
    for result in results:
        assert result["consumedCapacity"]["memory"] in ("3000Mi", "3000M", "3145728000")


def test_the_decision_holds_the_shares_until_the_claim_comes_back() -> None:
    engine = state()
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}
    first = engine.schedule(pod(limits, "a"), now=0)
    second = engine.schedule(pod(limits, "b"), now=0)
    third = engine.schedule(pod(limits, "c"), now=0)
    assert first.scheduled
    assert second.scheduled
    assert not third.scheduled  # both cards' memory is held by the first two decisions


def test_a_percentage_below_100_is_refused_with_a_sentence() -> None:
    engine = state()
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}
    decision = engine.schedule(pod(limits), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "gpumem-percentage" in decision.diagnosis.message()


def test_without_a_class_naming_the_resource_the_pod_stays_on_the_annotation_path() -> None:
    engine = state(extended=None)
    decision = engine.schedule(pod({"nvidia.com/gpu": "1"}), now=0)
    assert not decision.claim_writes


def test_the_implicit_name_of_our_class_is_served_too() -> None:
    engine = state(extended=None)
    implicit = extended_claims.IMPLICIT_PREFIX + dra.EXCLUSIVE_CLASS
    decision = engine.schedule(pod({implicit: "1"}), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    [write] = decision.claim_writes
    assert write.create is not None
    [request] = write.create["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == dra.EXCLUSIVE_CLASS


def special_claim_stored() -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The engine, a ``nvidia.com/gpu: 1`` pod, and the special claim the engine would make
    for it as the API server stored it (its uid and resourceVersion set)."""
    engine = state()
    subject = pod({"nvidia.com/gpu": "1"})
    made = extended_claims.special(
        subject,
        {"nvidia.com/gpu": dra.SHARED_CLASS},
        {},
        Vendors(DeviceConfig(), catalog.VENDOR_TABLE),
    )
    stored = copy.deepcopy(dict(made.claim))
    stored["metadata"].update(uid="real-uid", resourceVersion="7")
    return engine, subject, stored


def test_an_existing_special_claim_is_used_not_made_again() -> None:
    engine, subject, stored = special_claim_stored()
    engine.set_claim(stored)
    decision = engine.schedule(subject, now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    [write] = decision.claim_writes
    assert write.create is None
    assert write.uid == "real-uid"
    assert write.resource_version == "7"
    assert write.pod_status is not None


def test_the_name_is_cut_as_generate_name_cuts_it() -> None:
    long = pod({"nvidia.com/gpu": "1"}, name="x" * 80)
    name = extended_claims.claim_name(long)
    assert len(name) == 63
    assert name.startswith("x" * 58)
    assert extended_claims.claim_name(long) == name  # the same pod, the same name


def test_a_claim_of_that_name_not_owned_by_the_pod_is_not_taken_for_its_own() -> None:
    engine = state()
    subject = pod({"nvidia.com/gpu": "1"})
    name = extended_claims.claim_name(subject)
    impostor = {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": "other",
            "resourceVersion": "3",
            "annotations": {extended_claims.ANNOTATION: "true"},
            "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "not-p", "controller": True}],
        },
        "spec": {"devices": {"requests": []}},
    }
    engine.set_claim(impostor)
    decision = engine.schedule(subject, now=0)
    # The engine's own is to be created (the create then fails on the name, and the
    # pod is decided again): the impostor's allocation is never written for the pod.
    [write] = decision.claim_writes
    assert write.create is not None
    assert write.uid != "other"


def test_a_special_claim_asking_other_devices_is_refused_with_a_sentence() -> None:
    engine, subject, stored = special_claim_stored()
    stored["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    engine.set_claim(stored)
    decision = engine.schedule(subject, now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "asks other devices than the pod's extended resources" in decision.diagnosis.message()


def test_request_names_count_containers_and_sorted_resources_as_upstream() -> None:
    implicit = extended_claims.IMPLICIT_PREFIX + dra.EXCLUSIVE_CLASS
    subject = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "uid-p"},
        "spec": {
            "initContainers": [
                {"name": "init", "resources": {"limits": {"cpu": "1", implicit: "1"}}}
            ],
            "containers": [
                {"name": "idle", "resources": {"requests": {"cpu": "1"}}},
                {
                    "name": "main",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "2", "memory": "1Gi"},
                        "requests": {"cpu": "1"},
                    },
                },
            ],
        },
    }
    resources = extended_claims.mapping(
        [(dra.SHARED_CLASS, "nvidia.com/gpu"), (dra.EXCLUSIVE_CLASS, None)]
    )
    vendors = Vendors(DeviceConfig(), catalog.VENDOR_TABLE)
    requests, mappings = extended_claims.requests_of(subject, resources, vendors)
    # init is container 0 (its resources: cpu, the implicit name); main is container 2
    # (cpu, memory, nvidia.com/gpu: requests filled in from limits, as the API server does).
    assert [r["name"] for r in requests] == ["container-0-request-1", "container-2-request-2"]
    assert [r["exactly"]["deviceClassName"] for r in requests] == [
        dra.EXCLUSIVE_CLASS,
        dra.SHARED_CLASS,
    ]
    assert [r["exactly"]["count"] for r in requests] == [1, 2]
    assert {(m["containerName"], m["resourceName"], m["requestName"]) for m in mappings} == {
        ("init", implicit, "container-0-request-1"),
        ("main", "nvidia.com/gpu", "container-2-request-2"),
    }


def test_numa_bind_keeps_a_requests_cards_on_one_numa_node() -> None:
    subject = pod({"nvidia.com/gpu": "2"})
    subject["metadata"]["annotations"] = {"nvidia.com/numa-bind": "true"}
    made = extended_claims.special(
        subject,
        {"nvidia.com/gpu": dra.SHARED_CLASS},
        {},
        Vendors(DeviceConfig(), catalog.VENDOR_TABLE),
    )
    assert made.claim["spec"]["devices"]["constraints"] == [
        {"requests": ["container-2-request-0"], "matchAttribute": dra.ATTR_NUMA_NODE}
    ]


def test_a_gpu_pod_preempts_through_its_special_claim_then_gets_it() -> None:
    state = engine()  # one card: 10240 MiB
    mapped = copy.deepcopy(dra.device_classes()[0])
    mapped["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    state.set_device_class(mapped)
    running(state, "low", "8Gi", 1)
    urgent = pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144"}, name="urgent")
    urgent["metadata"]["namespace"] = "ns"
    urgent["spec"]["priority"] = 100
    decision = state.schedule(urgent, now=0)
    assert decision.victims == ("ns/low",)
    assert decision.claim_writes == ()  # no claim made while the victim runs
    state.remove_pod("ns/low")
    state.set_claim(deallocated("low", "8Gi"))
    placed = state.schedule(urgent, now=1)
    assert placed.scheduled, placed.diagnosis and placed.diagnosis.message()
    [write] = placed.claim_writes
    assert write.create is not None


def test_a_reserved_special_claim_not_named_in_the_pods_status_gets_it_written() -> None:
    """An attempt cut short after the claim's writes and before the pod's status (a
    restart): the next decision writes the status, and nothing more on the claim."""
    engine = state()
    subject = pod({"nvidia.com/gpu": "1"})
    first = engine.schedule(subject, now=0)
    [write] = first.claim_writes
    assert write.create is not None
    assert write.allocation is not None
    engine.rollback("ns/p")
    stored = copy.deepcopy(dict(write.create))
    stored["metadata"].update(uid="real-uid", resourceVersion="8")
    stored["status"] = {
        "allocation": dict(write.allocation),
        "reservedFor": [dict(write.consumer)],
    }
    engine.set_claim(stored)
    again = engine.schedule(subject, now=1)
    assert again.scheduled, again.diagnosis and again.diagnosis.message()
    [status_only] = again.claim_writes
    assert status_only.create is None
    assert status_only.allocation is None
    assert status_only.pod_status == write.pod_status
    # Once the status names the claim, a decision writes nothing on it.
    engine.rollback("ns/p")
    named = copy.deepcopy(subject)
    named["status"] = {"extendedResourceClaimStatus": dict(write.pod_status or {})}
    assert engine.schedule(named, now=2).claim_writes == ()
