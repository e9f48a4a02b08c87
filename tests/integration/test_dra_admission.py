"""The webhook and the claim writes on the DRA path (issue 33 items 3 and 6), on a live
control plane: kube-apiserver, kube-scheduler, kube-controller-manager (claims from
templates, Deployments, ResourceQuota usage, garbage collection), a KWOK node on the DRA
path with its agent's slice, and the operator with its webhook, configured from
manifests/webhook.yaml (both hooks, their matchConditions) for the namespaces labelled
``ADMITTED``.

- two replicas of a HAMi-style Deployment in a DRA namespace are both bound (the second
  used to be refused: its template was compared with the API server's defaulted copy);
- a server-side dry run makes no template;
- a pod whose claim asks our DeviceClass is routed to our scheduler, or refused when it
  names another one; one created before its claim passes unrouted, and kube-scheduler may
  not allocate its claim of our class (manifests/claim-policy.yaml,
  ``vgpu-claim-allocations``, installed for the whole module);
- Kubernetes' device-count quota (examples/dra/device-quota.yaml) refuses claims past it;
- kube-scheduler joins a claim the engine allocated without rewriting its allocation;
- a webhook-made template no pod names any more is collected.
"""

from __future__ import annotations

import copy
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.dra_env import (
    CLAIM_CONTROLLERS,
    RESOURCE,
    TOLERATE_KWOK,
    claim_pod,
    create_claim,
    create_claim_template,
    dra_plane,
    one_request,
)
from integration.test_agent import wait_for
from integration.test_operator_webhook import WEBHOOKS, make_pki

from vgpu_operator.control.options import TemplateCollection, WebhookOptions
from vgpu_operator.devices import dra
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane
from vgpu_operator.testing.processes import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE = "dra-admission"  # l40s-pcie-4: four 46068 MiB cards
SCHEDULER = "vgpu-dra-admission"
HAMI_NS = "dra-hami"  # on the DRA path (dra.claimNamespaces)
ADMITTED = "vgpu-admission-test"  # namespaces the test webhook configuration covers
HOOK_CONFIG = "vgpu-dra-admission"


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    controllers = (
        *CLAIM_CONTROLLERS,
        "deployment-controller",
        "replicaset-controller",
        "resourcequota-controller",
    )
    with dra_plane(
        control_plane_binaries,
        tmp_path_factory.mktemp("dra-admission"),
        {NODE: "l40s-pcie-4"},
        split=4,
        controllers=controllers,
        before_scheduler=install_allocation_policy,
    ) as cp:
        yield cp


ALLOCATION_POLICY = "vgpu-claim-allocations"


def _as_user(cp: ControlPlane, user: str, method: str, path: str, body: Any) -> int:
    """The HTTP status of a JSON merge patch sent as ``user`` (a client certificate)."""
    creds = cp.create_client_credentials(user)
    context = ssl.create_default_context(cafile=str(cp.ca_path))
    context.load_cert_chain(str(creds.cert_path), str(creds.key_path))
    request = urllib.request.Request(
        cp.server + path, data=json.dumps(body).encode(), method=method
    )
    request.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code)


def install_allocation_policy(cp: ControlPlane) -> None:
    """manifests/claim-policy.yaml's allocation policy, in force once kube-scheduler's own
    identity is refused an allocation of our driver (policies are taken up
    asynchronously)."""
    for doc in yaml.safe_load_all((ROOT / "manifests" / "claim-policy.yaml").read_text()):
        if doc["metadata"]["name"] != ALLOCATION_POLICY:
            continue
        kind = "validatingadmissionpolicies"
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            kind = "validatingadmissionpolicybindings"
        cp.create(f"/apis/admissionregistration.k8s.io/v1/{kind}", doc)
    cp.ensure_namespace("policy-probe")
    make_claim(cp, "policy-probe", "probe")
    allocation = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": dra.DRIVER, "pool": "p", "device": "d"}
                    ]
                }
            }
        }
    }
    path = f"{RESOURCE}/namespaces/policy-probe/resourceclaims/probe/status?dryRun=All"
    wait_for(
        "the allocation policy in force",
        lambda: _as_user(cp, "system:kube-scheduler", "PATCH", path, allocation) == 403 or None,
        60,
    )


def manifest_hooks(url: str, ca: bytes) -> dict[str, Any]:
    """manifests/webhook.yaml's configuration (both hooks, as shipped), reaching the
    operator at ``url``, for the namespaces labelled ADMITTED, failing closed (a test must
    not pass because a request went unanswered)."""
    import base64

    config = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "manifests" / "webhook.yaml").read_text())
        if doc["kind"] == "MutatingWebhookConfiguration"
    )
    config = copy.deepcopy(config)
    config["metadata"] = {"name": HOOK_CONFIG}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca).decode()}
        hook["namespaceSelector"] = {"matchLabels": {ADMITTED: "true"}}
        hook["failurePolicy"] = "Fail"
        hook["timeoutSeconds"] = 10
    return dict(config)


