"""The operator's metric names and label values: closed sets, so nothing from outside
becomes a label (``docs/operations.md`` lists every family)."""

from __future__ import annotations

import enum
from typing import Final

from vgpu_operator.scheduling.status import Reason

PREFIX: Final = "vgpu_operator"
MIB_BYTES: Final = 1024 * 1024
#: A card's whole compute is 100 "cores" in HAMi's units; ratios divide by this.
CORES_PER_CARD: Final = 100.0

LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Result(enum.StrEnum):
    """Outcomes of one scheduling attempt (the ``result`` label; a closed set)."""

    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    REJECTED = "rejected"  # admission rules refuse it (quota)
    BIND_CONFLICT = "bind_conflict"
    PREEMPTING = "preempting"  # evicting victims, or waiting for them to go
    GATED = "gated"  # decided; its Binding waits for the node's previous GPU pod
    ERROR = "error"


class WebhookResult(enum.StrEnum):
    """What the webhook answered (the ``result`` label; a closed set)."""

    MUTATED = "mutated"  # a GPU pod, routed to us with its defaults
    DENIED = "denied"  # refused with a message
    PASSED = "passed"  # not ours: let through unchanged
    NOT_READY = "not_ready"  # the operator had not started: let through unchanged


class PreemptionResult(enum.StrEnum):
    """How a preemption ended (the ``result`` label of ``preemption_attempts_total``)."""

    EVICTED = "evicted"  # every victim evicted (or already gone): the preemptor waits for them
    REFUSED = "refused"  # an eviction was refused (a PodDisruptionBudget): given up
    ERROR = "error"  # an API request failed: given up, tried again after the backoff


class OtherReason(enum.StrEnum):
    """``unschedulable_pods`` reasons of pods whose condition names no node reason."""

    ADMISSION_REJECTED = "AdmissionRejected"  # admission refuses the pod; its message says why
    INVALID_REQUEST = "InvalidRequest"  # a request or annotation that cannot be read
    NO_NODES = "NoNodes"  # no node was there to try
    SCHEDULING_ERROR = "SchedulingError"  # the engine failed on the pod


#: Every ``reason`` label value: the node reasons of the ``PodScheduled`` condition's
#: message (``0/3 nodes are available: 2 CardInsufficientMemory, ...``), then the others.
UNSCHEDULABLE_REASONS: Final = (*(r.value for r in Reason), *(r.value for r in OtherReason))

#: The ``operation`` label values of ``api_errors_total``, each exported from 0 (so a rate
#: over them is 0, not absent, while nothing fails). The callers name these words only.
API_OPERATIONS: Final = (
    "bind",
    "evict",
    "report",
    "pod_read",
    "resync",
    "config_watch",
    "pod_watch",
    "node_watch",
    "inventory_watch",
    "lease_watch",
    "quota_watch",
    "budget_watch",
    "webhook_tls",
    # Kueue's AdmissionCheck (--kueue-placeable-check): its watches, its status writes.
    "kueue_watch",
    "kueue_check",
)

#: kube-scheduler's buckets for its preemption_victims histogram.
VICTIM_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

#: Pod creation to Binding: seconds to minutes (pods may wait for room).
CREATE_TO_BOUND_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class DefragMove(enum.StrEnum):
    """What became of one eviction of a plan (the ``result`` label; a closed set)."""

    EVICTED = "evicted"
    REFUSED = "refused"  # a PodDisruptionBudget allowed no disruption
    GONE = "gone"  # the pod was gone before its eviction


class DefragFailure(enum.StrEnum):
    """Why a plan stopped (the ``reason`` label; a closed set)."""

    REFUSED = "refused"  # an eviction was refused
    GONE = "gone"  # a pod to move was gone before its eviction
    MISPLACED = "misplaced"  # a replacement was bound elsewhere than planned
    TIMEOUT = "timeout"  # a move, or the waiting pod's bind, took too long
    HOLD_LOST = "hold_lost"  # the hold timed out, the pod went, or leadership moved
    API_ERROR = "api_error"
