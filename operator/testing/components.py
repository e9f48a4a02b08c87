"""The command lines of a test control plane's processes: kube-apiserver, and the parts a
test may ask for (kube-scheduler, kube-controller-manager), with the gang scheduling API on."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from vgpu_operator.testing.kwok import SERVICE_CLUSTER_IP_RANGE
from vgpu_operator.testing.pki import Pki

# Gang scheduling's API (scheduling.k8s.io/v1beta1 PodGroup and Workload) is beta and off by
# default in 1.37: the gate goes to kube-apiserver, kube-scheduler and kube-controller-manager
# alike (a component without it ignores a pod's spec.schedulingGroup), and the group version
# must be served. DRAWorkloadResourceClaims adds a PodGroup's own ResourceClaims.
WORKLOAD_FEATURE_GATES = "GenericWorkload=true,DRAWorkloadResourceClaims=true"
WORKLOAD_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"


def apiserver_argv(
    apiserver_bin: Path,
    pki: Pki,
    *,
    etcd_url: str,
    port: int,
    workdir: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """kube-apiserver on loopback ``port``, RBAC on, its service accounts signed by ``pki``."""
    server = f"https://127.0.0.1:{port}"
    return [
        str(apiserver_bin),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_path}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={server}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        # No controller creates the default ServiceAccount or removes the not-ready taint.
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        "--profiling=false",
        # Close watches on SIGTERM instead of waiting up to a minute for them to end.
        "--shutdown-watch-termination-grace-period=2s",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        f"--runtime-config={WORKLOAD_RUNTIME_CONFIG}",
        *extra,
    ]


def scheduler_argv(binary: Path, workdir: Path, kubeconfig: str, port: int) -> list[str]:
    """kube-scheduler with the default profile and no leader election (its configuration
    written to ``workdir``), serving its health on loopback ``port``."""
    config = workdir / "kube-scheduler.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": kubeconfig},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return [
        str(binary),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        "--v=2",
    ]


def controller_manager_argv(
    binary: Path, kubeconfig: str, controllers: Sequence[str], port: int
) -> list[str]:
    """kube-controller-manager running only ``controllers``, with one set of credentials
    (no service-account token controller runs to give each its own)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        "--v=2",
    ]
