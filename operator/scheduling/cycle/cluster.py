"""The engine's entry point: ``ClusterState``, the face of the books and the cycle.

Handlers and ``simulate`` talk to this one object. It holds the parts and passes each
call to the one that answers it: the inputs and their readers to the books
(``books.Books``, the DRA inputs to its ``claims`` part), ``admit`` and ``schedule`` to
the decision cycle (``decision.Cycle``), which reads the books through their view
(``view.BooksView``). It adds no logic of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import model
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.scheduling.books import allocation_gate, changes, usage
from vgpu_operator.scheduling.books.books import DEFAULT_NOMINATION_TIMEOUT_S, Books
from vgpu_operator.scheduling.books.entries import DeviceUsageRow
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.cycle import verdicts
from vgpu_operator.scheduling.cycle.decision import AdmissionResult, Cycle, Decision, Settings
from vgpu_operator.scheduling.dialects.annotation import admission
from vgpu_operator.scheduling.dialects.claims import dra_pool
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.policies import fragmentation
from vgpu_operator.scheduling.quota import QuotaReads
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import (
    DeviceClass,
    Node,
    Pod,
    PodDisruptionBudget,
    ResourceClaim,
    ResourceQuota,
    ResourceSlice,
)

__all__ = [
    "DEFAULT_NOMINATION_TIMEOUT_S",
    "AdmissionResult",
    "Books",
    "ClusterState",
    "Decision",
    "DeviceUsageRow",
    "NominationWait",
    "PodKey",
    "pod_key",
]


@dataclass(frozen=True, slots=True)
class NominationWait:
    """A preemptor's nomination: its node, and the victims that have not left yet (and,
    on the DRA path, their claims not released yet)."""

    pod: PodKey
    node: str
    victims: tuple[PodKey, ...]
    claims: tuple[str, ...] = ()

    @property
    def waits(self) -> bool:
        """Whether anything is left to wait for."""
        return bool(self.victims or self.claims)


class ClusterState:
    """The books plus the decision cycle: the engine's one entry point. Not thread-safe:
    callers serialise access."""

    def __init__(
        self,
        config: DeviceConfig,
        inventory_timeout_s: float | None = None,
        vendor_table: Sequence[VendorSpec] = VENDOR_TABLE,
    ) -> None:
        self.books = Books(config, inventory_timeout_s, vendor_table)
        self.settings = Settings()
        self.cycle = Cycle(self.books, self.settings)
        #: What the webhook reads, from another thread (``admission.AdmissionView``).
        self.admission_view = self._new_admission_view()

    # --- the cycle -------------------------------------------------------------------
    def admit(self, pod: Pod) -> AdmissionResult:
        return self.cycle.admit(pod)

    def schedule(self, pod: Pod, now: float, explain: bool = False) -> Decision:
        """Decide one pod (``decision.Cycle.schedule``)."""
        return self.cycle.schedule(pod, now, explain)

    def fits_now(self, verdict: verdicts.Verdict, node: str, now: float) -> bool:
        return self.cycle.fits_now(verdict, node, now)

    def quota_may_help(self, verdict: verdicts.Verdict, namespace: str) -> bool:
        return self.cycle.quota_may_help(verdict, namespace)

    def on_claims_path(self, verdict: object) -> bool:
        """Whether a queueing hint is the verdict of a pod on the DRA path (slice, claim
        and class changes may help it)."""
        return isinstance(verdict, verdicts.Verdict) and verdict.dialect is not None

    # --- settings --------------------------------------------------------------------
    @property
    def preemption_enabled(self) -> bool:
        """Whether a pod that fits nowhere may preempt (the caller must then evict)."""
        return self.settings.preemption_enabled

    @preemption_enabled.setter
    def preemption_enabled(self, value: bool) -> None:
        self.settings.preemption_enabled = value

    @property
    def use_index(self) -> bool:
        """Decide with the ranked index (False: the reference walk, for tests)."""
        return self.settings.use_index

    @use_index.setter
    def use_index(self, value: bool) -> None:
        self.settings.use_index = value

    @property
    def nomination_timeout_s(self) -> float:
        return self.settings.nomination_timeout_s

    @nomination_timeout_s.setter
    def nomination_timeout_s(self, value: float) -> None:
        self.settings.nomination_timeout_s = value

    @property
    def gate_mode(self) -> allocation_gate.GateMode:
        """At most one GPU pod per node between Binding and the plugin's answer."""
        return self.books.gate.mode

    @gate_mode.setter
    def gate_mode(self, value: allocation_gate.GateMode) -> None:
        self.books.gate.mode = value

    @property
    def gate_timeout_s(self) -> float:
        return self.books.gate.timeout_s

    @gate_timeout_s.setter
    def gate_timeout_s(self, value: float) -> None:
        self.books.gate.timeout_s = value

    # --- the books: what they read with, inputs and readers ----------------------------
    @property
    def config(self) -> DeviceConfig:
        return self.books.config

    @property
    def vendors(self) -> Vendors:
        return self.books.vendors

    @property
    def quota(self) -> QuotaReads:
        return self.books.quota

    @property
    def selector_cache(self) -> claim_cel.SelectorCache:
        return self.books.claims.selector_cache

    def set_config(self, config: DeviceConfig) -> None:
        self.books.set_config(config)
        self.admission_view = self._new_admission_view()

    def _new_admission_view(self) -> admission.AdmissionView:
        quota = self.books.quota
        limits: dict[str, Mapping[str, int]] = {
            ns: quota.effective(ns) for ns in quota.limited_namespaces()
        }
        return admission.AdmissionView(self.books.config, self.books.vendors, limits)

    def _publish_limits(self, namespace: str) -> None:
        # Replaced whole, never changed in place: the webhook's thread may be reading it.
        self.admission_view.limits[namespace] = self.books.quota.effective(namespace)

    def set_node(self, node: Node) -> None:
        self.books.set_node(node)

    def remove_node(self, name: str) -> None:
        self.books.remove_node(name)

    def set_inventory(
        self,
        node_name: str,
        devices: Sequence[model.DeviceInfo],
        pair_scores: model.PairScores,
        heartbeat: float | None,
        cordoned: Sequence[str] = (),
    ) -> None:
        self.books.set_inventory(node_name, devices, pair_scores, heartbeat, cordoned)

    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None:
        self.books.set_heartbeat(node_name, heartbeat)

    def remove_inventory(self, node_name: str) -> None:
        self.books.remove_inventory(node_name)

    def set_pod(self, pod: Pod) -> None:
        self.books.set_pod(pod)

    def remove_pod(self, key: PodKey) -> None:
        self.books.remove_pod(key)

    def allocation_error(self, key: PodKey) -> str | None:
        return self.books.allocation_error(key)

    def allocation_warning(self, key: PodKey) -> str | None:
        return self.books.allocation_warning(key)

    def set_budget(self, pdb: PodDisruptionBudget) -> None:
        self.books.set_budget(pdb)

    def remove_budget(self, namespace: str, name: str) -> None:
        self.books.remove_budget(namespace, name)

    def set_admin_namespaces(self, names: frozenset[str]) -> None:
        """The namespaces whose claims' adminAccess requests may be allocated."""
        self.books.claims.admin_namespaces = names

    def set_quota(self, quota: ResourceQuota) -> None:
        self.books.set_quota(quota)
        self._publish_limits(str((quota.get("metadata") or {}).get("namespace") or "default"))

    def remove_quota(self, namespace: str, name: str) -> None:
        self.books.remove_quota(namespace, name)
        self._publish_limits(namespace)

    def confirm(self, key: PodKey, now: float | None = None) -> None:
        self.books.confirm(key, now)

    def rollback(self, key: PodKey) -> None:
        self.books.rollback(key)

    def cancel_preemption(self, key: PodKey) -> None:
        self.books.cancel_preemption(key)

    def nominated_node(self, key: PodKey) -> str | None:
        return self.books.nominated_node(key)

    def learned_mix(self) -> dict[fragmentation.ShapeLabels, float]:
        """What the fragmentation policy has learned of the requests (for the metrics)."""
        return fragmentation.learned_shares(self.cycle.placer.mix.classes)

    def nomination_wait(self, key: PodKey) -> NominationWait | None:
        """What the pod's nomination still waits for (None: it holds none)."""
        nomination = self.books.nomination(key)
        if nomination is None:
            return None
        pods = tuple(nomination.remaining(self.books.pods))
        held = sorted(k for k in nomination.claims if self.books.claims.holds_claim(k))
        return NominationWait(key, nomination.node, pods, tuple(held))

    def take_expired_nominations(self, now: float) -> list[NominationWait]:
        """Preemptors whose hold on their node timed out (``nomination_timeout_s``) since
        the last call, looked for now too, with the victims still there: the hold is
        given up, the pods must be told and decided again."""
        self.books.expire_nominations(now)
        return [
            NominationWait(key, gone.node, tuple(gone.remaining(self.books.pods)))
            for key, gone in self.books.take_expired()
        ]

    def device_usage(self) -> list[DeviceUsageRow]:
        """Each card's booking, for metrics and the demo table."""
        return usage.device_usage(self.books)

    def stranded_memory_mib(self, pending: Iterable[Pod]) -> dict[str, int]:
        return usage.stranded_memory_mib(self.books, pending)

    def quota_usage(self) -> dict[str, dict[str, tuple[int, int]]]:
        return usage.quota_usage(self.books)

    def take_freed(self) -> list[changes.Freed]:
        return self.books.take_freed()

    def holding_pods(self) -> dict[PodKey, str]:
        return usage.holding_pods(self.books)

    def node_names(self) -> list[str]:
        return self.books.node_names()

    def register_errors(self) -> dict[str, str]:
        return usage.register_errors(self.books)

    def node_warnings(self, name: str) -> tuple[str, ...]:
        return usage.node_warnings(self.books, name)

    def node_layer_problems(self) -> dict[str, tuple[str, ...]]:
        return usage.node_layer_problems(self.books)

    def bind_gate_enabled(self) -> bool:
        return self.books.gate.enabled

    def bind_gate_open(self, node_name: str, key: PodKey, now: float) -> bool:
        return self.books.gate.open(self.books.nodes.get(node_name), key, self.books.pods, now)

    def gate_holders(self) -> dict[str, list[PodKey]]:
        return usage.gate_holders(self.books)

    def gate_holder(self, node_name: str, now: float) -> allocation_gate.GateHolder | None:
        return self.books.gate.holder(self.books.nodes.get(node_name), self.books.pods, now)

    def expired_gates(self, now: float) -> list[tuple[str, PodKey]]:
        return self.books.gate.expired(self.books.nodes, self.books.pods, now)

    def drifted_nodes(self) -> list[str]:
        """Nodes whose usage kept pod by pod differs from a rebuild (``usage``)."""
        return usage.drifted_nodes(self.books)

    def set_slice(self, obj: ResourceSlice) -> None:
        self.books.claims.set_slice(obj)

    def remove_slice(self, name: str) -> None:
        self.books.claims.remove_slice(name)

    def pool_of(self, node: str) -> dra_pool.Pool | None:
        return self.books.claims.pool_of(node)

    def pool_problems(self) -> dict[str, tuple[str, ...]]:
        return self.books.claims.pool_problems()

    def set_device_class(self, obj: DeviceClass) -> None:
        self.books.claims.set_device_class(obj)

    def remove_device_class(self, name: str) -> None:
        self.books.claims.remove_device_class(name)

    def set_claim(self, obj: ResourceClaim) -> None:
        self.books.claims.set_claim(obj)

    def remove_claim(self, key: str) -> None:
        self.books.claims.remove_claim(key)

    def kept_holds(self) -> dict[str, frozenset[str]]:
        return self.books.claims.kept_holds()

    def claim_object(self, key: str) -> ResourceClaim | None:
        return self.books.claims.claim_object(key)

    def holds_claim(self, key: str) -> bool:
        """Whether the claim ``key`` holds shares (allocated, or a decision allocating it)."""
        return self.books.claims.holds_claim(key)

    def over_committed(self, node: str, devices: Sequence[str]) -> list[str]:
        return self.books.claims.over_committed(node, devices)

    def claims_reserved_for(self, uids: set[str]) -> list[str]:
        """The claims whose ``reservedFor`` names one of the pods ``uids``."""
        return self.books.claims.reserved_for(uids)

    def claim_holds(self) -> dict[str, str]:
        return self.books.claims.claim_holds()
