"""Finding the control-plane binaries: the bin dir, KUBEBUILDER_ASSETS, the build cache."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vgpu_operator.testing.errors import BinariesNotFoundError

BIN_DIR_ENV = "VGPU_CONTROL_PLANE_BIN_DIR"

CACHE_DIR_ENV = "VGPU_CACHE_DIR"

KUBEBUILDER_ASSETS_ENV = "KUBEBUILDER_ASSETS"


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    kwok: Path | None


def default_cache_dir() -> Path:
    """`$VGPU_CACHE_DIR` or `~/.cache/vgpu-operator`: where `make control-plane-bins` builds."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "vgpu-operator"


def _version_key(path: Path) -> tuple[int, ...]:
    # <component>-v1.37.2 -> (1, 37, 2); unparsable names sort first.
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name.rsplit("-v", 1)[-1]))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _search_dirs() -> list[tuple[str, Path, tuple[str, ...]]]:
    """(description, directory, binaries it may provide), in order of preference."""
    dirs: list[tuple[str, Path, tuple[str, ...]]] = []
    if env := os.environ.get(BIN_DIR_ENV):
        dirs.append((f"${BIN_DIR_ENV}", Path(env), ("kube-apiserver", "etcd", "kwok", *TOOLS)))
    if env := os.environ.get(KUBEBUILDER_ASSETS_ENV):
        dirs.append((f"${KUBEBUILDER_ASSETS_ENV}", Path(env), ("kube-apiserver", "etcd", "kwok")))
    return dirs


def _find_binary(name: str) -> tuple[Path | None, list[str]]:
    looked: list[str] = []
    for description, directory, provides in _search_dirs():
        if name not in provides:
            continue
        candidate = directory / name
        looked.append(f"{description}={directory}")
        if _is_executable(candidate):
            return candidate, looked
    # The build cache: <cache>/bin/<name>-<version>/<name>, newest version first.
    bin_root = default_cache_dir() / "bin"
    looked.append(f"{bin_root}/{name}-*/")
    cached = sorted(
        (p for p in bin_root.glob(f"{name}-v*/{name}") if _is_executable(p)),
        key=_version_key,
        reverse=True,
    )
    return (cached[0] if cached else None), looked


#: Test tools and optional control-plane parts built beside the control plane
#: (hack/control-plane/build.sh), and the make target that builds each.
TOOL_TARGETS: Final = {
    "kubectl": "control-plane-bins",
    "promtool": "control-plane-bins",
    "kube-scheduler": "control-plane-bins",
    "kube-controller-manager": "control-plane-bins",
    "prometheus": "observability-tools",
    "helm": "observability-tools",
    "toxiproxy": "control-plane-bench-bins",
    # Its CRDs (crd/) and webhook configurations (webhooks.yaml) lie beside the real binary.
    "kueue": "kueue",
    # Its CRDs (crd/) lie beside the real binary.
    "karpenter": "karpenter",
}
TOOLS: Final = tuple(TOOL_TARGETS)


def find_tool(name: str) -> Path:
    """One of ``TOOLS`` (kubectl, promtool, kube-scheduler, prometheus, helm, ...), or raise
    BinariesNotFoundError."""
    path, looked = _find_binary(name)
    if path is None:
        raise BinariesNotFoundError(
            f"{name} not found: looked in {', '.join(looked)}\n"
            f"Run `make {TOOL_TARGETS.get(name, 'control-plane-bins')}` (builds it once "
            "beside the control plane)."
        )
    return path


def find_binaries(*, need_kwok: bool = True) -> Binaries:
    """Locate kube-apiserver, etcd and (if ``need_kwok``) kwok, or raise BinariesNotFoundError."""
    found: dict[str, Path | None] = {}
    missing: list[str] = []
    for name in ("kube-apiserver", "etcd", "kwok"):
        path, looked = _find_binary(name)
        found[name] = path
        if path is None and (need_kwok or name != "kwok"):
            missing.append(f"  {name}: looked in {', '.join(looked)}")
    if missing:
        raise BinariesNotFoundError(
            "control-plane binaries not found:\n"
            + "\n".join(missing)
            + "\nRun `make control-plane-bins` (builds them once into "
            f"{default_cache_dir() / 'bin'}; slow the first time), or point "
            f"${BIN_DIR_ENV} or ${KUBEBUILDER_ASSETS_ENV} at a directory that has them."
        )
    apiserver, etcd = found["kube-apiserver"], found["etcd"]
    assert apiserver is not None
    assert etcd is not None
    return Binaries(kube_apiserver=apiserver, etcd=etcd, kwok=found["kwok"])
