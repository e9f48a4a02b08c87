"""Recorded nvidia-smi outputs (fixtures/<machine>/) for the hardware check's tests, and the
HAMi-core grant its later steps run under."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from gpu_check.budget import Budget
from gpu_check.context import Grant, Options, Run
from gpu_check.inventory_check import read_inventory
from gpu_check.smi import SmiSnapshot, parse_listing, parse_query_xml, parse_topology

from vgpu_operator import resources

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: nvidia-smi's arguments -> the file holding what it printed.
OUTPUTS = {
    ("-q", "-x"): "nvidia-smi-q-x.xml",
    ("-L",): "nvidia-smi-L.txt",
    ("topo", "-m"): "topo-m.txt",
    ("topo", "-mp"): "topo-mp.txt",
}


def text(machine: str, name: str) -> str:
    return (FIXTURES / machine / name).read_text()


def snapshot(machine: str) -> SmiSnapshot:
    """The fixture's outputs, parsed as the check parses nvidia-smi's."""
    return SmiSnapshot(
        log=parse_query_xml(text(machine, "nvidia-smi-q-x.xml")),
        listing=parse_listing(text(machine, "nvidia-smi-L.txt")),
        topology=parse_topology(text(machine, "topo-m.txt")),
        pcie_topology=parse_topology(text(machine, "topo-mp.txt")),
    )


def fake_nvidia_smi(directory: Path, machine: str) -> Path:
    """An executable that answers as nvidia-smi did on ``machine`` (and fails, as
    nvidia-smi does, for arguments it was not recorded with)."""
    script = directory / "nvidia-smi"
    table = {" ".join(args): str(FIXTURES / machine / name) for args, name in OUTPUTS.items()}
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"table = {table!r}\n"
        "path = table.get(' '.join(sys.argv[1:]))\n"
        "if path is None:\n"
        "    sys.exit(f'nvidia-smi stand-in: no recording for {sys.argv[1:]}')\n"
        "sys.stdout.write(open(path).read())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def simulated_status(backend: str, tmp_path: Path) -> resources.DeviceInventoryStatus:
    """The inventory status the check's first step builds for a simulated machine."""
    run = Run(Options(repo_root=REPO, backend=backend), Budget(60), tmp_path)
    result = read_inventory(run)
    assert run.status is not None, result.summary
    return run.status


def hamicore_grant(
    hook: Path,
    card_uuid: str,
    card_index: int,
    sm_limit: int,
    lock_dir: Path | None = None,
) -> Grant:
    """A 4096 MiB share of one card as the device plugin's Allocate hands it to a container
    (HAMi-core's variables and mounts, the hook directory on the host at ``hook``); with
    ``lock_dir``, also the node lock's mount."""
    (hook / "containers" / "uid_main").mkdir(parents=True, exist_ok=True)
    lock = () if lock_dir is None else (("/tmp/vgpulock", str(lock_dir), False),)
    return Grant(
        card_uuid=card_uuid,
        card_index=card_index,
        memory_limit_mib=4096,
        sm_limit=sm_limit,
        envs={
            "NVIDIA_VISIBLE_DEVICES": card_uuid,
            "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
            "CUDA_DEVICE_SM_LIMIT": str(sm_limit),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/uid_main.cache",
        },
        mounts=(
            ("/usr/local/vgpu", str(hook / "containers" / "uid_main"), False),
            ("/usr/local/vgpu/libvgpu.so", str(hook / "libvgpu.so"), True),
            *lock,
            ("/etc/ld.so.preload", str(hook / "ld.so.preload"), True),
        ),
        hook_dir=hook,
    )
