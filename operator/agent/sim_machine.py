"""The simulated machine file: cards, their PCIe and NVLink topology, and failures, as a
YAML or JSON file (documented in docs/agent.md), and the machines bundled with the
package (``--backend sim:NAME``)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources as package_files
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vgpu_operator.devices.links import P2PLevel
from vgpu_operator.errors import ConfigError

#: Prefix for a bundled machine in ``--backend sim:NAME``.
_BUNDLED_SUFFIXES: Final = (".yaml", ".json")


class _File(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class SimMigInstance(_File):
    """A MIG instance on a card with MIG enabled."""

    profile: str = Field(min_length=1)
    memory_mib: int = Field(alias="memoryMiB", ge=0)
    gpu_instance_id: int = Field(alias="gpuInstanceId", ge=0)
    compute_instance_id: int = Field(0, alias="computeInstanceId", ge=0)
    uuid: str | None = None
    #: Its GPU instance's first memory slice; none: placed as NVML would (``sim_mig``).
    placement_start: int | None = Field(None, alias="placementStart", ge=0, le=7)


class SimCard(_File):
    """Fields a card may set; ``defaults`` holds the same fields for every card."""

    name: str | None = None
    memory_mib: int | None = Field(None, alias="memoryMiB", ge=0)
    numa_node: int | None = Field(None, alias="numaNode", ge=0)
    memory_used_mib: int | None = Field(None, alias="memoryUsedMiB", ge=0)
    utilization: float | None = Field(None, ge=0, le=1)
    temperature_celsius: float | None = Field(None, alias="temperatureC")
    power_watts: float | None = Field(None, alias="powerW", ge=0)
    unsupported: tuple[str, ...] = ()


class SimGpu(SimCard):
    """One card. Its NVML index is its position in the list."""

    uuid: str | None = None
    pci_bus_id: str | None = Field(None, alias="pciBusId")
    mig_mode: bool | None = Field(False, alias="migMode")
    mig_instances: tuple[SimMigInstance, ...] = Field((), alias="migInstances")
    xid: tuple[int, ...] = Field((), description="Critical XIDs this card raises.")
    lost: bool = Field(False, description="The card fell off the bus.")

    @model_validator(mode="before")
    @classmethod
    def _one_xid(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("xid"), int):
            return {**data, "xid": [data["xid"]]}
        return data


class PcieRule(_File):
    """Every pair among ``gpus`` shares this PCIe ancestor (later rules win)."""

    gpus: tuple[int, ...] = Field(min_length=2)
    level: P2PLevel


class DirectNvlinks(_File):
    """Every pair among ``gpus`` is joined by ``links`` NVLinks (a bridge, a mesh)."""

    gpus: tuple[int, ...] = Field(min_length=2)
    links: int = Field(ge=1)


class NvswitchFabric(_File):
    """Cards attached to one NVSwitch fabric with ``linksPerGpu`` links each."""

    gpus: tuple[int, ...] = Field(min_length=1)
    links_per_gpu: int = Field(alias="linksPerGpu", ge=1)


class SimNvlink(_File):
    direct: tuple[DirectNvlinks, ...] = ()
    switches: tuple[NvswitchFabric, ...] = ()


class SimMachine(_File):
    """A whole machine file."""

    name: str = Field(min_length=1)
    description: str = ""
    driver_version: str | None = Field("550.90.07", alias="driverVersion")
    cuda_version: str | None = Field("12.4", alias="cudaVersion", pattern=r"^\d+\.\d+$")
    defaults: SimCard = SimCard()
    gpus: tuple[SimGpu, ...] = ()
    pcie: tuple[PcieRule, ...] = ()
    nvlink: SimNvlink = SimNvlink()
    unsupported: tuple[str, ...] = Field((), description="Calls answering NOT_SUPPORTED.")
    absent: tuple[str, ...] = Field((), description="Calls missing from the binding.")

    @model_validator(mode="after")
    def _check(self) -> SimMachine:
        count = len(self.gpus)
        rules: list[tuple[str, Sequence[int]]] = [("pcie", r.gpus) for r in self.pcie]
        rules += [("nvlink.direct", r.gpus) for r in self.nvlink.direct]
        rules += [("nvlink.switches", r.gpus) for r in self.nvlink.switches]
        for where, indices in rules:
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise ValueError(f"{where}: GPU indices {bad} are not in 0..{count - 1}")
        for index, gpu in enumerate(self.gpus):
            if (gpu.name or self.defaults.name) is None:
                raise ValueError(f"gpus[{index}]: no name here or in defaults")
            if (gpu.memory_mib if gpu.memory_mib is not None else self.defaults.memory_mib) is None:
                raise ValueError(f"gpus[{index}]: no memoryMiB here or in defaults")
        return self


def load_machine(path: Path) -> SimMachine:
    """Parse a machine file; ``ConfigError`` names the file and the bad field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), f"cannot read machine file: {exc}") from None
    try:
        return SimMachine.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path}:{where}", first["msg"]) from None


def bundled_machines() -> list[str]:
    """Names of the machines shipped with the package (``sim:NAME``)."""
    folder = package_files.files("vgpu_operator.agent") / "machines"
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in folder.iterdir()
        if entry.name.endswith(_BUNDLED_SUFFIXES)
    )


def resolve_machine_path(spec: str) -> Path:
    """A path to a machine file, or the name of a bundled machine (``h100-sxm-8``)."""
    path = Path(spec)
    if path.exists():
        return path
    folder = package_files.files("vgpu_operator.agent") / "machines"
    for suffix in _BUNDLED_SUFFIXES:
        candidate = folder / f"{spec}{suffix}"
        if candidate.is_file():
            return Path(str(candidate))
    raise ConfigError(
        "backend", f"no machine file {spec!r} (bundled: {', '.join(bundled_machines())})"
    )
