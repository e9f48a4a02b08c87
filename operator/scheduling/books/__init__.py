"""The books: the cluster as the engine knows it. ``Books`` and its parts (nodes and
cards, the pods that hold shares and their allocations, DRA slices, claims and their
ledger, the allocation gate, holds and nominations), the one read view and the one writer
(``view``), the records they keep (``entries``, ``changes``), the ranking index, overlays
for what-ifs (``overlay``), what metrics read (``usage``), and the PodGroups' own claims
(``group_claims``).

The books import the dialects (to book what a pod holds) and never the cycle. Others use
what ``__all__`` names.
"""

from vgpu_operator.scheduling.books.allocation_gate import (
    DEFAULT_TIMEOUT_S,
    UNTIMED,
    GateHolder,
    GateMode,
    lock_holder,
)
from vgpu_operator.scheduling.books.allocation_trust import scheduler_of
from vgpu_operator.scheduling.books.books import DEFAULT_NOMINATION_TIMEOUT_S, Books
from vgpu_operator.scheduling.books.changes import ChangeLog, Freed
from vgpu_operator.scheduling.books.claim_ledger import bookings
from vgpu_operator.scheduling.books.entries import (
    DeviceUsageRow,
    NodeEntry,
    Nomination,
    PodEntry,
    is_dra_node,
)
from vgpu_operator.scheduling.books.group_claims import GroupClaims
from vgpu_operator.scheduling.books.group_victims import (
    GroupRule,
    PodGroups,
    disrupted_one_by_one,
    member_priority,
)
from vgpu_operator.scheduling.books.overlay import Overlay
from vgpu_operator.scheduling.books.usage import (
    device_usage,
    drifted_nodes,
    gate_holders,
    holding_pods,
    node_layer_problems,
    node_warnings,
    quota_usage,
    register_errors,
    stranded_memory_mib,
)
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter

__all__ = [
    "DEFAULT_NOMINATION_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "UNTIMED",
    "Books",
    "BooksView",
    "BooksWriter",
    "ChangeLog",
    "DeviceUsageRow",
    "Freed",
    "GateHolder",
    "GateMode",
    "GroupClaims",
    "GroupRule",
    "NodeEntry",
    "Nomination",
    "Overlay",
    "PodEntry",
    "PodGroups",
    "bookings",
    "device_usage",
    "disrupted_one_by_one",
    "drifted_nodes",
    "gate_holders",
    "holding_pods",
    "is_dra_node",
    "lock_holder",
    "member_priority",
    "node_layer_problems",
    "node_warnings",
    "quota_usage",
    "register_errors",
    "scheduler_of",
    "stranded_memory_mib",
]
