"""Kueue in front, the operator behind, on a live control plane with Kueue's real controller
(``make kueue``; docs/kueue.md).

Two nodes of two 24 GiB cards, each card giving 5 GiB to a pod that runs outside Kueue:
19 GiB free per card, 76 GiB in all. A pod group of four pods of 20 GiB fits the
ClusterQueue's quota (Kueue counts ``gpumem x gpu`` in totals, the ResourceTransformation
of its HAMi guide) but no card.

- Without the check (the contrast): Kueue admits it, ungates its pods, and they wait,
  unplaceable, holding the queue's quota.
- With the check ``vgpu-operator.io/placeable`` (the AdmissionCheck of
  ``manifests/kueue-admission-check.yaml``): the workload is answered Retry with the
  device counts, not admitted, and its pods stay gated (never bound); once the small pods
  are gone and four cards have room, it is answered Ready, admitted, and all four pods
  are bound.

The queued pods name no scheduler: both webhooks see each pod's creation, Kueue's puts its
scheduling gate on it and ours routes it to our scheduler. Kueue's pod webhook gates every
pod naming a queue, so this module runs its own control plane (not the session's).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.test_operator_webhook import Pki, make_pki

from vgpu_operator import node_leases
from vgpu_operator.control.options import OperatorOptions, PlaceableOptions, WebhookOptions
from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.kube import client as kube_client
from vgpu_operator.kube import listing, workloads
from vgpu_operator.kube.requests import ApiError as RequestsApiError
from vgpu_operator.testing import kueue
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import KWOK_STAGES, AdminRequestError, ControlPlane
from vgpu_operator.testing.processes import free_port

pytestmark = pytest.mark.integration

GIB = 1024
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
MANIFEST = env.REPO / "manifests" / "kueue-admission-check.yaml"
#: The AdmissionCheck of the manifest.
CHECK = next(
    d["metadata"]["name"]
    for d in yaml.safe_load_all(MANIFEST.read_text())
    if d and d["kind"] == "AdmissionCheck"
)
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture(scope="module")
def kueue_plane(control_plane_binaries: Binaries, kueue_binary: Path) -> Iterator[ControlPlane]:
    # Kueue's finalizer holds the pods it deletes until they end: kwok ends them, as
    # kubelet would (kueue.kwok_stages).
    stages = kueue.kwok_stages(KWOK_STAGES)
    with ControlPlane(kwok=True, binaries=control_plane_binaries, kwok_stages=stages) as plane:
        plane.start_kueue(kueue_binary)
        yield plane


def _queues(cp: ControlPlane, namespace: str, suffix: str = "") -> None:
    """A flavor, our check, two ClusterQueues (with and without it) and their LocalQueues
    (names ending in ``-suffix`` when given)."""
    flavor_and_check(cp)
    for base, checks in (("with-check", [{"name": CHECK}]), ("no-check", [])):
        name = f"{base}-{suffix}" if suffix else base
        # The cards' total: 4 x 24 GiB, in MiB as gpumem counts.
        _queue_pair(cp, namespace, name, gpus=8, gpumem_mib=98304, checks=checks)


def flavor_and_check(cp: ControlPlane) -> None:
    """The ResourceFlavor ``cards`` and the AdmissionCheck of the manifest, once."""
    env.create_unless_present(
        cp,
        f"{KUEUE}/resourceflavors",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "cards"}},
    )  # fmt: skip
    for document in yaml.safe_load_all(MANIFEST.read_text()):
        if document and document["kind"] == "AdmissionCheck":
            env.create_unless_present(cp, f"{KUEUE}/admissionchecks", document)


def _queue_pair(
    cp: ControlPlane,
    namespace: str,
    name: str,
    *,
    gpus: int,
    gpumem_mib: int,
    checks: list[dict[str, str]],
    preemption: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    """A ClusterQueue over the flavor ``cards`` (HAMi's transformed resources, and the
    ``extra`` resources' quotas) with the given checks, and its LocalQueue of the same
    name in ``namespace``."""
    quotas = {"nvidia.com/gpu": str(gpus), "nvidia.com/total-gpumem": str(gpumem_mib)}
    quotas.update(extra or {})
    resources = [{"name": name, "nominalQuota": quota} for name, quota in quotas.items()]
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": list(quotas),
                "flavors": [{"name": "cards", "resources": resources}],
            }
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": checks}
    if preemption is not None:
        spec["preemption"] = preemption
    cp.create(
        f"{KUEUE}/clusterqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": name}, "spec": spec},
    )  # fmt: skip
    cp.create(
        f"{KUEUE}/namespaces/{namespace}/localqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterQueue": name}},
    )  # fmt: skip


def _our_webhook(cp: ControlPlane, namespace: str, scheduler: str, port: int, ca: bytes) -> None:
    """Our pod webhook for the namespace, and wait until the API server reaches it."""
    cp.create(
        WEBHOOKS,
        env.pod_webhook_configuration(
            f"vgpu-{namespace}",
            namespace,
            f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            ca=ca,
            timeout_s=10,
        ),
    )
    probe = env.gpu_pod(namespace, "probe", scheduler=scheduler, group=namespace)

    def webhook_answers() -> bool:
        try:
            cp.create(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
        except AdminRequestError:
            return False
        return True

    env.wait_until("our webhook to answer", webhook_answers, 30)


def _group_pod(namespace: str, scheduler: str, queue: str, group: str, i: int) -> dict[str, Any]:
    pod = env.gpu_pod(
        namespace,
        f"{group}-{i}",
        scheduler=scheduler,
        group=namespace,
        gpumem=20 * GIB,
        labels={QUEUE_LABEL: queue, GROUP_LABEL: group},
    )
    pod["metadata"]["annotations"] = {GROUP_COUNT: "4"}
    del pod["spec"]["schedulerName"]  # our webhook routes it
    return pod


def _workload_of(cp: ControlPlane, namespace: str, group: str) -> dict[str, Any] | None:
    items = cp.get(f"{KUEUE}/namespaces/{namespace}/workloads").get("items", [])
    for wl in items:
        owners = {o.get("name", "") for o in wl["metadata"].get("ownerReferences") or ()}
        if any(o.startswith(f"{group}-") for o in owners):
            return dict(wl)
    return None


def _true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


def _check_state(wl: dict[str, Any], name: str = CHECK) -> dict[str, Any]:
    """The Workload's state of the admission check ``name`` (``{}``: none yet)."""
    for state in (wl.get("status") or {}).get("admissionChecks") or ():
        if state.get("name") == name:
            return dict(state)
    return {}


def _our_namespace(cp: ControlPlane, prefix: str) -> tuple[str, str]:
    """A fresh namespace holding a device config that names a fresh scheduler
    (``env.new_scheduler``; the node Leases' namespace made): the namespace and the
    scheduler."""
    namespace = env.unique(prefix)
    cp.ensure_namespace(namespace)
    cp.ensure_namespace(node_leases.NAMESPACE)
    return namespace, env.new_scheduler(cp, namespace)


def _checking_operator(
    cp: ControlPlane, namespace: str, tmp_path: Path
) -> tuple[Pki, int, OperatorOptions]:
    """The options of an operator serving the webhook (its PKI and port) and answering
    Kueue's check."""
    pki, port = make_pki(tmp_path), free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    options = env.options(
        cp, namespace, webhook=webhook, kueue_check=PlaceableOptions(hold_s=30, retry_after_s=2)
    )
    return pki, port, options


def test_four_pods_of_20_gib_wait_in_the_queue_not_on_the_nodes(
    kueue_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = kueue_plane
    namespace, scheduler = _our_namespace(cp, "team")
    node_cards = {}
    for n in range(2):
        name = f"{namespace}-n{n}"
        node_cards[name] = env.cards(f"{namespace}-{n}", 2, memory_mib=24 * GIB)
        env.gpu_node(cp, name, node_cards[name], group=namespace)
    _queues(cp, namespace)
    pki, port, options = _checking_operator(cp, namespace, tmp_path)
    with OperatorThread(options):
        _our_webhook(cp, namespace, scheduler, port, pki.ca.read_bytes())
        # 5 GiB on each card, outside Kueue (no queue): 19 GiB free per card.
        small = []
        for cards in node_cards.values():
            for card in cards:
                pod = env.gpu_pod(
                    namespace, f"small-{card.uuid.lower()}", scheduler=scheduler,
                    group=namespace, gpumem=5 * GIB,
                )  # fmt: skip
                pod["metadata"]["annotations"] = {nvidia.USE_UUID_ANNOTATION: card.uuid}
                env.create_pod(cp, pod)
                small.append(pod["metadata"]["name"])
        for name in small:
            env.wait_bound(cp, namespace, name)

        # The contrast: without the check, quota alone admits the group; it then waits.
        for i in range(4):
            env.create_pod(cp, _group_pod(namespace, scheduler, "no-check", "quota-only", i))
        admitted = env.wait_until(
            "the group without the check to be admitted",
            lambda: (wl := _workload_of(cp, namespace, "quota-only")) and _true(wl, "Admitted"),
            60,
        )
        assert admitted

        def ungated_and_unplaceable() -> bool | None:
            pods = [env.get_pod(cp, namespace, f"quota-only-{i}") for i in range(4)]
            for pod in pods:
                if pod["spec"].get("schedulingGates") or pod["spec"].get("nodeName"):
                    return None
                cond = env.condition(pod)
                if not cond or "CardInsufficientMemory" not in cond.get("message", ""):
                    return None
            return True

        env.wait_until("the admitted pods to wait, unplaceable", ungated_and_unplaceable, 60)
        for i in range(4):
            cp.delete(f"/api/v1/namespaces/{namespace}/pods/quota-only-{i}")

        # With the check: answered Retry with the device counts; never admitted nor bound.
        for i in range(4):
            env.create_pod(cp, _group_pod(namespace, scheduler, "with-check", "checked", i))

        def retried() -> dict[str, Any] | None:
            wl = _workload_of(cp, namespace, "checked")
            if wl is None:
                return None
            state = _check_state(wl)
            if state.get("state") == "Retry" or "fits on no node" in state.get("message", ""):
                return wl
            return None

        wl = env.wait_until("the check to answer Retry", retried, 60)
        assert not _true(wl, "Admitted")
        for _ in range(3):  # a few rounds (asked again every 2 s): still gated
            seen = _check_state(wl).get("lastTransitionTime")

            def next_round(seen: Any = seen) -> dict[str, Any] | None:
                w = _workload_of(cp, namespace, "checked")
                if w is None or _check_state(w).get("state") != "Retry":
                    return None
                return w if _check_state(w).get("lastTransitionTime") != seen else None

            wl = env.wait_until("another Retry round", next_round, 30)
        message = _check_state(wl).get("message", "")
        assert re.search(r"CardInsufficientMemory", message), message
        for i in range(4):
            pod = env.get_pod(cp, namespace, f"checked-{i}")
            assert {"name": ADMISSION_GATE} in pod["spec"].get("schedulingGates", [])
            assert pod["spec"]["schedulerName"] == scheduler  # routed by our webhook
            assert not pod["spec"].get("nodeName")

        # Room appears: the small pods go. Answered Ready, admitted, all four bound.
        for name in small:
            cp.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        env.wait_until(
            "the group with the check to be admitted",
            lambda: (w := _workload_of(cp, namespace, "checked")) and _true(w, "Admitted"),
            60,
        )
        bound = [env.wait_bound(cp, namespace, f"checked-{i}") for i in range(4)]
        per_card = env.usage_by_card(bound)
        assert len(per_card) == 4
        assert all(mem == 20 * GIB for _, mem, _ in per_card.values())


def test_the_manifests_role_is_enough_for_the_check(kueue_plane: ControlPlane) -> None:
    """The check's reads and writes, as an identity holding only the ClusterRole of
    manifests/kueue-admission-check.yaml: list and watch AdmissionChecks and Workloads,
    patch their status; nothing else (a pod list is refused)."""
    cp = kueue_plane
    namespace = env.unique("rbac")
    cp.ensure_namespace(namespace)
    user = env.unique("kueue-check")
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for document in yaml.safe_load_all(MANIFEST.read_text()):
        if document and document["kind"] == "ClusterRole":
            name = f"{document['metadata']['name']}-{user}"
            cp.create(f"{rbac}/clusterroles", {**document, "metadata": {"name": name}})
            cp.create(
                f"{rbac}/clusterrolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": name,
                    },
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                    ],
                },
            )
    check = env.unique("check")
    cp.create(
        f"{KUEUE}/admissionchecks",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
         "metadata": {"name": check},
         "spec": {"controllerName": "vgpu-operator.io/placeable"}},
    )  # fmt: skip
    cp.create(
        f"{KUEUE}/namespaces/{namespace}/workloads",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": namespace},
            "spec": {
                "queueName": "nowhere",
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "c", "image": "registry.invalid/x"}],
                            }
                        },
                    }
                ],
            },
        },
    )
    kubeconfig = cp.create_client_credentials(user).kubeconfig_path

    async def as_the_check() -> None:
        api = await kube_client.create_api_client(kubeconfig)
        try:
            checks = await listing.list_all(api, workloads.ADMISSION_CHECKS)
            assert check in {c["metadata"]["name"] for c in checks.items}
            listed = await listing.list_all(api, workloads.WORKLOADS)
            assert any(w["metadata"]["namespace"] == namespace for w in listed.items)
            async for _ in listing.watch(
                api, workloads.WORKLOADS, resource_version=listed.resource_version, timeout_s=1
            ):
                pass
            await workloads.set_check_active(api, check, time.time())
            for _ in range(10):  # Kueue may update it meanwhile: the answer's precondition
                found = await listing.list_all(api, workloads.WORKLOADS)
                mine = next(w for w in found.items if w["metadata"]["namespace"] == namespace)
                try:
                    await workloads.set_check_state(
                        api, mine, check, "Retry", "no room", time.time()
                    )
                    break
                except RequestsApiError as exc:
                    if exc.status != 409:
                        raise
                    await asyncio.sleep(0.5)
            with pytest.raises(RequestsApiError) as refused:
                await listing.list_all(api, "/api/v1/pods")
            assert refused.value.status == 403
        finally:
            await api.close()

    asyncio.run(as_the_check())
    got = cp.get(f"{KUEUE}/admissionchecks/{check}")
    assert any(c["type"] == "Active" and c["status"] == "True" for c in got["status"]["conditions"])
    state = _check_state(cp.get(f"{KUEUE}/namespaces/{namespace}/workloads/w"), check)
    assert state["state"] == "Retry"
    assert state["message"] == "no room"


