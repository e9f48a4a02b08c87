"""The pod read once (issue 34): each container's request of each vendor is read once
per pod object version (``container_request``), however often the pod is retried, and
again only when the pod changes or the config does."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from builders import cluster, make_node, make_pod

from vgpu_operator.devices import vendor
from vgpu_operator.scheduling.cycle.cluster import ClusterState

Reads = Counter[tuple[str, str]]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    """Calls of ``container_request``, by (container name, vendor)."""
    counted: Reads = Counter()
    real = vendor.container_request

    def counting(spec: Any, config: Any, container: Mapping[str, Any]) -> Any:
        counted[(str(container.get("name")), spec.common_word)] += 1
        return real(spec, config, container)

    monkeypatch.setattr(vendor, "container_request", counting)
    return counted


def _vendors(state: ClusterState) -> list[str]:
    return [spec.common_word for spec in state.vendors.specs()]


def _pod(memory_mib: int) -> dict[str, Any]:
    builder = make_pod("p").init_container(gpu=1, gpumem=memory_mib)
    return builder.container(gpu=1, gpumem=memory_mib).container(gpu=1, gpumem=1024).obj()


def _containers(pod: Mapping[str, Any]) -> list[str]:
    spec = pod["spec"]
    return [c["name"] for c in (*spec.get("initContainers", ()), *spec["containers"])]


def test_each_container_and_vendor_is_read_once_per_pod_version(reads: Reads) -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=8192))
    pod = _pod(16384)  # fits nowhere: it is retried
    for now in (0.0, 1.0, 2.0):
        assert not state.schedule(pod, now).scheduled
    once = dict.fromkeys(((n, w) for n in _containers(pod) for w in _vendors(state)), 1)
    assert len(once) == 3 * len(_vendors(state))
    assert dict(reads) == once

    changed = copy.deepcopy(pod)  # a new version of the pod: read once more
    assert not state.schedule(changed, 3.0).scheduled
    assert dict(reads) == dict.fromkeys(once, 2)


def test_a_placed_pod_is_read_once_too(reads: Reads) -> None:
    state = cluster(make_node("n").gpu("GPU-0", memory_mib=8192))
    pod = _pod(2048)
    assert state.schedule(pod, 0.0).scheduled
    assert set(reads.values()) == {1}
    assert len(reads) == 3 * len(_vendors(state))
