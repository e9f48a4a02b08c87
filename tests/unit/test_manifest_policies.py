"""The admission policies of manifests/ agree with the code they protect: the allocation
record names every key the books and the device plugin read, the GPU-pod policy names the
device config's scheduler and the webhook's idea of a managed resource, the claim policies
name the driver's config key and the operator's identity, and say the same of claims and
templates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from vgpu_operator import names
from vgpu_operator.agent.dra import prepare
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra, nvidia
from vgpu_operator.devices.catalog import VENDOR_TABLE, load_config_yaml
from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.dialects.claims import claim_admission

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


POLICY_FILES = (
    "allocation-record-policy.yaml",
    "gpu-pod-policy.yaml",
    "claim-policy.yaml",
    "pod-group-policy.yaml",
)


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _policy(name: str, policy: str | None = None) -> dict[str, Any]:
    return next(
        d
        for d in _docs(name)
        if d["kind"] == "ValidatingAdmissionPolicy"
        and (policy is None or d["metadata"]["name"] == policy)
    )


def _words(expression: str) -> str:
    return " ".join(expression.split())


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
    assert record == own_pods == {names.BIND_PHASE, nvidia.TO_ALLOCATE_ANNOTATION}


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
    webhooks = _words(routed["names-a-managed-resource"])
    # Every pod the webhook routes, and every pod with claims (the webhook's converted
    # pods among them: after the conversion they ask for no managed resource).
    assert _words(checked["a-gpu-pod-or-a-pod-with-claims"]) == (
        f"{webhooks} || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)"
    )
    managed = _words(_variable(_policy("gpu-pod-policy.yaml"), "managed"))
    prefix = claim_admission.ENTRY_PREFIX
    assert managed == (
        f"{webhooks} || (has(object.spec.resourceClaims) && "
        f"object.spec.resourceClaims.exists(r, r.name.startsWith('{prefix}')))"
    )


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


def test_the_policies_are_installed_and_deny() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    for name in POLICY_FILES:
        assert name in kustomization["resources"]
        policies = [d for d in _docs(name) if d["kind"] == "ValidatingAdmissionPolicy"]
        bindings = {
            d["spec"]["policyName"]: d
            for d in _docs(name)
            if d["kind"] == "ValidatingAdmissionPolicyBinding"
        }
        for policy in policies:
            binding = bindings[policy["metadata"]["name"]]
            assert binding["spec"]["validationActions"] == ["Deny"]
            assert policy["spec"]["failurePolicy"] == "Fail"
    assert "hami-scheduler-opt-in.yaml" not in kustomization["resources"]


def test_the_claim_policies_say_the_same_of_claims_and_templates() -> None:
    claims = _policy("claim-policy.yaml", "vgpu-claims")
    templates = _policy("claim-policy.yaml", "vgpu-claim-templates")
    for name in (
        "labels", "allowHamiCoreOff", "allowAdminAccess", "hamiCoreOff", "hamiCoreNotBool",
        "adminAccess",
    ):  # fmt: skip
        on_claims = _words(_variable(claims, name))
        on_templates = _words(_variable(templates, name))
        assert on_templates == on_claims.replace(
            "has(object.spec.devices)", ("has(object.spec.spec) && has(object.spec.spec.devices)")
        ).replace("object.spec.devices", "object.spec.spec.devices"), name
    assert templates["spec"]["validations"] == claims["spec"]["validations"][:3]
    (rule,) = claims["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaims"]
    (rule,) = templates["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaimtemplates"]


def test_the_claim_policy_reads_hami_core_off_as_the_agent_and_the_books_do() -> None:
    expression = _variable(_policy("claim-policy.yaml", "vgpu-claims"), "hamiCoreOff")
    assert f"c.opaque.driver == '{dra.DRIVER}'" in expression
    assert prepare.CONFIG_HAMI_CORE == claim_ledger.CONFIG_HAMI_CORE == "hamiCore"
    assert f"c.opaque.parameters.{prepare.CONFIG_HAMI_CORE} == false" in expression
    # Anything but a boolean is refused (issue 44: a string "false" was taken as on).
    not_bool = _variable(_policy("claim-policy.yaml", "vgpu-claims"), "hamiCoreNotBool")
    assert f"type(c.opaque.parameters.{prepare.CONFIG_HAMI_CORE}) != bool" in not_bool
    # The same namespace label as CUDA_DISABLE_CONTROL on pods.
    assert _variable(_policy("claim-policy.yaml", "vgpu-claims"), "allowHamiCoreOff") == (
        _variable(_policy("gpu-pod-policy.yaml"), "allowHamiCoreOff")
    )


def test_the_claim_policy_lets_the_operator_release_a_claim() -> None:
    releaser = _variable(_policy("claim-policy.yaml", "vgpu-claims"), "releaser")
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in _docs("rbac.yaml")
        if d["kind"] == "ServiceAccount"
    }
    named = {
        tuple(user.split(":")[2:])
        for user in _quoted(releaser)
        if user.startswith("system:serviceaccount:vgpu-operator:")
    }
    assert named == {("vgpu-operator", "vgpu-operator")}
    assert named <= accounts


def test_the_policies_are_written_as_the_api_server_stores_them() -> None:
    """The fields the API server defaults, spelled out: a second `kubectl apply` of
    manifests/ then finds nothing to change ("unchanged", not "configured")."""
    for name in sorted(p.name for p in MANIFESTS.glob("*.yaml")):
        for policy in (d for d in _docs(name) if d["kind"] == "ValidatingAdmissionPolicy"):
            constraints = policy["spec"]["matchConstraints"]
            assert constraints["matchPolicy"] == "Equivalent", name
            assert constraints["namespaceSelector"] == {}, name
            assert constraints["objectSelector"] == {}, name
            for rule in constraints["resourceRules"]:
                assert rule["scope"] == "*", name


def test_the_critical_priority_example_is_the_documented_quota() -> None:
    text = (MANIFESTS.parent / "docs" / "operations.md").read_text()
    section = text.split("**Critical priority classes.**", 1)[1]
    documented = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    example = MANIFESTS.parent / "examples" / "security" / "no-critical-priority-quota.yaml"
    assert yaml.safe_load(example.read_text()) == documented
    assert "examples/security/no-critical-priority-quota.yaml" in section.split("**", 1)[0]


def test_the_shipped_device_config_is_the_built_in_one_and_the_administrators() -> None:
    """Not installed by `kubectl apply -k manifests/` (a re-apply would reset an
    administrator's edits): until an administrator creates it, the operator and the
    agents run on the same settings, built in."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert "device-config.yaml" not in kustomization["resources"]
    config_map = next(d for d in _docs("device-config.yaml") if d["kind"] == "ConfigMap")
    shipped = load_config_yaml(config_map["data"]["device-config.yaml"])
    built_in = DeviceConfig()
    vendors = set(shipped.model_extra or {})
    assert shipped.model_dump(exclude=vendors) == built_in.model_dump()
    for spec in VENDOR_TABLE:  # each vendor's section as the engine reads it
        key, read_as = spec.config_key, spec.config_type
        assert shipped.section(key, read_as) == built_in.section(key, read_as)
