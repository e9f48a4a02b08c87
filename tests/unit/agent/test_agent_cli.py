"""The `agent` and `crds` commands (invoked through click, without a cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_operator import resources
from vgpu_operator.agent.cli import agent_command, crds_command


def test_crds_writes_the_rendered_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(crds_command, ["--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = tmp_path / "out" / "deviceinventories.vgpu-operator.io.yaml"
    assert written.read_text() == resources.render_crd_yaml()


def test_crds_to_stdout() -> None:
    result = CliRunner().invoke(crds_command, ["--output", "-"])
    assert result.exit_code == 0
    assert result.output == resources.render_crd_yaml()


def test_agent_needs_a_node_name() -> None:
    result = CliRunner().invoke(
        agent_command, ["--backend", "sim:h100-sxm-8"], env={"NODE_NAME": ""}
    )
    assert result.exit_code == 2
    assert "--node-name" in result.output


def test_agent_rejects_an_unknown_backend_before_connecting() -> None:
    result = CliRunner().invoke(
        agent_command, ["--node-name", "n1", "--backend", "cuda", "--metrics-port", "0"]
    )
    assert result.exit_code == 2
    assert "nvml" in result.output
    assert "sim:FILE" in result.output


def test_agent_rejects_a_missing_machine_file() -> None:
    result = CliRunner().invoke(
        agent_command,
        ["--node-name", "n1", "--backend", "sim:/no/such.yaml", "--metrics-port", "0"],
    )
    assert result.exit_code == 2
    assert "no machine file" in result.output


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--heartbeat-interval", "nan"),
        ("--heartbeat-interval", "inf"),
        ("--poll-interval", "0.01"),
        ("--device-memory-scaling", "inf"),
        ("--device-memory-scaling", "nan"),
        ("--device-core-scaling", "0"),
    ],
)
def test_agent_refuses_numbers_it_cannot_use(option: str, value: str) -> None:
    # click's FloatRange let nan and inf through: a NaN heartbeat never renews the Lease,
    # an infinite scaling reports cards of infinite memory.
    result = CliRunner().invoke(
        agent_command,
        ["--node-name", "n1", "--backend", "sim:h100-sxm-8", "--metrics-port", "0", option, value],
    )
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert "finite number" in result.output
