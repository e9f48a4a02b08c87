"""What the API server does with a PodGroup's priority, checked with a tenant's own identity
(issue 44 item 2, issue 47 item 3).

A PodGroup (``scheduling.k8s.io/v1beta1``) may name a ``priorityClassName``; the API server
resolves its ``spec.priority`` from it. The question the engine's rule rests on: does the
server keep a PodGroup's priority consistent with what the namespace's pods may use? The
ResourceQuota that docs/operations.md recommends for critical classes (``pods: "0"``,
scoped to those classes) stops a tenant's pod of such a class; these tests record that it
does not stop a PodGroup naming the same class, so the engine trusts no PodGroup priority
above its members' own (``gang_preemption.member_priority``), and that the optional
policy ``manifests/pod-group-policy.yaml`` refuses such a PodGroup at creation.
The operator's side, on both dialects: ``test_operator_gang_victims.py`` and
``test_dra_preemption.py`` (a PodGroup naming a class its namespace may not use preempts
nobody).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.test_tenant_attacks import Refused, Tenant, aggregate_cluster_role, make_tenant

from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
POLICY = env.REPO / "manifests" / "pod-group-policy.yaml"
HIGH = 100000
LOW = 10


def _pod_group(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": gangs.API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}, **spec},
    }


class Namespace:
    """A tenant's namespace with two classes of its own and, for ``high``, the quota
    docs/operations.md recommends (no pod of that class)."""

    def __init__(self, cp: ControlPlane, tenant: Tenant) -> None:
        self.cp = cp
        self.tenant = tenant
        self.name = tenant.namespace
        self.high = f"{self.name}-high"
        self.low = f"{self.name}-low"

    @property
    def groups(self) -> str:
        return f"/apis/{gangs.API_VERSION}/namespaces/{self.name}/podgroups"

    def forbid_high_pods(self) -> None:
        env.no_pods_of_class(self.cp, self.name, "no-high-priority", self.high)

    def tenant_pod(self, name: str, priority_class: str) -> dict[str, Any]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "priorityClassName": priority_class,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        return self.tenant.create_pod(pod)

    def tenant_group(self, name: str, **spec: Any) -> dict[str, Any]:
        return self.tenant.request("POST", self.groups, _pod_group(name, **spec))


@pytest.fixture
def space(control_plane: ControlPlane) -> Iterator[Namespace]:
    cp = control_plane
    aggregate_cluster_role(cp, "edit")
    tenant = make_tenant(cp, env.unique("pg-tenant"))
    found = Namespace(cp, tenant)
    for name, value in ((found.high, HIGH), (found.low, LOW)):
        cp.create(
            CLASSES,
            {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": name}, "value": value},
        )
    try:
        yield found
    finally:
        for name in (found.high, found.low):
            cp.delete(f"{CLASSES}/{name}")
        env.cleanup_group(cp, found.name)


def _refusal(action: Any) -> str | None:
    try:
        action()
    except Refused as exc:
        return exc.message
    return None


def test_the_quota_that_stops_a_tenants_pod_of_a_class_does_not_stop_a_pod_group_naming_it(
    space: Namespace,
) -> None:
    space.forbid_high_pods()

    def high_pod_refused() -> str | None:
        message = _refusal(lambda: space.tenant_pod(env.unique("high"), space.high))
        return message if message and "exceeded quota" in message else None

    env.wait_until("the quota to refuse the tenant's high pod", high_pod_refused, 30)
    # The finding of issue 44: the same tenant creates a PodGroup naming the class, and the
    # API server resolves its priority from it. No quota scope counts PodGroups.
    group = space.tenant_group("lifted", priorityClassName=space.high)
    assert group["spec"]["priority"] == HIGH
    # The Priority admission plugin holds a named class and a given priority together,
    # as it does for pods: a tenant cannot write a priority of its own choosing ...
    mismatch = _refusal(
        lambda: space.tenant_group("forged", priorityClassName=space.low, priority=HIGH)
    )
    assert mismatch is not None
    # ... nor give one without a class.
    unnamed = _refusal(lambda: space.tenant_group("bare", priority=HIGH))
    assert unnamed is not None
    # A group naming no class gets the default priority (0, no default class here).
    plain = space.tenant_group("plain")
    assert plain["spec"].get("priority", 0) == 0
    assert gangs.class_priority(plain) is None


def _apply_policy(cp: ControlPlane) -> list[tuple[str, str]]:
    made = []
    for doc in yaml.safe_load_all(POLICY.read_text()):
        kind = doc["kind"]
        plural = {
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        }[kind]
        path = f"/apis/admissionregistration.k8s.io/v1/{plural}"
        cp.create(path, doc)
        made.append((path, doc["metadata"]["name"]))
    return made


def test_the_pod_group_policy_refuses_a_class_the_namespaces_quota_allows_no_pod_of(
    space: Namespace,
) -> None:
    made = _apply_policy(space.cp)
    try:
        space.forbid_high_pods()

        def refused() -> str | None:
            return _refusal(
                lambda: space.tenant_group(env.unique("lifted"), priorityClassName=space.high)
            )

        message = env.wait_until("the policy to refuse the PodGroup", refused, 30)
        assert f"names priorityClassName {space.high}" in message
        assert "ResourceQuota no-high-priority allows no pod of" in message
        assert "name a class the namespace's pods may use" in message
        # Classes the quota leaves alone, and a group naming none, are admitted.
        assert space.tenant_group("low", priorityClassName=space.low)["spec"]["priority"] == LOW
        space.tenant_group("plain")
        space.cp.delete(f"/api/v1/namespaces/{space.name}/resourcequotas/no-high-priority")

        def admitted() -> bool:
            try:
                space.tenant_group(env.unique("lifted"), priorityClassName=space.high)
            except Refused:
                return False
            return True

        env.wait_until("the PodGroup to be admitted without the quota", admitted, 30)
    finally:
        for path, name in reversed(made):
            try:
                space.cp.delete(f"{path}/{name}")
            except AdminRequestError as exc:
                if exc.status != 404:
                    raise
