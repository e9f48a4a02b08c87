"""Why a pod does or does not fit: reasons as values, counted, rendered only at the edge.

Device-level reasons count devices (how many cards each reason ruled out on a node);
node-level reasons rule out a whole node and count 1. The ``Diagnosis`` of a failed pod
keeps, per node, the reason counts of the check that failed there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final


class Reason(enum.StrEnum):
    """Failure reasons. Values are HAMi's wire names exactly where HAMi has one."""

    # Per-device reasons of Fit, in the order the checks run (seed 000 §6).
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    #: HAMi v2.10's name for a MIG card that has no instance the request fits in.
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    # Aggregate reasons: not one per device (see AGGREGATE_REASONS).
    NUMA_NOT_FIT = "NumaNotFit"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    # Node-level reasons (one per node).
    NODE_UNREGISTERED = "NodeUnregistered"
    NODE_UNSCHEDULABLE = "NodeUnschedulable"
    NODE_NOT_READY = "NodeNotReady"
    NODE_UNTOLERATED_TAINT = "NodeUntoleratedTaint"
    NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
    NODE_AFFINITY_MISMATCH = "NodeAffinityMismatch"
    INSUFFICIENT_CPU = "InsufficientCPU"
    INSUFFICIENT_NODE_MEMORY = "InsufficientMemory"
    TOO_MANY_PODS = "TooManyPods"
    INVENTORY_STALE = "InventoryStale"
    # The DRA path (claims placed by the engine).
    #: A device of a claim's request that its selectors, taints or capacity policy rule out.
    DEVICE_NOT_SELECTED = "DeviceNotSelected"
    #: A device a claim's request selects but one of whose NoSchedule/NoExecute taints
    #: (a sick or lost card) it does not tolerate.
    DEVICE_UNTOLERATED_TAINT = "DeviceUntoleratedTaint"
    #: A pod with claims on a node that offers no DRA devices of this driver.
    NODE_NOT_ON_DRA_PATH = "NodeNotOnDraPath"
    #: A pod asking through the annotation protocol on a node whose cards are DRA devices.
    NODE_ON_DRA_PATH = "NodeOnDraPath"
    #: A node other than the one the pod's already allocated claims are on.
    NODE_NOT_CLAIMS_NODE = "NodeNotClaimsNode"
    #: A pod with MIG-class claims on a node that publishes no MIG instance placements.
    NODE_NO_MIG_DEVICE = "NodeNoMigDevice"
    #: A mapped extended resource asked in a way no claim can say (the special claim's
    #: refusal is the diagnosis's message): a DRA node cannot serve it.
    EXTENDED_CLAIM_REFUSED = "ExtendedClaimRefused"
    #: A mapped extended resource HAMi's admission refuses as a device-plugin request:
    #: a device-plugin node cannot serve it.
    DEVICE_PLUGIN_REFUSED = "DevicePluginRequestRefused"


#: Reasons whose count is not "devices ruled out by this check".
AGGREGATE_REASONS: Final = frozenset(
    {
        Reason.NUMA_NOT_FIT,
        Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
        Reason.NODE_INSUFFICIENT_DEVICE,
    }
)

#: Reasons that no release of capacity can clear (only an inventory/config/node change).
UNRESOLVABLE_BY_RELEASE: Final = frozenset(
    {
        Reason.CARD_NOT_HEALTH,
        Reason.CARD_CORDONED,
        Reason.CARD_TYPE_MISMATCH,
        Reason.CARD_UUID_MISMATCH,
        Reason.NODE_UNREGISTERED,
        Reason.NODE_UNSCHEDULABLE,
        Reason.NODE_NOT_READY,
        Reason.NODE_UNTOLERATED_TAINT,
        Reason.NODE_SELECTOR_MISMATCH,
        Reason.NODE_AFFINITY_MISMATCH,
        Reason.INVENTORY_STALE,
        Reason.DEVICE_NOT_SELECTED,
        Reason.DEVICE_UNTOLERATED_TAINT,
        Reason.NODE_NOT_ON_DRA_PATH,
        Reason.NODE_ON_DRA_PATH,
        Reason.NODE_NOT_CLAIMS_NODE,
        Reason.NODE_NO_MIG_DEVICE,
        Reason.EXTENDED_CLAIM_REFUSED,
        Reason.DEVICE_PLUGIN_REFUSED,
    }
)


#: Each reason's place in the declaration (ties in ``main_reason`` go to the earlier).
_DECLARED: Final = {reason: place for place, reason in enumerate(Reason)}


