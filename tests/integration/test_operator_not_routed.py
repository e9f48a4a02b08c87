"""A GPU pod created while the webhook did not answer keeps ``default-scheduler``; it can
never be adopted (the scheduler name is immutable), so the operator tells its owner, on
the pod, how to fix it."""

from __future__ import annotations

from typing import Any

from integration import operator_env as env

from vgpu_operator.control import reporting
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ControlPlane


def _default_scheduler_pod(namespace: str, name: str, limits: dict[str, str]) -> dict[str, Any]:
    pod = env.plain_pod(namespace, name, limits)
    # Nothing places it: no node matches (the default scheduler does not run here).
    pod["spec"]["nodeSelector"] = {env.TEST_LABEL: f"{namespace}-none"}
    return pod


def _report_of(
    cp: ControlPlane, namespace: str, pod: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The not-routed condition on ``pod`` and its Events, once both are written."""

    def reported() -> dict[str, Any] | None:
        found = env.get_pod(cp, namespace, pod)
        return dict(env.condition(found, reporting.CONDITION_NOT_ROUTED) or {}) or None

    condition = env.wait_until("the not-routed condition", reported, 60)
    events = env.wait_until("the not-routed Event", lambda: env.events_for(cp, namespace, pod), 30)
    return condition, events


def test_a_gpu_pod_left_to_the_default_scheduler_is_reported_with_the_fix(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
    # Created before the operator runs, as while its webhook was down.
    gpu = _default_scheduler_pod(namespace, "gpu", {"nvidia.com/gpu": "1"})
    cpu = _default_scheduler_pod(namespace, "cpu", {"cpu": "1"})
    env.create_pod(cp, gpu)
    env.create_pod(cp, cpu)
    try:
        with OperatorThread(env.options(cp, namespace)) as operator:
            condition, events = _report_of(cp, namespace, "gpu")
            metric = operator.app.metrics.registry.get_sample_value(
                "vgpu_operator_gpu_pods_not_routed_total"
            )
        assert condition["status"] == "False"
        assert "nvidia.com/gpu" in condition["message"]
        assert f"schedulerName: {scheduler}" in condition["message"]
        assert [e["reason"] for e in events] == [reporting.REASON_NOT_ROUTED]
        assert events[0]["type"] == "Warning"
        assert metric is not None
        assert metric >= 1
        # A CPU pod on the default scheduler is none of our business.
        assert (
            env.condition(env.get_pod(cp, namespace, "cpu"), reporting.CONDITION_NOT_ROUTED) is None
        )
        assert env.events_for(cp, namespace, "cpu") == []
    finally:
        env.cleanup_group(cp, namespace)


def test_a_gpu_pod_bound_without_the_gpu_scheduler_is_reported_once(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Issue 33 item 7: a GPU pod that missed the webhook and was bound by kube-scheduler
    (here: bound at creation, which the operator sees the same way) fails at Allocate;
    its owner is told (once: tests/unit/control/test_state_feed.py)."""
    cp = control_plane
    env.new_scheduler(cp, namespace)
    bound = _default_scheduler_pod(namespace, "bound", {"nvidia.com/gpu": "1"})
    bound["spec"].pop("nodeSelector")
    bound["spec"]["nodeName"] = f"{namespace}-elsewhere"
    env.create_pod(cp, bound)
    try:
        with OperatorThread(env.options(cp, namespace)):
            condition, events = _report_of(cp, namespace, "bound")
        assert condition["status"] == "False"
        assert "nvidia.com/gpu" in condition["message"]
        assert [e["reason"] for e in events] == [reporting.REASON_NOT_ROUTED]
        assert events[0]["type"] == "Warning"
    finally:
        env.cleanup_group(cp, namespace)


def test_a_pod_whose_claims_ask_our_classes_left_to_the_default_scheduler_is_reported(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Issue 44: a pod naming a ResourceClaim of our DeviceClasses that missed the webhook
    keeps default-scheduler, whose allocation the claim policy refuses: it looped on that
    refusal and its owner was told nothing. It is reported as a GPU pod is."""
    from integration import dra_env

    from vgpu_operator.devices import dra

    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
    dra_env.create_claim(cp, namespace, "share", {"deviceClassName": dra.SHARED_CLASS})
    pod = dra_env.claim_pod("claims", claim="share")
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["nodeSelector"] = {env.TEST_LABEL: f"{namespace}-none"}
    env.create_pod(cp, pod)  # no webhook runs: it keeps default-scheduler
    try:
        with OperatorThread(env.options(cp, namespace)):
            condition, events = _report_of(cp, namespace, "claims")
        assert f"DeviceClass {dra.SHARED_CLASS}" in condition["message"]
        assert f"schedulerName: {scheduler}" in condition["message"]
        assert [e["reason"] for e in events] == [reporting.REASON_NOT_ROUTED]
    finally:
        env.cleanup_group(cp, namespace)
