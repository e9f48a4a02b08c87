"""Every option of ``run``, ``defrag plan`` and ``simulate`` refuses a value the operator
cannot use, at the command line, with click's usage error (exit 2) naming the option and
what it allows: ``defrag plan --owner-kind a/b/c`` and ``--inventory-timeout -5`` were
accepted, as were ``nan``, ``inf`` and names no API server takes."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_operator import logging as vgpu_logging
from vgpu_operator import operator_cli
from vgpu_operator.cli import main
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.handlers import runtime

REFUSED_BY_RUN = [
    (["--defrag-owner-kind", "a/b/c"], "--defrag-owner-kind", "is not a controller kind"),
    (["--defrag-owner-kind", "Example.com/Trainer"], "--defrag-owner-kind", "group/Kind"),
    (["--defrag-owner-kind", ""], "--defrag-owner-kind", "is not a controller kind"),
    (["--inventory-timeout", "-5"], "--inventory-timeout", "at least 0"),
    (["--inventory-timeout", "nan"], "--inventory-timeout", "finite number of seconds"),
    (["--resync-interval", "0"], "--resync-interval", "above 0"),
    (["--resync-interval", "inf"], "--resync-interval", "finite"),
    (["--allocation-gate-timeout", "nan"], "--allocation-gate-timeout", "at least 1"),
    (["--defrag-interval", "inf"], "--defrag-interval", "finite"),
    (["--defrag-step-timeout", "0.5"], "--defrag-step-timeout", "at least 1"),
    (["--metrics-port", "70000"], "--metrics-port", "65535"),
    (["--metrics-port", "-2"], "--metrics-port", "-1"),
    (["--webhook-port", "0"], "--webhook-port", "65535"),
    (["--namespace", "GPU_System"], "--namespace", "not a valid namespace"),
    (["--config-map", "cfg/../x"], "--config-map", "not a valid ConfigMap name"),
    (["--config-key", "a/b"], "--config-key", "not a valid ConfigMap key"),
    (["--peering", "-x"], "--peering", "not a valid ClusterKopfPeering name"),
    (["--webhook-service", "svc.example"], "--webhook-service", "not a valid Service name"),
    (["--webhook-tls-secret", "Secret"], "--webhook-tls-secret", "not a valid Secret name"),
    (["--log-level", "LOUD"], "--log-level", "not a log level"),
]


@pytest.mark.parametrize(("args", "option", "why"), REFUSED_BY_RUN)
def test_run_refuses_a_bad_value_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, args: list[str], option: str, why: str
) -> None:
    started: list[OperatorOptions] = []
    monkeypatch.setattr(runtime, "run_forever", started.append)
    result = CliRunner().invoke(operator_cli.run, ["--standalone", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert why in result.output
    assert not started


def test_run_takes_good_values(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[OperatorOptions] = []
    monkeypatch.setattr(runtime, "run_forever", started.append)
    monkeypatch.setattr(vgpu_logging, "configure", lambda *a, **k: "json")
    args = [
        "--standalone",
        "--namespace",
        "gpu-system",
        "--config-map",
        "vgpu.device-config",
        "--config-key",
        "device_config.yaml",
        "--inventory-timeout",
        "0",
        "--resync-interval",
        "0.5",
        "--metrics-port",
        "0",
        "--log-level",
        "debug",
        "--webhook-configuration",
        "",
        "--defrag",
        "--defrag-owner-kind",
        "leaderworkerset.x-k8s.io/LeaderWorkerSet",
        "--defrag-owner-kind",
        "Trainer",
    ]
    result = CliRunner().invoke(operator_cli.run, args)
    assert result.exit_code == 0, result.output
    (options,) = started
    assert options.namespace == "gpu-system"
    assert options.log_level == "DEBUG"
    assert options.resync_interval_s == 0.5
    assert options.defrag is not None
    assert options.defrag.owner_kinds == {"leaderworkerset.x-k8s.io/LeaderWorkerSet", "Trainer"}


@pytest.mark.parametrize(
    ("args", "option", "why"),
    [
        (["--owner-kind", "a/b/c"], "--owner-kind", "is not a controller kind"),
        (["--inventory-timeout", "-5"], "--inventory-timeout", "at least 0"),
        (["--inventory-timeout", "inf"], "--inventory-timeout", "finite"),
        (["--namespace", "a b"], "--namespace", "not a valid namespace"),
        (["--config-key", ""], "--config-key", "not a valid ConfigMap key"),
    ],
)
def test_defrag_plan_refuses_a_bad_value_before_reading_the_cluster(
    args: list[str], option: str, why: str
) -> None:
    result = CliRunner().invoke(operator_cli.defrag_group, ["plan", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert why in result.output
    assert "cannot read the cluster" not in result.output


@pytest.mark.parametrize("now", ["nan", "inf", "-1", "soon"])
def test_simulate_refuses_a_time_that_is_not_one(tmp_path: Path, now: str) -> None:
    scenario = tmp_path / "s.json"
    scenario.write_text('{"nodes": [], "pods": []}')
    result = CliRunner().invoke(main, ["simulate", str(scenario), "--now", now])
    assert result.exit_code == 2, result.output
    assert "--now" in result.output
