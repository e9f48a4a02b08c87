"""Where the agent DaemonSet runs: GPU nodes by either of two labels (issue 14)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu_operator.scheduling.node_basics import NodeFacts, affinity_matches

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "agent-daemonset.yaml"


def _pod_spec() -> dict[str, Any]:
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc["kind"] == "DaemonSet":
            spec: dict[str, Any] = doc["spec"]["template"]["spec"]
            return spec
    raise AssertionError("no DaemonSet in the manifest")


@pytest.mark.parametrize(
    ("labels", "runs"),
    [
        pytest.param({"gpu": "on"}, True, id="seed-switch"),
        pytest.param({"nvidia.com/gpu.present": "true"}, True, id="feature-discovery"),
        pytest.param({"gpu": "on", "nvidia.com/gpu.present": "true"}, True, id="both"),
        pytest.param({"gpu": "off"}, False, id="switched-off"),
        pytest.param({"nvidia.com/gpu.present": "false"}, False, id="no-gpu"),
        pytest.param({}, False, id="unlabelled"),
    ],
)
def test_agent_runs_on_nodes_with_either_label(labels: dict[str, str], runs: bool) -> None:
    spec = _pod_spec()
    assert "nodeSelector" not in spec, "a nodeSelector would AND with the affinity terms"
    assert affinity_matches(spec, NodeFacts("n", labels=labels)) is runs
