"""The Helm chart (charts/vgpu-operator): `helm lint`; with its default values it renders
what `kubectl kustomize manifests/` renders; its schema refuses bad values; its values do
what they say; and the README's `helm install` on a fresh API server gives a working
install: the operator and the agent run on their own ServiceAccounts' tokens under the
chart's RBAC and admission policies (the same checks as test_install.py's kustomize route,
reused below).

helm is built from the Go module proxy and cached like kubectl (`make observability-tools`).
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import test_install as kustomize_route
from integration.test_install import Cluster

from vgpu_operator.testing.controlplane import Binaries, ControlPlane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vgpu-operator"
README = REPO / "README.md"

Key = tuple[str, str, str | None, str]


def _run(helm: Path, args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(helm), *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"helm {shlex.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def render(
    helm: Path, values: Mapping[str, Any] | None = None, *, crds: bool = True
) -> dict[Key, dict[str, Any]]:
    """The chart's objects, by (apiVersion, kind, namespace, name); ``values`` maps value
    paths to values (passed with --set-json: `--set` would make 1.5 a string)."""
    args = ["template", "vgpu-operator", str(CHART)]
    if crds:
        args.append("--include-crds")
    for path, value in (values or {}).items():
        args += ["--set-json", f"{path}={json.dumps(value)}"]
    return objects(_run(helm, args))


def objects(text: str) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        meta = doc["metadata"]
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"])
        assert key not in out, f"{key} twice"
        out[key] = doc
    return out


def normalized(obj: Any, *, configmap: bool = False) -> Any:
    """For comparing the two renders: a ConfigMap's YAML files as parsed YAML, and strings
    that span lines with their whitespace collapsed. kustomize's YAML writer re-folds a
    folded scalar (``>-``) whose next line is more indented into a literal one with an
    added blank line (the webhook's CEL condition): the same CEL, other whitespace."""
    if isinstance(obj, dict):
        is_configmap = obj.get("kind") == "ConfigMap"
        out = {}
        for key, value in obj.items():
            if configmap and isinstance(value, str) and key.endswith((".yaml", ".yml")):
                out[key] = yaml.safe_load(value)
            else:
                out[key] = normalized(value, configmap=is_configmap and key == "data")
        return out
    if isinstance(obj, list):
        return [normalized(item) for item in obj]
    if isinstance(obj, str) and "\n" in obj:
        return " ".join(obj.split())
    return obj


# --- lint, render, schema ----------------------------------------------------------------------


def test_helm_lint_passes_strictly(helm: Path) -> None:
    out = _run(helm, ["lint", "--strict", str(CHART)])
    assert "0 chart(s) failed" in out


def test_the_default_render_is_what_kustomize_renders(helm: Path, kubectl: Path) -> None:
    """Object for object, field for field (normalized, see ``normalized``)."""
    done = subprocess.run(
        [str(kubectl), "kustomize", "manifests/"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    kustomized = objects(done.stdout)
    charted = render(helm)
    # The device config: the chart renders it from its values; a kustomize install leaves
    # it to the administrator (manifests/device-config.yaml, created by hand).
    device_config = ("v1", "ConfigMap", "vgpu-operator", "vgpu-device-config")
    assert device_config not in kustomized
    (shipped,) = objects((REPO / "manifests" / "device-config.yaml").read_text()).values()
    kustomized[device_config] = shipped
    missing = sorted(set(kustomized) - set(charted), key=str)
    extra = sorted(set(charted) - set(kustomized), key=str)
    assert not missing, f"the chart does not render {missing}: run `make chart`"
    assert not extra, f"the chart renders more than manifests/: {extra}"
    for key, expected in kustomized.items():
        want, got = normalized(expected), normalized(charted[key])
        if want != got:
            diff = difflib.unified_diff(
                yaml.safe_dump(want).splitlines(),
                yaml.safe_dump(got).splitlines(),
                "kustomize",
                "helm",
                lineterm="",
            )
            pytest.fail(f"{key} differs:\n" + "\n".join(diff))


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("devicePlugin.deviceSplitCount=0", "deviceSplitCount"),
        ("devicePlugin.deviceMemoryScaling=-1", "deviceMemoryScaling"),
        ("devicePlugin.deviceCoreScaling=0", "deviceCoreScaling"),
        ("scheduler.admissionWebhook.failurePolicy=Sometimes", "failurePolicy"),
        ("schedulerName=Not_A_Name", "schedulerName"),
        ("resourceMem=gpumem", "resourceMem"),
        ("devicePlugin.runtimeClassName=nvidia runtime", "runtimeClassName"),
        ("scheduler.admissionWebhook.whitelistNamespaces[0]=Kube_System", "whitelistNamespaces"),
        ("devicePlugin.nvidiaNodeSelector.gpu=o n", "nvidiaNodeSelector"),
        ("scheduler.image.pullPolicy=Sometimes", "pullPolicy"),
        ("scheduler.defrag.maxEvictions=0", "maxEvictions"),
        ("scheduler.defrag.ownerKinds[0]=not a kind", "ownerKinds"),
        ("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=fastest", "gpuSchedulerPolicy"),
        ("devices.nvidia.gpuCorePolicy=strict", "gpuCorePolicy"),
        # HAMi's name for the scheduler image: here scheduler.image (a typo is refused, not
        # silently ignored).
        ("scheduler.extender.image.tag=v2", "extender"),
        ("devicePlugin.libPath=relative/path", "libPath"),
        ("serviceMonitor.interval=often", "interval"),
    ],
)
def test_the_schema_refuses_bad_values(helm: Path, value: str, named: str) -> None:
    done = subprocess.run(
        [str(helm), "template", "x", str(CHART), "--set", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


def _one(objs: Mapping[Key, dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for (_, k, _, n), o in objs.items() if k == kind and n == name]
    assert len(found) == 1, (kind, name, list(objs))
    return found[0]


def _device_config(objs: Mapping[Key, dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        _one(objs, "ConfigMap", "vgpu-device-config")["data"]["device-config.yaml"]
    )
    return config


def test_the_values_do_what_they_say(helm: Path) -> None:
    objs = render(
        helm,
        {
            "schedulerName": "hami-scheduler",
            "devicePlugin.deviceSplitCount": 4,
            "devicePlugin.deviceMemoryScaling": 1.5,
            "devicePlugin.deviceCoreScaling": 2,
            "devicePlugin.runtimeClassName": "",
            "devicePlugin.nvidiaNodeSelector": {"gpu": "on"},
            "devicePlugin.libPath": "/opt/vgpu",
            "scheduler.admissionWebhook.failurePolicy": "Fail",
            "scheduler.admissionWebhook.whitelistNamespaces": ["istio-system"],
            "global.imageRegistry": "registry.example:5000",
            "global.imagePullSecrets": ["pull"],
            "scheduler.image.tag": "v9",
            "namespaceOverride": "gpu-system",
            "resourceMem": "example.com/gpumem",
        },
        crds=False,
    )
    config = _device_config(objs)
    assert config["scheduler"]["schedulerName"] == "hami-scheduler"
    nvidia = config["nvidia"]
    assert (nvidia["deviceSplitCount"], nvidia["deviceMemoryScaling"]) == (4, 1.5)
    assert (nvidia["deviceCoreScaling"], nvidia["resourceMemoryName"]) == (2, "example.com/gpumem")
    agent = _one(objs, "DaemonSet", "vgpu-agent")
    pod = agent["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    assert pod["nodeSelector"] == {"gpu": "on"}
    assert "affinity" not in pod
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example:5000/vgpu-operator:0.1.0"
    args = container["args"]
    for flag in (
        "--device-split-count=4",
        "--device-memory-scaling=1.5",
        "--device-core-scaling=2",
        "--hami-core-dir=/opt/vgpu",
    ):
        assert flag in args
    assert {
        "name": "hami-core",
        "hostPath": {"path": "/opt/vgpu", "type": "DirectoryOrCreate"},
    } in (pod["volumes"])
    operator = _one(objs, "Deployment", "vgpu-operator")
    image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example:5000/vgpu-operator:v9"
    webhook = _one(objs, "MutatingWebhookConfiguration", "vgpu-operator")["webhooks"][0]
    assert webhook["failurePolicy"] == "Fail"
    skipped = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert skipped == ["kube-system", "gpu-system", "istio-system"]
    assert webhook["clientConfig"]["service"]["namespace"] == "gpu-system"
    # Every namespaced object, the namespace itself, and the policies' user name follow.
    namespaces = {ns for (_, kind, ns, _) in objs if ns is not None}
    assert namespaces == {"gpu-system", "vgpu-node-leases"}
    assert _one(objs, "Namespace", "gpu-system")
    policy = _one(objs, "ValidatingAdmissionPolicy", "vgpu-agent-own-node")
    assert "system:serviceaccount:gpu-system:vgpu-agent" in json.dumps(policy)
    assert "vgpu-operator:vgpu-agent" not in json.dumps(list(objs.values()))
    assert not list(_namespace_fields(list(objs.values()), "vgpu-operator"))


def _namespace_fields(obj: Any, value: str, path: str = "") -> Iterator[str]:
    """Where a ``namespace`` field (metadata, a subject, a Service reference) is ``value``."""
    if isinstance(obj, dict):
        for key, item in obj.items():
            if key == "namespace" and item == value:
                yield f"{path}.{key}"
            yield from _namespace_fields(item, value, f"{path}.{key}")
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            yield from _namespace_fields(item, value, f"{path}[{index}]")


def test_the_namespace_may_be_left_to_the_release(helm: Path) -> None:
    objs = objects(
        _run(
            helm,
            [
                "template",
                "x",
                str(CHART),
                "--namespace=gpu",
                "--set=namespaceOverride=",
                "--set=createNamespace=false",
            ],
        )
    )
    assert {name for (_, kind, _, name) in objs if kind == "Namespace"} == {"vgpu-node-leases"}
    assert _one(objs, "Deployment", "vgpu-operator")["metadata"]["namespace"] == "gpu"


def test_the_service_monitors_and_the_dashboard_are_optional(helm: Path) -> None:
    objs = render(
        helm,
        {
            "serviceMonitor.enabled": True,
            "serviceMonitor.labels": {"release": "prometheus"},
            "dashboard.enabled": True,
            "dashboard.namespace": "monitoring",
        },
        crds=False,
    )
    monitors = {n: o for (_, k, _, n), o in objs.items() if k == "ServiceMonitor"}
    assert set(monitors) == {"vgpu-operator", "vgpu-agent"}
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["honorLabels"] is True
        assert endpoint["port"] == "metrics"
    # Each selects a Service that has the metrics port.
    services = [o for (_, k, _, _), o in objs.items() if k == "Service"]
    for monitor in monitors.values():
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert any(
            s["metadata"]["labels"].items() >= selector.items()
            and "metrics" in {p["name"] for p in s["spec"]["ports"]}
            for s in services
        ), selector
    dashboard = _one(objs, "ConfigMap", "vgpu-operator-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    committed = (CHART / "dashboards" / "vgpu-operator.json").read_text()
    assert json.loads(dashboard["data"]["vgpu-operator.json"]) == json.loads(committed)
    defaults = render(helm, crds=False)
    assert not [k for k in defaults if k[1] in ("ServiceMonitor",) or k[3].endswith("dashboard")]


def test_defragmentation_and_its_plan_reader_are_optional(helm: Path) -> None:
    defaults = render(helm, crds=False)
    operator = _one(defaults, "Deployment", "vgpu-operator")
    assert not [
        a
        for a in operator["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--defrag")
    ]
    assert not [k for k in defaults if k[3] == "vgpu-operator-defrag-plan"]
    objs = render(
        helm,
        {
            "scheduler.defrag.enabled": True,
            "scheduler.defrag.interval": 30,
            "scheduler.defrag.maxEvictions": 2,
            "scheduler.defrag.allowBarePods": True,
            "scheduler.defrag.ownerKinds": ["Trainer", "example.com/Notebook"],
            "defragPlanReader.enabled": True,
            "namespaceOverride": "gpu-system",
        },
        crds=False,
    )
    args = _one(objs, "Deployment", "vgpu-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert [a for a in args if a.startswith("--defrag")] == [
        "--defrag",
        "--defrag-interval=30",
        "--defrag-max-evictions=2",
        "--defrag-step-timeout=120",
        "--defrag-allow-bare-pods",
        "--defrag-owner-kind=Trainer",
        "--defrag-owner-kind=example.com/Notebook",
    ]
    readers = {(kind, ns) for (_, kind, ns, name) in objs if name == "vgpu-operator-defrag-plan"}
    assert readers == {("ClusterRole", None), ("Role", "gpu-system"), ("Role", "vgpu-node-leases")}


def test_autoscaling_is_optional_and_its_values_become_the_operators_flags(helm: Path) -> None:
    defaults = render(helm, crds=False)
    container = _one(defaults, "Deployment", "vgpu-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert not [a for a in container["args"] if "autoscale" in a]
    assert not [k for k in defaults if k[3] == "vgpu-autoscale-instance-types"]
    objs = render(
        helm,
        {
            "scheduler.autoscale.enabled": True,
            "scheduler.autoscale.interval": 2,
            "scheduler.autoscale.nodeTimeout": 300,
            "scheduler.autoscale.scaleDown.minSavingsPerHour": 5,
        },
        crds=False,
    )
    spec = _one(objs, "Deployment", "vgpu-operator")["spec"]["template"]["spec"]
    assert [a for a in spec["containers"][0]["args"] if "autoscale" in a] == [
        "--autoscale-instance-types=/etc/vgpu-autoscale/instance-types.json",
        "--autoscale-interval=2",
        "--autoscale-node-timeout=300",
        "--autoscale-scale-down-min-savings=5",
    ]
    assert {"name": "autoscale", "configMap": {"name": "vgpu-autoscale-instance-types"}} in spec[
        "volumes"
    ]
    assert [k for k in objs if k[3] == "vgpu-autoscale-instance-types"]
    kept = render(
        helm,
        {"scheduler.autoscale.enabled": True, "scheduler.autoscale.scaleDown.enabled": False},
        crds=False,
    )
    args = _one(kept, "Deployment", "vgpu-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--no-autoscale-scale-down" in args


# --- the README's helm install on a fresh API server --------------------------------------------


def readme_helm_commands() -> list[str]:
    """The helm lines of the README's install section."""
    section = README.read_text().split("## Installing in a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n(.*?)```", section, re.S)
    lines = [line.split(" #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    commands = [line for line in lines if line.startswith("helm ")]
    assert commands, "the README's install section names no helm command"
    return commands


@pytest.fixture(scope="module")
def installed(control_plane_binaries: Binaries, kubectl: Path, helm: Path) -> Iterator[Cluster]:
    """A fresh control plane on which the README's helm commands have been run."""
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as cp:
        home = cp.workdir / "helm-home"
        env = {
            **cp.env(),
            "HOME": str(home),
            "KUBECONFIG": str(cp.kubeconfig_path),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        for command in readme_helm_commands():
            _run(helm, shlex.split(command)[1:], env)
        cluster = Cluster(cp, kubectl)
        # Every object the chart renders is on the server.
        rendered = _run(helm, ["template", "vgpu-operator", str(CHART), "--include-crds"])
        listing = cp.workdir / "rendered.yaml"
        listing.write_text(rendered)
        got = cluster.run(["get", "-f", str(listing), "-o", "name"])
        assert got.returncode == 0, got.stderr
        # An upgrade with the same values changes nothing and fails nothing.
        _run(helm, ["upgrade", "vgpu-operator", str(CHART), "--reuse-values"], env)
        yield cluster


def test_the_release_is_deployed(installed: Cluster, helm: Path) -> None:
    cp = installed.cp
    env = {**cp.env(), "KUBECONFIG": str(cp.kubeconfig_path), "HOME": str(cp.workdir)}
    status = json.loads(_run(helm, ["status", "vgpu-operator", "-o", "json"], env))
    assert status["info"]["status"] == "deployed"
    assert status["version"] == 2


# The kustomize route's checks, on the helm install: the agent and the operator on their own
# tokens, what each may do (with the fixtures they need).
gpu_nodes = kustomize_route.gpu_nodes
agent_token = kustomize_route.agent_token
operator_token = kustomize_route.operator_token
test_the_agent_reports_its_own_node_on_its_own_token = (
    kustomize_route.test_the_agent_reports_its_own_node_on_its_own_token
)
test_the_agent_may_not_write_another_nodes_inventory = (
    kustomize_route.test_the_agent_may_not_write_another_nodes_inventory
)
test_the_device_plugin_settles_pods_on_its_node_and_says_why = (
    kustomize_route.test_the_device_plugin_settles_pods_on_its_node_and_says_why
)
test_the_device_plugin_may_not_touch_pods_elsewhere_or_their_spec = (
    kustomize_route.test_the_device_plugin_may_not_touch_pods_elsewhere_or_their_spec
)
test_the_operator_schedules_on_its_own_token = (
    kustomize_route.test_the_operator_schedules_on_its_own_token
)
test_the_operator_preempts_on_its_own_token = (
    kustomize_route.test_the_operator_preempts_on_its_own_token
)
