"""The committed Grafana dashboard is what hack/dashboard.py builds with Grafana's SDK (run
`make dashboard` after changing it); test_dashboard.py evaluates its queries live."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "vgpu-operator" / "dashboards" / "vgpu-operator.json"


def _builder() -> ModuleType:
    path = ROOT / "hack" / "dashboard.py"
    spec = importlib.util.spec_from_file_location("dashboard_builder", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_dashboard_is_current() -> None:
    assert DASHBOARD.read_text() == _builder().render(), "stale: run `make dashboard`"


def test_every_panel_names_the_datasource_variable_and_only_known_variables() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "node", "namespace"}
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used)
