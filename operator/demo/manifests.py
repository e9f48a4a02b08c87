"""The example manifests: found in ``examples/``, read, and applied in file order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from vgpu_operator.demo.settings import CONFIG_FILE_NAME, DemoError, Json
from vgpu_operator.testing.controlplane import (
    AdminRequestError,
    ControlPlane,
)

#: kind -> (apiVersion, plural, namespaced) for the kinds the examples may use. There is
#: no controller manager, so workload kinds (Deployments, Jobs) would never make pods.
_KINDS: Final[Mapping[str, tuple[str, str, bool]]] = {
    "Namespace": ("v1", "namespaces", False),
    "ConfigMap": ("v1", "configmaps", True),
    "ResourceQuota": ("v1", "resourcequotas", True),
    "LimitRange": ("v1", "limitranges", True),
    "Secret": ("v1", "secrets", True),
    "Pod": ("v1", "pods", True),
    "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses", False),
    "PodGroup": ("scheduling.k8s.io/v1beta1", "podgroups", True),
}


@dataclass(frozen=True, slots=True)
class Manifest:
    """One object of an example file."""

    source: Path
    body: Json

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def namespace(self) -> str:
        return str((self.body.get("metadata") or {}).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name") or "")

    def collection_path(self) -> str:
        api_version = str(self.body.get("apiVersion", ""))
        known = _KINDS.get(self.kind)
        if known is None or api_version != known[0]:
            supported = ", ".join(f"{v} {k}" for k, (v, _, _) in sorted(_KINDS.items()))
            raise DemoError(
                f"{self.source.name}: {api_version} {self.kind} is not supported by the demo "
                f"(supported: {supported})"
            )
        _, plural, namespaced = known
        root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            return f"{root}/namespaces/{self.namespace}/{plural}"
        return f"{root}/{plural}"


def default_examples_dir() -> Path:
    """The repository's ``examples/`` (found through the source of this module)."""
    return Path(__file__).resolve().parents[2] / "examples"


def load_manifests(path: Path) -> list[Manifest]:
    """Every object of a YAML file (``---`` separated), empty documents skipped."""
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise DemoError(f"cannot read {path}: {exc}") from exc
    manifests = []
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise DemoError(f"{path.name}: every document must be a Kubernetes object")
        manifests.append(Manifest(path, document))
    return manifests


def example_files(examples_dir: Path) -> tuple[Path | None, list[Path]]:
    """(the device config file if present, the other ``*.yaml`` files in name order)."""
    config = examples_dir / CONFIG_FILE_NAME
    others = sorted(
        p for p in examples_dir.glob("*.yaml") if p.name != CONFIG_FILE_NAME and p.is_file()
    )
    return (config if config.is_file() else None), others


#: The subfolder of examples played after the others, one file at a time.
PREEMPTION_DIR: Final = "preemption"


def story_files(examples_dir: Path) -> list[Path]:
    """The preemption story's ``*.yaml`` files in name order (none when absent)."""
    return sorted(p for p in (examples_dir / PREEMPTION_DIR).glob("*.yaml") if p.is_file())


def apply_manifest(cp: ControlPlane, manifest: Manifest) -> None:
    """Create the object; one that exists already is left as it is."""
    try:
        cp.create(manifest.collection_path(), manifest.body)
    except AdminRequestError as exc:
        if exc.status != 409:
            raise DemoError(
                f"{manifest.source.name}: {manifest.kind} {manifest.name}: {exc}"
            ) from None
