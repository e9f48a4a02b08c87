"""The ``run`` command's options (the operator itself is started by integration tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vgpu_operator import logging as vgpu_logging
from vgpu_operator import operator_cli
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.handlers import runtime


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(operator_cli.run, ["--help"])
    assert result.exit_code == 0
    for option in (
        "--kubeconfig",
        "--namespace",
        "--config-map",
        "--peering",
        "--standalone",
        "--metrics-port",
        "--log-format",
        "--inventory-timeout",
    ):
        assert option in result.output


def test_options_reach_the_operator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[OperatorOptions] = []
    monkeypatch.setattr(runtime, "run_forever", seen.append)
    monkeypatch.setattr(vgpu_logging, "configure", lambda *args, **kwargs: "json")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    args = [
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        "gpu-system",
        "--config-map",
        "cfg",
        "--standalone",
        "--metrics-port",
        "-1",
        "--log-format",
        "json",
        "--inventory-timeout",
        "0",
    ]
    result = CliRunner().invoke(operator_cli.run, args)
    assert result.exit_code == 0, result.output
    (options,) = seen
    assert options.kubeconfig == kubeconfig
    assert options.namespace == "gpu-system"
    assert options.config_map == "cfg"
    assert options.standalone
    assert options.metrics_port is None
    assert options.inventory_timeout_s is None
    assert options.webhook is None


def test_webhook_needs_a_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "run_forever", lambda options: None)
    result = CliRunner().invoke(operator_cli.run, ["--webhook-port", "9443"])
    assert result.exit_code != 0
    assert "--webhook-cert" in result.output


def test_self_managed_webhook_tls_needs_no_certificate_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[OperatorOptions] = []
    monkeypatch.setattr(runtime, "run_forever", seen.append)
    monkeypatch.setattr(vgpu_logging, "configure", lambda *args, **kwargs: "json")
    args = ["--webhook-port", "9443", "--webhook-tls-secret", "tls", "--namespace", "gpu"]
    result = CliRunner().invoke(operator_cli.run, args)
    assert result.exit_code == 0, result.output
    (options,) = seen
    webhook = options.webhook
    assert webhook is not None
    assert webhook.tls_secret == "tls"
    assert webhook.service == "vgpu-operator-webhook"
    assert webhook.configuration == "vgpu-operator"


def test_self_managed_tls_and_certificate_files_exclude_each_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(runtime, "run_forever", lambda options: None)
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    args = ["--webhook-port", "9443", "--webhook-tls-secret", "tls"]
    args += ["--webhook-cert", str(cert), "--webhook-key", str(cert)]
    result = CliRunner().invoke(operator_cli.run, args)
    assert result.exit_code != 0
    assert "excludes" in result.output