def test_a_preempted_workloads_pods_leave_the_books(
    kueue_plane: ControlPlane, tmp_path: Path
) -> None:
    """Kueue preempts a low-priority pod group for a high-priority one in the same
    ClusterQueue: the low group's pods are deleted and end, are released from the books,
    and the high group is then answered Ready, admitted and bound to the same cards."""
    cp = kueue_plane
    namespace, scheduler = _our_namespace(cp, "prio")
    node_cards = env.cards(namespace, 2, memory_mib=24 * GIB)
    env.gpu_node(cp, f"{namespace}-n0", node_cards, group=namespace)
    queue = env.unique("prio")
    create_unless = env.create_unless_present
    flavor_and_check(cp)
    for name, value in (("low", 10), ("high", 1000)):
        create_unless(
            cp,
            f"{KUEUE}/workloadpriorityclasses",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": name}, "value": value},
        )  # fmt: skip
    _queue_pair(
        cp,
        namespace,
        queue,
        gpus=2,
        gpumem_mib=49152,
        checks=[{"name": CHECK}],
        preemption={"withinClusterQueue": "LowerPriority"},
    )

    def group(name: str, priority: str) -> None:
        for i in range(2):
            pod = _group_pod(namespace, scheduler, queue, name, i)
            pod["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
            pod["metadata"]["annotations"] = {GROUP_COUNT: "2"}
            pod["spec"]["schedulerName"] = scheduler
            env.create_pod(cp, pod)

    options = env.options(cp, namespace, kueue_check=PlaceableOptions(hold_s=30, retry_after_s=2))
    with OperatorThread(options) as operator:
        group("low", "low")
        low = [env.wait_bound(cp, namespace, f"low-{i}") for i in range(2)]
        assert len(env.usage_by_card(low)) == 2
        group("high", "high")

        def low_ended() -> bool:
            # Deleted by Kueue and ended (kwok plays kubelet); Kueue's finalizer may keep
            # the objects a while longer, which is Kueue's business, not the books'.
            pods = [p for p in env.list_pods(cp, namespace) if p["metadata"]["name"] in low_names]
            return all(
                p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Failed"
                for p in pods
            )

        low_names = {"low-0", "low-1"}
        env.wait_until("the low group to be preempted and ended", low_ended, 60)
        high = [env.wait_bound(cp, namespace, f"high-{i}") for i in range(2)]
        per_card = env.usage_by_card(high)
        assert sorted(per_card) == sorted(c.uuid for c in node_cards)
        # The books hold the high pods only: each card's 20 GiB, not 40.
        state = operator.app.running.state
        assert state is not None
        held = {
            row.uuid: row.used_memory_mib for row in state.device_usage() if row.uuid in per_card
        }
        assert held == dict.fromkeys(per_card, 20 * GIB)


def test_a_job_is_admitted_when_its_pods_fit_and_its_pods_are_ours(
    kueue_plane: ControlPlane, tmp_path: Path
) -> None:
    """A Job (Kueue's batch/job integration, kube-controller-manager's job controller) of
    two 20 GiB pods naming no scheduler: suspended by Kueue, answered Ready (two cards of
    24 GiB), unsuspended; its pods are routed by our webhook and bound, each to one of
    the node's cards."""
    cp = kueue_plane
    cp.start_controller_manager(["job-controller"])
    namespace, scheduler = _our_namespace(cp, "job")
    node_cards = env.cards(namespace, 2, memory_mib=24 * GIB)
    env.gpu_node(cp, f"{namespace}-n0", node_cards, group=namespace)
    _queues(cp, namespace, suffix=namespace)
    pki, port, options = _checking_operator(cp, namespace, tmp_path)
    with OperatorThread(options):
        _our_webhook(cp, namespace, scheduler, port, pki.ca.read_bytes())
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(20 * GIB)}
        job = cp.create(
            f"/apis/batch/v1/namespaces/{namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "train",
                    "namespace": namespace,
                    "labels": {QUEUE_LABEL: f"with-check-{namespace}"},
                },
                "spec": {
                    "parallelism": 2,
                    "completions": 2,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "nodeSelector": {env.TEST_LABEL: namespace},
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.invalid/cuda:latest",
                                    "resources": {"limits": limits},
                                }
                            ],
                        }
                    },
                },
            },
        )
        assert job["spec"]["suspend"] is True  # Kueue's webhook: held until admitted

        def admitted() -> dict[str, Any] | None:
            items = cp.get(f"{KUEUE}/namespaces/{namespace}/workloads").get("items", [])
            done = [w for w in items if _true(w, "Admitted")]
            return done[0] if done else None

        wl = env.wait_until("the job's workload to be admitted", admitted, 60)
        assert _check_state(wl)["state"] == "Ready"

        def bound_pods() -> list[dict[str, Any]] | None:
            pods = [p for p in env.list_pods(cp, namespace) if p["spec"].get("nodeName")]
            return pods if len(pods) == 2 else None

        pods = env.wait_until("the job's two pods to be bound", bound_pods, 60)
        assert {p["spec"]["schedulerName"] for p in pods} == {scheduler}
        # kwok completes a Job's pods at once, so the first pod may end and free its card
        # before the second is placed: both on one card is then correct. What must hold is
        # that each pod got exactly one of the node's cards.
        node_uuids = {c.uuid for c in node_cards}
        for bound in pods:
            cards = [card for card, _, _ in env.allocation(bound)]
            assert len(cards) == 1, (bound["metadata"]["name"], cards)
            assert cards[0] in node_uuids, (bound["metadata"]["name"], cards)
