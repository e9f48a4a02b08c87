"""The vendor table: every vendor the operator knows, in one place.

Every vendor list in the project (resource names for quotas, allocation annotation keys,
node annotations worth watching, admission mutations, card preparation) is derived from
this table, and the engine receives it (``ClusterState(..., vendor_table=...)``) rather
than building its own. Adding a vendor is a ``VendorSpec`` (a module beside ``nvidia``)
and one line here; see the README's "Adding a vendor".
"""

from __future__ import annotations

from typing import Final

from vgpu_operator.devices import hygon, nvidia
from vgpu_operator.devices.vendor import VendorSpec

VENDOR_TABLE: Final[tuple[VendorSpec, ...]] = (nvidia.SPEC, hygon.SPEC)


def node_annotations(table: tuple[VendorSpec, ...] = VENDOR_TABLE) -> tuple[str, ...]:
    """The vendors' Node annotations the engine reads, in table order."""
    return tuple(key for spec in table for key in spec.node_annotations())
