"""Every Node annotation the engine reads, declared once.

A row says which part of the engine reads the key and whether a change to it wakes
waiting pods. Both uses derive from this table: ``node_basics.NodeFacts`` keeps only the
declared keys (a key read anywhere else is simply not there, so a new one must be
declared before it can matter), and the feed's node fingerprint, which decides whether a
Node update wakes parked pods, hashes exactly the waking keys. A declared key that can
change a verdict but does not wake leaves pods parked until something else moves them;
``tests/unit/scheduling/test_node_annotation_table.py`` fails when that happens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from vgpu_operator import names
from vgpu_operator.devices import catalog, vendor
from vgpu_operator.devices.vendor import VendorSpec


@dataclass(frozen=True, slots=True)
class NodeAnnotation:
    key: str
    #: The engine module that reads it.
    read_by: str
    #: Whether a change to it wakes pods waiting for room.
    wakes: bool
    #: What it decides, in a few words (shown in docs/architecture.md).
    decides: str


def _vendor_rows(spec: VendorSpec) -> Iterable[NodeAnnotation]:
    word = spec.common_word
    yield NodeAnnotation(
        spec.register_annotation,
        "books",
        True,
        f"the node's {word} cards when it has no DeviceInventory: cards appear or heal",
    )
    if spec.score_annotation:
        yield NodeAnnotation(
            spec.score_annotation, "books", True, f"{word} pair scores for topology-aware"
        )
    for key, what in (
        (spec.use_type_annotation, "card types the node offers"),
        (spec.nouse_type_annotation, "card types the node withholds"),
        (spec.use_uuid_annotation, "cards the node offers"),
        (spec.nouse_uuid_annotation, "cards the node withholds"),
    ):
        yield NodeAnnotation(key, "node_layer", True, f"{word} {what}: lifting it frees cards")


_COMMON_ROWS: Final = (
    NodeAnnotation(
        names.NODE_DEVICE_CORDON,
        "cordoned_cards",
        True,
        "cordoned cards: uncordoning frees them",
    ),
    NodeAnnotation(
        names.NODE_LOCK,
        "allocation_gate",
        True,
        "HAMi's node lock: its release lets the node take a GPU pod again",
    ),
    NodeAnnotation(
        names.NODE_SCHEDULER_POLICY, "node_layer", True, "binpack or spread among nodes"
    ),
    NodeAnnotation(
        names.GPU_SCHEDULER_POLICY, "node_layer", True, "binpack, spread or topology on cards"
    ),
)


def table(specs: Iterable[VendorSpec] = catalog.VENDOR_TABLE) -> tuple[NodeAnnotation, ...]:
    """The rows for a vendor table: each vendor's, then the common ones."""
    rows = [row for spec in specs for row in _vendor_rows(spec)]
    rows.extend(_COMMON_ROWS)
    return tuple(rows)


def read_keys(specs: Iterable[VendorSpec] = catalog.VENDOR_TABLE) -> frozenset[str]:
    """The keys the engine may read."""
    return frozenset(row.key for row in table(specs))


def waking_keys(specs: Iterable[VendorSpec] = catalog.VENDOR_TABLE) -> tuple[str, ...]:
    """The keys whose change wakes waiting pods, in table order."""
    return tuple(row.key for row in table(specs) if row.wakes)


def declared(annotations: Mapping[str, object], keys: frozenset[str]) -> dict[str, str]:
    """The declared keys of a Node's annotations (string values only: the API server
    stores nothing else, and a stray value must not reach a parser)."""
    return {k: v for k, v in annotations.items() if k in keys and isinstance(v, str)}


def cordoned_cards(
    annotations: Mapping[str, str], inventory: frozenset[str] = frozenset()
) -> frozenset[str]:
    """The cards of a node no pod may take: those ``hami.io/device-cordon`` names (read
    here, and nowhere else) and those its DeviceInventory cordons (``inventory``)."""
    marked = annotations.get(names.NODE_DEVICE_CORDON)
    if not marked:
        return inventory
    return inventory | frozenset(vendor.split_list(marked))
