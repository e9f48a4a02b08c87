"""The ResourceSlice the agent's DRA driver would publish for the same reading.

Built by the driver's own code (``vgpu_operator.dra_shapes.card_shapes`` and
``vgpu_operator.devices.dra.slice_wire``) from the inventory status the first step read,
with the default device config's request defaults and the machine's sysfs for PCIe roots
(the NVML backend only; a simulated machine has none). Every card the inventory reports
in HAMi-core mode must be a device of the slice, with the same UUID, memory and NUMA node;
cards in MIG mode are left out of the slice (the driver publishes no partitionable
devices yet) and the step says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import yaml

from gpu_check.context import Run
from gpu_check.outcome import CheckResult, failed, passed, skipped
from vgpu_operator import dra_shapes as shapes
from vgpu_operator import resources
from vgpu_operator.agent.dra import sysfs
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra, nvidia

NAME: Final = "DRA: the ResourceSlice"


def _defaults() -> shapes.RequestDefaults:
    """What a claim naming no amount consumes under the default device config."""
    section = nvidia.section(DeviceConfig())
    return shapes.RequestDefaults(memory_mib=section.default_memory, cores=section.default_cores)


def _attribute(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if isinstance(value, Mapping) else None


def _mismatches(card: resources.Device, device: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    memory = ((device.get("capacity") or {}).get("memory") or {}).get("value")
    if memory != f"{card.memory_mib}Mi":  # device_wire's unit
        found.append(f"{card.uuid}: memory {memory!r} in the slice, {card.memory_mib}Mi read")
    numa = _attribute(device, dra.ATTR_NUMA_NODE)
    if card.numa_node is not None and numa != card.numa_node:
        found.append(f"{card.uuid}: NUMA node {numa!r} in the slice, {card.numa_node} read")
    return found


def resource_slice(run: Run) -> CheckResult:
    if run.status is None:
        return skipped(NAME, "no inventory reading (its check failed)")
    real_sysfs = run.options.backend == "nvml"
    cards = shapes.card_shapes(
        run.status.devices, _defaults(), sysfs.pcie_root if real_sysfs else (lambda bus_id: None)
    )
    wire = dra.slice_wire(run.options.node_name, cards, generation=1, owner=None)
    details = ["```yaml", yaml.safe_dump(wire, sort_keys=False).rstrip(), "```"]
    by_uuid = {_attribute(d, dra.ATTR_UUID): d for d in wire["spec"]["devices"]}
    problems: list[str] = []
    left_out: list[str] = []
    for card in run.status.devices:
        if card.mode is not resources.DeviceMode.HAMI_CORE:
            left_out.append(f"{card.uuid} ({card.mode.value})")
            continue
        device = by_uuid.get(card.uuid)
        if device is None:
            problems.append(f"{card.uuid}: in the inventory, in no device of the slice")
            continue
        problems.extend(_mismatches(card, device))
    if problems:
        return failed(NAME, "; ".join(problems), details)
    if not cards:
        return skipped(NAME, "no card in HAMi-core mode: the slice would be empty", details)
    note = f"; left out (not published yet): {', '.join(left_out)}" if left_out else ""
    return passed(NAME, f"{len(cards)} device(s), one per HAMi-core card{note}", details)
