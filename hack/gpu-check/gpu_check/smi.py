"""What ``nvidia-smi`` says about the machine: the reference the agent's reading is checked
against. ``nvidia-smi`` is NVIDIA's own tool over the same driver, so a difference is a
mistake in the agent's reading (or in its mapping to the inventory), not a matter of taste.

Three outputs, each parsed into plain values:

- ``nvidia-smi -q -x``: per card the UUID, name, PCI bus id, total memory, MIG mode and the
  MIG devices (GPU/compute instance ids and memory);
- ``nvidia-smi -L``: the MIG devices' UUIDs and profile names, which the XML lacks;
- ``nvidia-smi topo -m`` (NVLink counts, NUMA affinity) and ``topo -mp`` (the PCIe path
  alone, also for pairs joined by NVLink), which the XML lacks too.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

_T = TypeVar("_T")

#: ``nvidia-smi topo`` names of the PCIe path between two cards.
TOPO_PCIE: Final = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
_NVLINK_CELL: Final = re.compile(r"^NV(\d+)$")
_MIB: Final = re.compile(r"^\s*(\d+)\s*MiB\s*$")
_GPU_LINE: Final = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)\s*$")
_MIG_LINE: Final = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)\s*$")
_DEVICE_COLUMN: Final = re.compile(r"^(GPU|NIC|NVME|CX)\d+$")


class SmiParseError(ValueError):
    """Output that is not what the parser expects; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class SmiMigDevice:
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_mib: int | None


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One card in ``nvidia-smi -q -x``, in its order there (NVML's index order)."""

    position: int
    uuid: str
    name: str
    pci_bus_id: str | None
    memory_total_mib: int | None
    #: ``Enabled`` -> True, ``Disabled`` -> False, ``N/A`` (no MIG on this card) -> None.
    mig_enabled: bool | None
    mig_devices: tuple[SmiMigDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[SmiGpu, ...]


@dataclass(frozen=True, slots=True)
class ListedMig:
    profile: str
    device_index: int
    uuid: str


@dataclass(frozen=True, slots=True)
class ListedGpu:
    """One card of ``nvidia-smi -L``."""

    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """``nvidia-smi topo -m`` (or ``-mp``): the cell of each ordered card pair, by index,
    and each card's NUMA affinity as written (``0``, ``0-1``, ``N/A``)."""

    cells: Mapping[tuple[int, int], str]
    numa_affinity: Mapping[int, str] = field(default_factory=dict)


def _text(element: ElementTree.Element | None) -> str | None:
    if element is None or element.text is None:
        return None
    value = element.text.strip()
    return None if value in ("", "N/A") else value


def _mib(text: str | None) -> int | None:
    if text is None:
        return None
    match = _MIB.match(text)
    return int(match.group(1)) if match else None


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _mig_mode(text: str | None) -> bool | None:
    if text is None:
        return None
    if text.lower() == "enabled":
        return True
    if text.lower() == "disabled":
        return False
    return None


def parse_query_xml(document: str) -> SmiLog:
    """``nvidia-smi -q -x``. Raises SmiParseError when it is not that document."""
    # The DOCTYPE names a DTD file that is not there; ElementTree ignores it.
    try:
        root = ElementTree.fromstring(document.strip())
    except ElementTree.ParseError as exc:
        raise SmiParseError(f"nvidia-smi -q -x is not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"nvidia-smi -q -x: root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus: list[SmiGpu] = []
    for position, gpu in enumerate(root.findall("gpu")):
        uuid = _text(gpu.find("uuid"))
        if uuid is None:
            raise SmiParseError(f"nvidia-smi -q -x: card #{position} has no <uuid>")
        mig_devices = tuple(
            SmiMigDevice(
                index=_int(_text(device.find("index"))),
                gpu_instance_id=_int(_text(device.find("gpu_instance_id"))),
                compute_instance_id=_int(_text(device.find("compute_instance_id"))),
                memory_total_mib=_mib(_text(device.find("fb_memory_usage/total"))),
            )
            for device in gpu.findall("mig_devices/mig_device")
        )
        gpus.append(
            SmiGpu(
                position=position,
                uuid=uuid,
                name=_text(gpu.find("product_name")) or "",
                pci_bus_id=_text(gpu.find("pci/pci_bus_id")) or gpu.get("id"),
                memory_total_mib=_mib(_text(gpu.find("fb_memory_usage/total"))),
                mig_enabled=_mig_mode(_text(gpu.find("mig_mode/current_mig"))),
                mig_devices=mig_devices,
            )
        )
    return SmiLog(
        driver_version=_text(root.find("driver_version")),
        cuda_version=_text(root.find("cuda_version")),
        attached_gpus=_int(_text(root.find("attached_gpus"))),
        gpus=tuple(gpus),
    )


def parse_listing(text: str) -> tuple[ListedGpu, ...]:
    """``nvidia-smi -L``: the cards and, under each, its MIG devices."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = _GPU_LINE.match(line)
        if gpu:
            gpus.append(ListedGpu(int(gpu.group(1)), gpu.group(2), gpu.group(3)))
            continue
        mig = _MIG_LINE.match(line)
        if mig and gpus:
            last = gpus[-1]
            entry = ListedMig(mig.group(1), int(mig.group(2)), mig.group(3))
            gpus[-1] = ListedGpu(last.index, last.name, last.uuid, (*last.migs, entry))
            continue
        raise SmiParseError(f"nvidia-smi -L: unexpected line {line!r}")
    return tuple(gpus)


def parse_topology(text: str) -> Topology:
    """``nvidia-smi topo -m`` / ``-mp``: the matrix of GPU rows and device columns.

    The header names the device columns (``GPU0``.., ``NIC0``..) and then the affinity
    columns; rows may hold more cells than the header (an empty one before ``GPU NUMA
    ID``), so the affinity cells are taken by order among the non-empty ones.
    """
    lines = [_strip_ansi(line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.search(r"\tGPU0\b", line)), None)
    if header_at is None:
        raise SmiParseError("nvidia-smi topo: no header line naming GPU0")
    header = [cell.strip() for cell in lines[header_at].split("\t")]
    columns = [cell for cell in header[1:] if cell]
    devices = [cell for cell in columns if _DEVICE_COLUMN.match(cell)]
    affinity_names = columns[len(devices) :]
    cells: dict[tuple[int, int], str] = {}
    numa: dict[int, str] = {}
    for line in lines[header_at + 1 :]:
        row = [cell.strip() for cell in line.split("\t")]
        label = row[0] if row else ""
        if not re.match(r"^GPU\d+$", label):
            if label.startswith("Legend"):
                break
            continue
        index = int(label[3:])
        values = row[1 : 1 + len(devices)]
        if len(values) < len(devices):
            raise SmiParseError(
                f"nvidia-smi topo: row {label} has {len(values)} of {len(devices)} cells"
            )
        for column, value in zip(devices, values, strict=True):
            if column.startswith("GPU") and value != "X":
                cells[(index, int(column[3:]))] = value
        rest = [cell for cell in row[1 + len(devices) :] if cell]
        if "NUMA Affinity" in affinity_names:
            position = affinity_names.index("NUMA Affinity")
            if position < len(rest):
                numa[index] = rest[position]
    return Topology(cells=cells, numa_affinity=numa)


def _strip_ansi(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", line)


def nvlinks_of(cell: str) -> int | None:
    """``NV12`` -> 12; None for a PCIe cell."""
    match = _NVLINK_CELL.match(cell)
    return int(match.group(1)) if match else None


def numa_nodes(affinity: str | None) -> frozenset[int] | None:
    """``0`` -> {0}; ``0-1`` or ``0,2`` -> those; ``N/A`` or none -> None (unknown)."""
    if affinity is None or affinity in ("", "N/A"):
        return None
    nodes: set[int] = set()
    for part in affinity.split(","):
        low, sep, high = part.partition("-")
        try:
            nodes.update(range(int(low), int(high) + 1) if sep else {int(low)})
        except ValueError:
            return None
    return frozenset(nodes)


@dataclass(frozen=True, slots=True)
class SmiSnapshot:
    """Everything nvidia-smi said in one go; a part it could not give is None, with why
    in ``problems``."""

    log: SmiLog | None = None
    listing: tuple[ListedGpu, ...] | None = None
    topology: Topology | None = None
    pcie_topology: Topology | None = None
    problems: tuple[str, ...] = ()
    outputs: Mapping[str, str] = field(default_factory=dict)


def take_snapshot(nvidia_smi: str, timeout_s: float) -> SmiSnapshot:
    """Run the four nvidia-smi commands (each within ``timeout_s``) and parse them."""
    problems: list[str] = []
    outputs: dict[str, str] = {}

    def run(args: Sequence[str]) -> str | None:
        command = " ".join([nvidia_smi, *args])
        try:
            done = subprocess.run(
                [nvidia_smi, *args], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{command}: {exc}")
            return None
        outputs[command] = done.stdout
        if done.returncode != 0:
            problems.append(f"{command}: exit {done.returncode}: {done.stderr.strip()[:300]}")
            return None
        return done.stdout

    def parsed(args: Sequence[str], parser: Callable[[str], _T]) -> _T | None:
        text = run(args)
        if text is None:
            return None
        try:
            return parser(text)
        except SmiParseError as exc:
            problems.append(str(exc))
            return None

    return SmiSnapshot(
        log=parsed(["-q", "-x"], parse_query_xml),
        listing=parsed(["-L"], parse_listing),
        topology=parsed(["topo", "-m"], parse_topology),
        pcie_topology=parsed(["topo", "-mp"], parse_topology),
        problems=tuple(problems),
        outputs=outputs,
    )