def admitted_namespace(cp: ControlPlane, name: str | None = None) -> str:
    name = name or f"dra-adm-{uuid.uuid4().hex[:8]}"
    cp.ensure_namespace(name)
    cp.patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": {ADMITTED: "true"}}})
    return name


@pytest.fixture(scope="module")
def operator(
    plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorThread]:
    config_ns = "vgpu-dra-admission-config"
    plane.ensure_namespace(config_ns)
    admitted_namespace(plane, HAMI_NS)
    env.put_config_map(
        plane,
        config_ns,
        f"scheduler:\n  schedulerName: {SCHEDULER}\ndra:\n  claimNamespaces: [{HAMI_NS}]\n",
    )
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    port = free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    options = env.options(
        plane,
        config_ns,
        webhook=webhook,
        inventory_timeout_s=None,
        template_collection=TemplateCollection(interval_s=1.0, grace_s=2.0),
    )
    with OperatorThread(options) as running:
        plane.create(
            WEBHOOKS, manifest_hooks(f"https://127.0.0.1:{port}/{WEBHOOK_ID}", pki.ca.read_bytes())
        )
        try:
            # The API server takes new configurations up asynchronously; the operator's
            # server may not answer yet: a dry-run GPU pod comes back routed once both do.
            probe = hami_pod("probe", memory=1024)

            def routed() -> bool | None:
                try:
                    made = plane.create(f"/api/v1/namespaces/{HAMI_NS}/pods?dryRun=All", probe)
                except AdminRequestError:
                    return None
                return True if made["spec"].get("schedulerName") == SCHEDULER else None

            wait_for("the webhook to answer", routed, 60)
            yield running
        finally:
            plane.delete(f"{WEBHOOKS}/{HOOK_CONFIG}")


def hami_pod(name: str, *, memory: int, cores: int = 10) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": str(memory),
                            "nvidia.com/gpucores": str(cores),
                        }
                    },
                }
            ],
            "tolerations": TOLERATE_KWOK,
        },
    }


def claim_spec(memory: str, device_class: str = dra.SHARED_CLASS) -> dict[str, Any]:
    return one_request(_of_memory(memory, device_class))


def _of_memory(memory: str, device_class: str = dra.SHARED_CLASS) -> dict[str, Any]:
    return {"deviceClassName": device_class, "capacity": {"requests": {"memory": memory}}}


def make_claim(cp: ControlPlane, ns: str, name: str, memory: str = "1Gi") -> dict[str, Any]:
    return create_claim(cp, ns, name, _of_memory(memory))


def make_template(cp: ControlPlane, ns: str, name: str, memory: str = "1Gi") -> None:
    create_claim_template(cp, ns, name, _of_memory(memory))


def bound_claim(cp: ControlPlane, ns: str, pod: str) -> dict[str, Any] | None:
    """The pod's (first) claim, once the pod is bound and the claim allocated."""
    obj = cp.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    if not obj["spec"].get("nodeName"):
        return None
    entry = obj["spec"]["resourceClaims"][0]
    name = entry.get("resourceClaimName")
    if name is None:
        statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
        name = statuses[0].get("resourceClaimName") if statuses else None
    if name is None:
        return None
    claim = cp.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    return claim if (claim.get("status") or {}).get("allocation") else None


def refusal(cp: ControlPlane, ns: str, pod: dict[str, Any]) -> str:
    with pytest.raises(AdminRequestError) as refused:
        cp.create(f"/api/v1/namespaces/{ns}/pods", pod)
    assert refused.value.status in (400, 403), refused.value.body
    return refused.value.body


