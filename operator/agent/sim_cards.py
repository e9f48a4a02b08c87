"""A machine file's cards as NVML serves them: UUIDs derived where the file leaves them
out (or per node), NVLinks attached, MIG instances placed as NVML would."""

from __future__ import annotations

import itertools
import uuid as uuid_lib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from vgpu_operator.agent import sim_mig
from vgpu_operator.agent.sim_machine import SimCard, SimGpu, SimMachine, SimMigInstance, SimNvlink
from vgpu_operator.errors import ConfigError

_T = TypeVar("_T")

#: NVML's per-card link limit (nvml.h NVML_NVLINK_MAX_LINKS).
MAX_NVLINKS_PER_GPU: Final = 36
_UUID_NAMESPACE: Final = uuid_lib.UUID("6f0c2b1e-7a4d-4c38-9a51-2f1f0d0e5a17")


@dataclass(slots=True)
class ServedCard:
    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str
    numa_node: int | None
    gpu: SimGpu
    telemetry: SimCard
    unsupported: frozenset[str]
    nvlinks: list[tuple[str, bool]] = field(default_factory=list)  # (remote bus, to switch)
    #: MIG: every GPU instance (id -> profile), and the instances with a compute
    #: instance, which are the MIG devices NVML lists. Start as the file says; the
    #: agent's MIG calls change them (until the file changes).
    gpu_instances: dict[int, str] = field(default_factory=dict)
    instances: list[SimMigInstance] = field(default_factory=list)
    #: Each GPU instance's first memory slice (``sim_mig``: NVML's placement).
    starts: dict[int, int] = field(default_factory=dict)

    def placed(self) -> list[sim_mig.Placement]:
        return [(s, sim_mig.size_of(self.gpu_instances[gi])) for gi, s in self.starts.items()]


def served_cards(machine: SimMachine, node_name: str, pinned_uuids: bool) -> list[ServedCard]:
    """The machine's cards, in NVML index order (see ``SimulatedNvml`` for the UUIDs)."""
    cards = [
        _card(index, gpu, machine, node_name, pinned_uuids)
        for index, gpu in enumerate(machine.gpus)
    ]
    _attach_nvlinks(cards, machine.nvlink)
    return cards


def _card(
    index: int, gpu: SimGpu, machine: SimMachine, node_name: str, pinned_uuids: bool
) -> ServedCard:
    defaults = machine.defaults
    memory_mib = gpu.memory_mib if gpu.memory_mib is not None else defaults.memory_mib
    telemetry = SimCard(
        memory_used_mib=_first(gpu.memory_used_mib, defaults.memory_used_mib),
        utilization=_first(gpu.utilization, defaults.utilization),
        temperature_celsius=_first(gpu.temperature_celsius, defaults.temperature_celsius),
        power_watts=_first(gpu.power_watts, defaults.power_watts),
    )
    return ServedCard(
        index=index,
        uuid=_card_uuid(index, gpu, machine, node_name, pinned_uuids),
        name=gpu.name or defaults.name or "",
        memory_mib=memory_mib or 0,
        bus_id=gpu.pci_bus_id or f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        numa_node=_first(gpu.numa_node, defaults.numa_node),
        gpu=gpu,
        telemetry=telemetry,
        unsupported=frozenset(machine.unsupported + defaults.unsupported + gpu.unsupported),
        gpu_instances={m.gpu_instance_id: m.profile for m in gpu.mig_instances},
        instances=list(gpu.mig_instances),
        starts=_starts(gpu.mig_instances),
    )


def _card_uuid(
    index: int, gpu: SimGpu, machine: SimMachine, node_name: str, pinned_uuids: bool
) -> str:
    if gpu.uuid is not None and pinned_uuids:
        return gpu.uuid
    # The pinned UUID (else the card's index) tells the cards of one machine apart.
    seed = gpu.uuid if gpu.uuid is not None else str(index)
    return _derived_uuid(node_name, machine.name, seed)


def _attach_nvlinks(cards: list[ServedCard], nvlink: SimNvlink) -> None:
    for rule in nvlink.direct:
        for a, b in itertools.permutations(rule.gpus, 2):
            cards[a].nvlinks.extend([(cards[b].bus_id, False)] * rule.links)
    for number, fabric in enumerate(nvlink.switches):
        # One address per fabric stands for its switches: what matters to the reader is
        # which cards reach the same ones. PCI domain 0xFFFF keeps it apart from the cards.
        switch_bus_id = f"0000FFFF:{number:02X}:00.0"
        for index in fabric.gpus:
            cards[index].nvlinks.extend([(switch_bus_id, True)] * fabric.links_per_gpu)
    bus_ids = [card.bus_id.lower() for card in cards]
    if len(set(bus_ids)) != len(bus_ids):
        raise ConfigError("gpus", f"PCI bus ids repeat: {bus_ids}")
    for card in cards:
        if len(card.nvlinks) > MAX_NVLINKS_PER_GPU:
            raise ConfigError(
                f"gpus[{card.index}]", f"{len(card.nvlinks)} NVLinks exceed {MAX_NVLINKS_PER_GPU}"
            )


def _starts(instances: Iterable[SimMigInstance]) -> dict[int, int]:
    """Each file instance's start: as the file says, else where NVML would place it
    beside those placed before it (``sim_mig``); one that fits nowhere is refused."""
    starts: dict[int, int] = {}
    placed: list[sim_mig.Placement] = []
    for m in instances:
        start = m.placement_start
        if start is None:
            start = sim_mig.first_start(m.profile, placed)
        if start is None or not sim_mig.fits_at(m.profile, start, placed):
            raise ConfigError(
                "migInstances", f"GPU instance {m.gpu_instance_id} ({m.profile}) fits at no start"
            )
        starts[m.gpu_instance_id] = start
        placed.append((start, sim_mig.size_of(m.profile)))
    return starts


def _derived_uuid(node_name: str, machine_name: str, seed: str) -> str:
    return "GPU-" + str(uuid_lib.uuid5(_UUID_NAMESPACE, f"{node_name}/{machine_name}/{seed}"))


def mig_uuid(gpu_uuid: str, key: int | str) -> str:
    return "MIG-" + str(uuid_lib.uuid5(_UUID_NAMESPACE, f"{gpu_uuid}/mig/{key}"))


def slices(profile: str) -> int:
    """``3g.20gb`` -> 3."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _first(*values: _T | None) -> _T | None:
    return next((v for v in values if v is not None), None)
