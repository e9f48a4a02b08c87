"""charts/vgpu-operator/ holds what hack/sync-chart.py makes of manifests/ and crds/ (run
`make chart` after changing them); test_chart.py renders it and compares with kustomize."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sync_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_chart", ROOT / "hack" / "sync-chart.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_chart_follows_the_manifests() -> None:
    sync = _sync_module()
    assert sync.main(["sync-chart.py", "--check"]) == 0, "the chart is stale: run `make chart`"


def test_an_edit_whose_text_is_gone_stops_the_sync() -> None:
    """A manifest changed where the chart puts a value in: the sync names the edit to redo
    rather than render a chart without that value."""
    sync = _sync_module()
    text = (ROOT / "manifests" / "webhook.yaml").read_text()
    with pytest.raises(sync.StaleEdit, match="failurePolicy: Ignore"):
        sync.template("webhook.yaml", text.replace("failurePolicy: Ignore", "failurePolicy: Fail"))


def test_every_namespace_is_the_charts() -> None:
    sync = _sync_module()
    for path, text in sync.rendered().items():
        if path.parent.name == "templates":
            assert "namespace: vgpu-operator\n" not in text, path
            assert "serviceaccount:vgpu-operator:" not in text, path
