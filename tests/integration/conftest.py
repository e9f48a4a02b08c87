"""Fixtures for tests against a real kube-apiserver + etcd + kwok (see testing/controlplane).

Everything collected under tests/integration/ is marked ``integration``. When the binaries are
missing the tests are skipped, unless VGPU_REQUIRE_CONTROL_PLANE is set (``make test`` and CI
set it), in which case they fail with the hint to run ``make control-plane-bins``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vgpu_operator import node_leases
from vgpu_operator.testing.controlplane import (
    Binaries,
    BinariesNotFoundError,
    ControlPlane,
    find_binaries,
    find_tool,
)

REQUIRE_ENV = "VGPU_REQUIRE_CONTROL_PLANE"
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)


def control_plane_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def control_plane_binaries() -> Binaries:
    """The kube-apiserver, etcd and kwok binaries; skips (or fails if required) when missing."""
    try:
        return find_binaries(need_kwok=True)
    except BinariesNotFoundError as exc:
        problem = str(exc)
    if control_plane_required():
        pytest.fail(f"{problem}\n({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(f"{problem}\n(set {REQUIRE_ENV}=1 to fail instead of skipping)")


@pytest.fixture(scope="session")
def control_plane(control_plane_binaries: Binaries) -> Iterator[ControlPlane]:
    """A started control plane with kwok running, shared by the whole session; with the
    namespace of the node Leases, as the install creates it (manifests/namespace.yaml)."""
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as plane:
        plane.ensure_namespace(node_leases.NAMESPACE)
        yield plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A fresh namespace per test (namespaces never finish deleting without controllers)."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    control_plane.ensure_namespace(name)
    return name


@pytest.fixture
def kubeconfig_env(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point KUBECONFIG (and NO_PROXY) at the session control plane for this test."""
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig_path))
    monkeypatch.setenv("NO_PROXY", control_plane.env()["NO_PROXY"])
    return control_plane.kubeconfig_path


def _tool(name: str) -> Path:
    try:
        return find_tool(name)
    except BinariesNotFoundError as exc:
        problem = str(exc)
    if control_plane_required():
        pytest.fail(f"{problem}\n({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(f"{problem}\n(set {REQUIRE_ENV}=1 to fail instead of skipping)")


def _tool_fixture(name: str, tool: str, doc: str) -> Any:
    """The session fixture ``name``: the path of ``tool``, built beside the control plane;
    a test needing a tool that is not built is skipped, or fails where the control plane
    is required."""

    def path() -> Path:
        return _tool(tool)

    path.__doc__ = doc
    return pytest.fixture(scope="session", name=name)(path)


kubectl = _tool_fixture("kubectl", "kubectl", "kubectl, of kube-apiserver's version.")
promtool = _tool_fixture("promtool", "promtool", "promtool, for `promtool check metrics`.")
prometheus = _tool_fixture("prometheus", "prometheus", "Prometheus (`make observability-tools`).")
helm = _tool_fixture("helm", "helm", "helm (`make observability-tools`), for the chart's tests.")
kueue_binary = _tool_fixture("kueue_binary", "kueue", "Kueue, its CRDs and webhooks beside it.")
karpenter_binary = _tool_fixture("karpenter_binary", "karpenter", "Karpenter, its CRDs beside it.")
