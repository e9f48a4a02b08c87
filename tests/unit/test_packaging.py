"""pyproject.toml names every folder of the package, data-only ones included: setuptools
warns at every install about a folder Python can import but ``packages`` leaves out
(``vgpu_operator.agent.machines`` did), and a later setuptools drops it from the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Folders that hold build inputs only (the gRPC stubs are generated from them and
#: checked in next to the code), neither imported nor shipped.
_NOT_SHIPPED = {"vgpu_operator.agent.deviceplugin.proto", "vgpu_operator.agent.dra.proto"}


def _setuptools() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        table: dict[str, object] = tomllib.load(file)["tool"]["setuptools"]
    return table


def _package_folders() -> set[str]:
    """Every folder under operator/ that holds files (Python sees each as a package)."""
    source = ROOT / "operator"
    found = {"vgpu_operator"}
    for folder in source.rglob("*"):
        if not folder.is_dir() or folder.name == "__pycache__":
            continue
        if any(child.is_file() for child in folder.iterdir()):
            relative = folder.relative_to(source).parts
            found.add(".".join(("vgpu_operator", *relative)))
    return found


def test_every_folder_of_the_package_is_listed() -> None:
    listed = set(_setuptools()["packages"])  # type: ignore[call-overload]
    assert _package_folders() - _NOT_SHIPPED - listed == set()


def test_the_machine_descriptions_ship_as_package_data() -> None:
    data: dict[str, list[str]] = _setuptools()["package-data"]  # type: ignore[assignment]
    assert "*.yaml" in data["vgpu_operator.agent.machines"]
