"""The PCIe root complex of a card, read from sysfs (Kubernetes' ``pcieRoot`` attribute).

``/sys/bus/pci/devices/<bus id>`` links to ``/sys/devices/pci<domain>:<bus>/...``: the
first component below ``devices`` names the root complex the card hangs off.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from vgpu_operator.dra_shapes import sysfs_bus_id

_ROOT: Final = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


def pcie_root(bus_id: str, sys_root: Path = Path("/sys")) -> str | None:
    """``pci<domain>:<bus>`` of the card's root complex, or None where sysfs does not say."""
    name = sysfs_bus_id(bus_id)
    if name is None:
        return None
    try:
        resolved = (sys_root / "bus" / "pci" / "devices" / name).resolve(strict=True)
    except OSError:
        return None
    parts = resolved.parts
    try:
        below = parts[parts.index("devices") + 1]
    except (ValueError, IndexError):
        return None
    return below if _ROOT.match(below) else None
