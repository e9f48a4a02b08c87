"""The MIG room: which instance a container gets and what a card's instances occupy
(``mig``, the annotation path), partitionable devices and their shared counters
(``mig_partitions``, the DRA path), the two records of a pod's instances (``mig_records``)
and the churn replay that compares the engine's rule with upstream's (``mig_churn``).

Floor 1 of the engine: it imports no other room. Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.mig.mig import (
    KnownGeometries,
    MigTable,
    allocate,
    attach,
    custom_filter,
    flatten,
    geometries_for,
    occupy,
    restore,
)
from vgpu_operator.scheduling.mig.mig_partitions import (
    CounterLedger,
    MigAsk,
    MigPool,
    choose,
    read_mig_pool,
)
from vgpu_operator.scheduling.mig.mig_records import (
    Spot,
    TableOf,
    choose_geometries,
    read,
    records_for,
    resolve,
    to_wire,
)

__all__ = [
    "CounterLedger",
    "KnownGeometries",
    "MigAsk",
    "MigPool",
    "MigTable",
    "Spot",
    "TableOf",
    "allocate",
    "attach",
    "choose",
    "choose_geometries",
    "custom_filter",
    "flatten",
    "geometries_for",
    "occupy",
    "read",
    "read_mig_pool",
    "records_for",
    "resolve",
    "restore",
    "to_wire",
]
