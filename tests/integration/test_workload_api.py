"""The control plane serves gang scheduling's API (scheduling.k8s.io/v1beta1, GenericWorkload
on): PodGroups and Workloads can be written, a pod names its group, and kube-scheduler and
kube-controller-manager start with the same gates."""

from __future__ import annotations

from vgpu_operator.testing.controlplane import ControlPlane


def _pod_group(name: str, min_count: int) -> dict[str, object]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": min_count}},
            "schedulingConstraints": {"topology": [{"key": "vgpu.io/island"}]},
            "disruptionMode": {"all": {}},
        },
    }


def test_scheduling_v1beta1_is_served(control_plane: ControlPlane, namespace: str) -> None:
    resources = control_plane.get("/apis/scheduling.k8s.io/v1beta1")["resources"]
    names = {r["name"] for r in resources}
    assert {"podgroups", "podgroups/status", "workloads"} <= names
    base = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups"
    made = control_plane.create(base, _pod_group("train", 4))
    assert made["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
    assert made["spec"]["disruptionMode"] == {"all": {}}
    # minCount is mutable.
    changed = control_plane.patch(
        f"{base}/train", {"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}
    )
    assert changed["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3


def test_a_pod_names_its_group(control_plane: ControlPlane, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "worker-0"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "schedulingGroup": {"podGroupName": "train"},
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    made = control_plane.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    # Without the gate the API server drops the field it does not know.
    assert made["spec"]["schedulingGroup"] == {"podGroupName": "train"}


def test_scheduler_and_controller_manager_start_with_the_gates(
    control_plane: ControlPlane,
) -> None:
    control_plane.start_scheduler()
    control_plane.start_controller_manager(["resourceclaim-controller"])
    try:
        for component in ("kube-scheduler", "kube-controller-manager"):
            started = control_plane.log_path(component).read_text(errors="replace")
            assert "--feature-gates=GenericWorkload=true" in started
    finally:
        control_plane.stop_scheduler()
        control_plane.stop_controller_manager()
