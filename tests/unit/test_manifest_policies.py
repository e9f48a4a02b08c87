"""The admission policies of manifests/ agree with the code they protect: the allocation
record names every key the books and the device plugin read, the GPU-pod policy names the
device config's scheduler and the webhook's idea of a managed resource."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from vgpu_operator import names
from vgpu_operator.devices.catalog import VENDOR_TABLE

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _policy(name: str) -> dict[str, Any]:
    return next(d for d in _docs(name) if d["kind"] == "ValidatingAdmissionPolicy")


def _variable(policy: dict[str, Any], name: str) -> str:
    return str(next(v for v in policy["spec"]["variables"] if v["name"] == name)["expression"])


def _quoted(expression: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", expression))


def test_the_allocation_record_names_every_key_the_books_and_the_plugin_read() -> None:
    record = _quoted(_variable(_policy("allocation-record-policy.yaml"), "recordKeys"))
    wanted = {
        names.ASSIGNED_NODE,
        names.ASSIGNED_TIME,
        names.BIND_PHASE,
        names.BIND_TIME,
        names.MIG_ALLOCATIONS,
        *(spec.to_allocate_annotation for spec in VENDOR_TABLE),
        *(spec.allocated_annotation for spec in VENDOR_TABLE),
    }
    assert record == wanted


def test_the_agent_writes_the_same_two_keys_in_both_policies() -> None:
    record = _quoted(_variable(_policy("allocation-record-policy.yaml"), "agentKeys"))
    own_pods = _quoted(_variable(_policy("agent-device-plugin.yaml"), "agentKeys"))
    assert record == own_pods == {names.BIND_PHASE, names.NVIDIA_DEVICES_TO_ALLOCATE}


def test_the_gpu_pod_policy_names_the_device_configs_scheduler() -> None:
    config_map = next(d for d in _docs("device-config.yaml") if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["device-config.yaml"])
    scheduler = _quoted(_variable(_policy("gpu-pod-policy.yaml"), "scheduler"))
    assert scheduler == {config["scheduler"]["schedulerName"]}


def test_the_gpu_pod_policy_sees_the_pods_the_webhook_sees() -> None:
    webhook = next(d for d in _docs("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration")
    hook = next(h for h in webhook["webhooks"] if h["name"] == "pods.vgpu-operator.io")
    routed = {c["name"]: c["expression"] for c in hook["matchConditions"]}
    checked = {
        c["name"]: c["expression"]
        for c in _policy("gpu-pod-policy.yaml")["spec"]["matchConditions"]
    }
    assert checked["names-a-managed-resource"] == routed["names-a-managed-resource"]


def test_the_claims_hook_sees_exactly_the_pods_the_gpu_hook_does_not() -> None:
    """Pods naming ResourceClaims go to the operator (claim routing) unless they name a
    managed resource, which the first hook sends already (never both: no second mutation)."""
    webhook = next(d for d in _docs("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration")
    hooks = {h["name"]: h for h in webhook["webhooks"]}
    gpu = {c["name"]: c["expression"] for c in hooks["pods.vgpu-operator.io"]["matchConditions"]}
    claims = hooks["claims.pods.vgpu-operator.io"]
    conditions = {c["name"]: c["expression"] for c in claims["matchConditions"]}
    negated = conditions["names-no-managed-resource"].strip()
    assert negated == "!" + gpu["names-a-managed-resource"].strip()
    assert "resourceClaims" in conditions["names-resource-claims"]
    for hook in hooks.values():
        assert hook["clientConfig"]["service"]["path"] == "/mutate-pods"
    assert hooks["pods.vgpu-operator.io"]["sideEffects"] == "NoneOnDryRun"


def test_both_policies_are_installed_and_deny() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    for name in ("allocation-record-policy.yaml", "gpu-pod-policy.yaml"):
        assert name in kustomization["resources"]
        binding = next(d for d in _docs(name) if d["kind"] == "ValidatingAdmissionPolicyBinding")
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert _policy(name)["spec"]["failurePolicy"] == "Fail"
    assert "hami-scheduler-opt-in.yaml" not in kustomization["resources"]