def test_two_replicas_of_a_hami_style_deployment_are_both_bound(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 6: the second pod of the same shape was refused ("exists with
    another spec"), so no Deployment of two replicas ran on the DRA path."""
    name = f"twins-{uuid.uuid4().hex[:6]}"
    template = hami_pod(name, memory=2048)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    plane.create(f"/apis/apps/v1/namespaces/{HAMI_NS}/deployments", deployment)
    try:

        def both_bound() -> list[dict[str, Any]] | None:
            pods = plane.get(f"/api/v1/namespaces/{HAMI_NS}/pods?labelSelector=app%3D{name}")
            found = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
            if len(found) == 2 and all(p["spec"].get("nodeName") for p in found):
                return found
            return None

        pods = wait_for("both replicas bound", both_bound, 90)
        templates = {p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in pods}
        assert len(templates) == 1  # one template, shared
        for pod in pods:
            assert pod["spec"]["schedulerName"] == SCHEDULER
            claim = bound_claim(plane, HAMI_NS, pod["metadata"]["name"])
            assert claim is not None
        events = plane.get(f"/apis/apps/v1/namespaces/{HAMI_NS}/replicasets")["items"]
        for replica_set in events:
            for condition in replica_set.get("status", {}).get("conditions") or []:
                assert condition.get("reason") != "FailedCreate", condition
    finally:
        plane.delete(f"/apis/apps/v1/namespaces/{HAMI_NS}/deployments/{name}")


def test_a_server_side_dry_run_makes_no_template(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 6: ``--dry-run=server`` made real templates."""
    shape = 3000 + int(uuid.uuid4().hex[:3], 16)  # a shape no other test makes
    made = plane.create(
        f"/api/v1/namespaces/{HAMI_NS}/pods?dryRun=All", hami_pod("dry", memory=shape)
    )
    template = made["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(AdminRequestError) as missing:
        plane.get(f"{RESOURCE}/namespaces/{HAMI_NS}/resourceclaimtemplates/{template}")
    assert missing.value.status == 404
    # The same pod for real makes it.
    plane.create(f"/api/v1/namespaces/{HAMI_NS}/pods", hami_pod("wet", memory=shape))
    try:
        found = plane.get(f"{RESOURCE}/namespaces/{HAMI_NS}/resourceclaimtemplates/{template}")
        assert found["metadata"]["annotations"]["vgpu-operator.io/template-digest"]
    finally:
        plane.delete(f"/api/v1/namespaces/{HAMI_NS}/pods/wet")


def test_a_pod_whose_claim_asks_our_class_is_routed_to_our_scheduler(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 3: kube-scheduler allocated such claims past the namespace quota."""
    ns = admitted_namespace(plane)
    make_template(plane, ns, "share", "4Gi")
    made = plane.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("plain", template="share"))
    assert made["spec"]["schedulerName"] == SCHEDULER
    claim = wait_for("the engine's allocation", lambda: bound_claim(plane, ns, "plain"), 60)
    assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == dra.DRIVER
    # Another scheduler named: refused, with the fix.
    body = refusal(plane, ns, claim_pod("other", template="share", scheduler="volcano"))
    assert "volcano" in body
    assert SCHEDULER in body
    # A claim not made yet: the pod passes unchanged (it may be another driver's).
    early = plane.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("early", claim="later"))
    assert early["spec"]["schedulerName"] == "default-scheduler"
    # A claim of another class is none of our business.
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "theirs"},
        "spec": {
            "devices": {
                "requests": [{"name": "x", "exactly": {"deviceClassName": "other.example.com"}}]
            }
        },
    }
    plane.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", other)
    theirs = plane.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("theirs", claim="theirs"))
    assert theirs["spec"]["schedulerName"] == "default-scheduler"


