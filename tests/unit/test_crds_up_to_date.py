"""crds/ holds exactly what the models render (run `make crds` after changing them)."""

from __future__ import annotations

from pathlib import Path

from vgpu_operator import resources

CRDS = Path(__file__).resolve().parents[2] / "crds"


def test_committed_crd_matches_the_models() -> None:
    committed = (CRDS / resources.CRD_FILE_NAME).read_text()
    assert committed == resources.render_crd_yaml(), "crds/ is stale: run `make crds`"


def test_crd_folder_holds_only_generated_files() -> None:
    rendered = sorted(p.name for p in CRDS.iterdir() if p.name != "Kustomization")
    assert rendered == [resources.CRD_FILE_NAME]
