"""The run's options and the state its steps hand on to each other."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gpu_check.budget import Budget
from vgpu_operator import resources
from vgpu_operator.agent.backends import Backend

#: The resource the device plugin serves (kubelet's name for it).
GPU_RESOURCE: Final = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Options:
    repo_root: Path
    #: ``nvml`` (the machine's GPUs) or ``sim:NAME`` / ``sim:FILE`` (a simulated machine).
    backend: str = "nvml"
    node_name: str = "gpu-check"
    nvidia_smi: str = "nvidia-smi"
    hami_core_src: Path | None = None
    cuda_headers: Path | None = None
    budget_s: float = 540.0
    report: Path | None = None
    json_report: Path | None = None
    update_doc: Path | None = None
    #: Let the MIG check replace a card's instances (it puts them back afterwards).
    mig_reconfigure: bool = False
    #: Switch MIG mode on for the MIG check where it is off, and off again after (root).
    enable_mig: bool = False
    share_cores: int = 30
    share_memory_mib: int | None = None

    @property
    def simulated(self) -> bool:
        return self.backend.startswith("sim:")

    @property
    def state_dir(self) -> Path:
        """``.gpu-check/``: what ``make gpu-check-prepare`` fetched."""
        return self.repo_root / ".gpu-check"

    @property
    def hami_core_dir(self) -> Path:
        return self.hami_core_src or self.state_dir / "hami-core"

    @property
    def cuda_headers_dir(self) -> Path:
        return self.cuda_headers or self.state_dir / "cuda-headers"

    @property
    def versions_file(self) -> Path:
        return self.repo_root / "hack" / "gpu-check" / "versions.env"


@dataclass(frozen=True, slots=True)
class Grant:
    """What the device plugin's Allocate handed the container (through the kubelet
    stand-in), and the card it is for."""

    card_uuid: str
    card_index: int
    memory_limit_mib: int
    sm_limit: int
    envs: dict[str, str]
    #: (container path, host path, read-only)
    mounts: tuple[tuple[str, str, bool], ...]
    hook_dir: Path

    def host_path(self, container_path: str) -> Path | None:
        """Where a path inside the container lives on the host, through the mounts (the
        longest mount that contains it, as the runtime resolves them)."""
        best: tuple[str, str, bool] | None = None
        for mount in self.mounts:
            inside = mount[0].rstrip("/")
            if (container_path == inside or container_path.startswith(inside + "/")) and (
                best is None or len(inside) > len(best[0].rstrip("/"))
            ):
                best = mount
        if best is None:
            return None
        rest = container_path[len(best[0].rstrip("/")) :].lstrip("/")
        return Path(best[1]) / rest if rest else Path(best[1])


@dataclass
class Run:
    """Shared by the steps of one run, in order: each reads what an earlier one left."""

    options: Options
    budget: Budget
    work_dir: Path
    backend: Backend | None = None
    status: resources.DeviceInventoryStatus | None = None
    library: Path | None = None
    grant: Grant | None = None
    notes: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        """Progress on stderr, so a person watching sees where it is."""
        print(f"[gpu-check {self.budget.spent():5.1f}s] {message}", file=sys.stderr, flush=True)