def test_kube_scheduler_may_not_allocate_our_class_for_a_pod_created_before_its_claim(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 3, the order the webhook cannot see: the pod passes unrouted (its
    claim did not exist), then a claim of our class appears under the name it gave.
    kube-scheduler would allocate it with no quota check; the allocation policy refuses
    its write, and the pod waits with the policy's sentence in kube-scheduler's Event."""
    ns = admitted_namespace(plane)
    made = plane.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("first", claim="after"))
    assert made["spec"]["schedulerName"] == "default-scheduler"
    make_claim(plane, ns, "after", "40Gi")

    def refused_event() -> str | None:
        events = plane.get(f"/api/v1/namespaces/{ns}/events")["items"]
        for event in events:
            if event["involvedObject"].get("name") == "first" and (
                "only the vgpu-operator allocates" in event.get("message", "")
            ):
                return str(event["message"])
        return None

    message = wait_for("kube-scheduler's refused allocation", refused_event, 90)
    assert "create the pod after its claims" in message
    claim = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/after")
    assert not (claim.get("status") or {}).get("allocation")
    assert not plane.get(f"/api/v1/namespaces/{ns}/pods/first")["spec"].get("nodeName")


def test_a_claim_whose_opaque_parameters_were_not_sent_compact_is_allocated(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """The control plane's client sends JSON with spaces (as most clients but kubectl do);
    the API server keeps an opaque config's parameters as sent, and a merge patch of such
    a claim re-encodes them compactly, which it took for a change of the immutable spec:
    the finalizer patch failed and the engine never allocated the claim."""
    ns = f"dra-spaced-{uuid.uuid4().hex[:8]}"
    plane.ensure_namespace(ns)
    spec = claim_spec("1Gi")
    spec["devices"]["config"] = [
        {"opaque": {"driver": dra.DRIVER, "parameters": {"note": "spaced out", "n": 1}}}
    ]
    plane.create(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "spaced"}, "spec": spec},
    )  # fmt: skip
    plane.create(
        f"/api/v1/namespaces/{ns}/pods", claim_pod("spaced", claim="spaced", scheduler=SCHEDULER)
    )
    claim = wait_for("the engine's allocation", lambda: bound_claim(plane, ns, "spaced"), 60)
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]


def test_the_device_count_quota_refuses_claims_past_the_count(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """examples/dra/device-quota.yaml on the live API server: four shares, not five."""
    ns = f"dra-quota-{uuid.uuid4().hex[:8]}"
    plane.ensure_namespace(ns)
    docs = list(yaml.safe_load_all((ROOT / "examples" / "dra" / "device-quota.yaml").read_text()))
    quota = next(d for d in docs if d["kind"] == "ResourceQuota")
    quota["metadata"]["namespace"] = ns
    plane.create(f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    key = f"{dra.SHARED_CLASS}.deviceclass.resource.k8s.io/devices"

    def counted() -> bool | None:
        found = plane.get(f"/api/v1/namespaces/{ns}/resourcequotas/{quota['metadata']['name']}")
        return True if key in (found.get("status") or {}).get("hard", {}) else None

    wait_for("the quota's status", counted, 60)
    for i in range(4):
        make_claim(plane, ns, f"share-{i}")
    with pytest.raises(AdminRequestError) as refused:
        make_claim(plane, ns, "share-4")
    assert refused.value.status == 403
    assert "exceeded quota" in refused.value.body
    assert key in refused.value.body


def test_kube_scheduler_joins_a_claim_the_engine_allocated_without_rewriting_it(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 6: kube-scheduler rewrote ``status.allocation`` of a claim the engine
    allocated (adding the allocationTimestamp the engine's lacked) when its pod joined.
    The namespace is not under the test webhook: the second pod stays kube-scheduler's."""
    ns = f"dra-join-{uuid.uuid4().hex[:8]}"
    plane.ensure_namespace(ns)
    make_claim(plane, ns, "shared", "2Gi")
    plane.create(
        f"/api/v1/namespaces/{ns}/pods", claim_pod("ours", claim="shared", scheduler=SCHEDULER)
    )
    first = wait_for("the engine's allocation", lambda: bound_claim(plane, ns, "ours"), 60)
    allocation = first["status"]["allocation"]
    assert allocation.get("allocationTimestamp")
    plane.create(f"/api/v1/namespaces/{ns}/pods", claim_pod("upstream", claim="shared"))
    wait_for("kube-scheduler's pod bound", lambda: bound_claim(plane, ns, "upstream"), 60)
    claim = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/shared")
    assert claim["status"]["allocation"] == allocation
    pods = {
        plane.get(f"/api/v1/namespaces/{ns}/pods/{p}")["metadata"]["uid"]
        for p in ("ours", "upstream")
    }
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == pods


def test_a_template_no_pod_names_is_collected(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    """Issue 33 item 6: the webhook's templates were never deleted."""
    gone_shape = 5000 + int(uuid.uuid4().hex[:3], 16)
    kept_shape = gone_shape + 5000
    gone = plane.create(f"/api/v1/namespaces/{HAMI_NS}/pods", hami_pod("gone", memory=gone_shape))
    kept = plane.create(f"/api/v1/namespaces/{HAMI_NS}/pods", hami_pod("kept", memory=kept_shape))
    gone_template = gone["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    kept_template = kept["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    templates = f"{RESOURCE}/namespaces/{HAMI_NS}/resourceclaimtemplates"
    # A template the tenant made under the webhook's prefix is not the webhook's.
    mine = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"vgpu-tenant-{uuid.uuid4().hex[:6]}",
            "labels": {"app.kubernetes.io/managed-by": "vgpu-operator"},
        },
        "spec": {"spec": claim_spec("1Gi")},
    }
    plane.create(templates, mine)
    try:
        plane.delete(f"/api/v1/namespaces/{HAMI_NS}/pods/gone")

        def collected() -> bool | None:
            try:
                plane.get(f"{templates}/{gone_template}")
            except AdminRequestError as exc:
                return True if exc.status == 404 else None
            return None

        wait_for("the unused template to be collected", collected, 60)
        assert plane.get(f"{templates}/{kept_template}")
        assert plane.get(f"{templates}/{mine['metadata']['name']}")
    finally:
        plane.delete(f"/api/v1/namespaces/{HAMI_NS}/pods/kept")