class Code(enum.Enum):
    SUCCESS = enum.auto()
    UNSCHEDULABLE = enum.auto()
    UNSCHEDULABLE_AND_UNRESOLVABLE = enum.auto()
    ERROR = enum.auto()


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Why one node was ruled out: reason -> count (devices, or 1 for node-level).

    ``refused_by`` names, per reason, the Node annotations (the node configuration
    layer) that ruled cards out under it; reasons the pod's own annotations or the
    cards' state caused are not listed there.
    """

    reasons: Mapping[Reason, int]
    refused_by: Mapping[Reason, frozenset[str]] = field(default_factory=dict)
    #: Under UUID restrictions, the reasons the cards they allow were refused for
    #: (``fit.FitResult.allowed_reasons``): the node's real cause, which the counts hide
    #: under ``CardUuidMismatch`` (every other card) when a pinned card fails a check.
    allowed_reasons: Mapping[Reason, int] = field(default_factory=dict)

    @property
    def code(self) -> Code:
        if all(r in UNRESOLVABLE_BY_RELEASE for r in self.reasons):
            return Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return Code.UNSCHEDULABLE

    def main_reason(self) -> Reason:
        """The reason that ruled out most devices; ties go to the earlier-declared one.
        With UUID restrictions, the one among the cards they allow: a pod pinned to a
        card that lacks memory is told ``CardInsufficientMemory``, not that the node's
        other cards have the wrong UUID."""
        counts = self.allowed_reasons or self.reasons
        if len(counts) == 1:
            return next(iter(counts))
        return max(counts, key=lambda r: (counts[r], -_DECLARED[r]))

    def main_reason_text(self) -> str:
        """The main reason's name, with the Node annotations that caused it, if any:
        ``CardTypeMismatch (node annotation nvidia.com/use-gputype)``."""
        reason = self.main_reason()
        keys = self.refused_by.get(reason)
        if not keys:
            return reason.value
        return f"{reason.value} (node annotation {', '.join(sorted(keys))})"


def nodes_message(per_reason: Mapping[str, int], failed: int, total: int) -> str:
    """``0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch.`` from the
    count of nodes under each main reason (text)."""
    parts = sorted(((r, n) for r, n in per_reason.items() if n), key=lambda kv: (-kv[1], kv[0]))
    body = ", ".join(f"{n} {reason}" for reason, n in parts)
    available = total - failed
    if not body:
        return f"{available}/{total} nodes are available."
    return f"{available}/{total} nodes are available: {body}."


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """All nodes that rejected a pod, and how many nodes were considered.

    Its renderings walk every node, so each is made once per diagnosis and kept: the
    pods of one shape share one diagnosis (``verdicts``), and each of their attempts
    asks for the message, the device counts and the reasons.
    """

    node_failures: Mapping[str, NodeFailure]
    nodes_total: int
    error: str | None = field(default=None)
    _made: dict[str, object] = field(default_factory=dict, compare=False, repr=False)
    #: Sentences the message ends with (a path that cannot serve the pod at all, and why:
    #: ``either_plugin``).
    notes: tuple[str, ...] = ()

    def noted(self, notes: tuple[str, ...]) -> Diagnosis:
        """This diagnosis with ``notes`` after its message (a new object: a verdict's
        diagnosis is shared by the pods of its shape)."""
        if not notes:
            return self
        return Diagnosis(self.node_failures, self.nodes_total, self.error, {}, notes)

    def message(self) -> str:
        """kube-scheduler's form: counts *nodes* under each node's main reason.

        ``0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch.``
        """
        made = self._made.get("message")
        if made is None:
            made = self._made["message"] = self._message()
        return str(made)

    def _message(self) -> str:
        if self.error is not None:
            return self.error
        per_reason: dict[str, int] = {}
        for failure in self.node_failures.values():
            if failure.reasons:
                name = failure.main_reason_text()
                per_reason[name] = per_reason.get(name, 0) + 1
        message = nodes_message(per_reason, len(self.node_failures), self.nodes_total)
        return " ".join((message, *self.notes))

    @classmethod
    def rendered(
        cls,
        node_failures: Mapping[str, NodeFailure],
        nodes_total: int,
        *,
        message: str,
        device_counts: Mapping[str, int],
        main_reasons: tuple[str, ...],
    ) -> Diagnosis:
        """A diagnosis whose renderings its maker already has (kept tallies, ``verdicts``):
        they must be what ``message``, ``device_counts`` and ``main_reasons`` would make."""
        made: dict[str, object] = {
            "message": message,
            "device_counts": dict(sorted(device_counts.items())),
            "main_reasons": main_reasons,
        }
        return cls(node_failures, nodes_total, None, made)

    def device_counts(self) -> dict[str, int]:
        """Per reason, the devices it ruled out summed over nodes (for Events)."""
        made = self._made.get("device_counts")
        if not isinstance(made, dict):
            totals: dict[str, int] = {}
            for failure in self.node_failures.values():
                for reason, n in failure.reasons.items():
                    totals[reason.value] = totals.get(reason.value, 0) + n
            made = self._made["device_counts"] = dict(sorted(totals.items()))
        return dict(made)

    def main_reasons(self) -> tuple[str, ...]:
        """The reason codes the message names: each node's main reason, without the
        node annotations that caused it."""
        made = self._made.get("main_reasons")
        if not isinstance(made, tuple):
            named = {f.main_reason().value for f in self.node_failures.values() if f.reasons}
            made = self._made["main_reasons"] = tuple(sorted(named))
        return made

    def to_json(self) -> dict[str, dict[str, int]]:
        """``{"node-a": {"CardInsufficientMemory": 2}}`` as ``simulate`` prints it."""
        return {
            node: {reason.value: n for reason, n in sorted(f.reasons.items())}
            for node, f in sorted(self.node_failures.items())
        }
