"""The books' DRA inputs: ResourceSlices, ResourceClaims and DeviceClasses.

``ClaimBooks`` is the part of ``books.Books`` that the DRA path adds: the slices
(a DRA node's cards, ``dra_pool``), the claims (what each allocated claim holds,
``claim_ledger``, counted in the namespace quota too) and the device classes (their
selectors), with the holds of the engine's own decisions until their claims come back
allocated. ``Books`` holds it and answers its ``Hooks``: a node's cards changed, what
claims hold on a node changed, the cards registered on a node, and the quota ledger; and
it tells it of pods (``pod_seen``, ``pod_gone``).

The pods matter for one thing here: a claim that goes while a pod it was reserved for
runs (a tenant removed the delete-protection finalizer and deleted it; an allocation
stripped under a pod) keeps its hold, under ``claim_ledger.kept_key``, until every such
pod has ended. Kubelet does not take a prepared device from a running container, so
releasing the share would let a second claim onto a card that is still in use, and the
namespace's quota fall below what it holds. Only bound pods keep a hold: a pod that was
never bound cannot have the device prepared once its claim is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from vgpu_operator import names
from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.books import claim_ledger, group_claims, group_victims
from vgpu_operator.scheduling.books.claim_ledger import Decided, Hold
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, claims, dra_pool
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.quota import QuotaLedger
from vgpu_operator.wire import DeviceClass, Pod, ResourceClaim, ResourceSlice


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the claim part asks of the books that hold it."""

    #: The node's devices changed (re-register its cards).
    cards_changed: Callable[[str], None]
    #: What claims hold on the node changed (rebuild its usage).
    holds_changed: Callable[[str], None]
    registered_on: Callable[[str], Sequence[model.DeviceInfo]]
    quota_ledger: Callable[[], QuotaLedger]


class ClaimBooks:
    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._slice_objects: dict[str, ResourceSlice] = {}
        self._pools: dict[str, dra_pool.Pool] = {}
        #: Per node, its MIG placements and counters (``claim_mig``).
        self._migs: dict[str, claim_mig.MigNode] = {}
        self._claim_objects: dict[str, ResourceClaim] = {}
        self._classes: dict[str, claims.DeviceClass] = {}
        self._cel = claim_cel.SelectorCache()
        self._claim_ledger = claim_ledger.ClaimLedger()
        #: Per claim hold, the namespace and the quota sums it added.
        self._claim_sums: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {}
        #: Bound pods that have not ended (uid -> key), and each one's uid by key.
        self._running: dict[str, PodKey] = {}
        self._running_uid: dict[PodKey, str] = {}
        #: The PodGroup of each running member (a group claim is kept while one runs).
        self._running_groups: dict[str, str] = {}
        #: Holds kept after their claim went (kept key -> the running pods keeping it).
        self._kept: dict[str, frozenset[str]] = {}
        #: Namespaces an administrator labelled ``resource.kubernetes.io/admin-access:
        #: "true"``: the only ones whose claims' adminAccess requests are allocated.
        self.admin_namespaces: frozenset[str] = frozenset()

    @property
    def selector_cache(self) -> claim_cel.SelectorCache:
        """The CEL verdicts the decision reads (filled off the loop by the operator)."""
        return self._cel

    @property
    def objects(self) -> Mapping[str, ResourceClaim]:
        """Every claim as last seen, by ``namespace/name`` (read, never change)."""
        return self._claim_objects

    @property
    def classes(self) -> Mapping[str, claims.DeviceClass]:
        return self._classes

    # --- slices ------------------------------------------------------------------------
    def set_slice(self, obj: ResourceSlice) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        old = self._slice_objects.get(name)
        self._slice_objects[name] = obj
        for node in {_slice_node(old), _slice_node(obj)} - {None}:
            assert node is not None
            self._read_pool(node)

    def remove_slice(self, name: str) -> None:
        old = self._slice_objects.pop(name, None)
        node = _slice_node(old)
        if node is not None:
            self._read_pool(node)

    def _read_pool(self, node: str) -> None:
        slices = [s for s in self._slice_objects.values() if _slice_node(s) == node]
        pool = dra_pool.read_pool(node, slices)
        mig = claim_mig.read_mig_node(node, slices)
        if mig is None:
            self._migs.pop(node, None)
        else:
            self._migs[node] = mig
        if pool.devices or mig is not None:
            self._pools[node] = pool
        else:
            self._pools.pop(node, None)
        self._hooks.cards_changed(node)
        for hold in self._claim_ledger.on_node(node):
            self._put_hold(hold)  # counted against the node's cards as published now

    def pool_of(self, node: str) -> dra_pool.Pool | None:
        return self._pools.get(node)

    def mig_of(self, node: str) -> claim_mig.MigNode | None:
        return self._migs.get(node)

    def held_devices(self, node: str) -> list[str]:
        """The device of every result the node's holds name (the engine's decisions in
        flight included): what MIG counters they take (``claim_mig.ledger``)."""
        return [s.device for h in self._claim_ledger.on_node(node) for s in h.shares]

    def pool_problems(self) -> dict[str, tuple[str, ...]]:
        return {n: p.problems for n, p in self._pools.items() if p.problems}

    # --- device classes ------------------------------------------------------------------
    def set_device_class(self, obj: DeviceClass) -> None:
        device_class = claims.DeviceClass.of(obj)
        self._classes[device_class.name] = device_class

    def remove_device_class(self, name: str) -> None:
        self._classes.pop(name, None)

    # --- claims ----------------------------------------------------------------------------
    def set_claim(self, obj: ResourceClaim) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        former = self._claim_objects.get(key)
        self._claim_objects[key] = obj
        current = self._claim_ledger.holds.get(key)
        read = claim_ledger.hold_from_claim(obj)
        if read is None and current is not None and current.decided is Decided.WRITING:
            return  # our status write is in flight: this copy is older than it
        if read is None:
            # The allocation went: its pods still reserved keep the hold (the copy says
            # whom it is still reserved for; a pod unreserved with it is let go), and so
            # do the running members of a group it was reserved for (its PodGroup went).
            self._keep_or_drop(key, obj, obj, former)
        elif current is None or current.shares != read.shares or current.node != read.node:
            self._put_hold(read)
        elif current.decided is not Decided.NO:
            self._claim_ledger.put(read)  # the same shares, now read from the status

    def remove_claim(self, key: str) -> None:
        last = self._claim_objects.pop(key, None)
        # Deleted: the pods its last copy was reserved for keep the hold while they run.
        self._keep_or_drop(key, last, last)

    def _keep_or_drop(
        self,
        key: str,
        held: ResourceClaim | None,
        reserved: ResourceClaim | None,
        former: ResourceClaim | None = None,
    ) -> None:
        """The claim ``key`` no longer holds: its hold is kept, under its kept key, if a
        running pod the claim (copy ``reserved``) is reserved for uses it; else dropped.
        ``held`` is the copy the hold was read from (its uid names the kept hold)."""
        hold = self._claim_ledger.holds.get(key)
        keeping = claim_ledger.reserved_uids(reserved) & self._running.keys()
        groups = group_claims.reserved_groups(reserved) | group_claims.reserved_groups(former)
        if groups:  # a group claim: kept while a member of the group runs
            keeping |= {uid for uid, group in self._running_groups.items() if group in groups}
        if hold is None or hold.decided is Decided.WRITING or not keeping:
            self._drop_hold(key)
            return
        kept = claim_ledger.kept_key(key, held)
        self._drop_hold(key)
        self._put_hold(replace(hold, key=kept))
        self._kept[kept] = frozenset(keeping)

    # --- pods (the books tell of every pod) -------------------------------------------
    def pod_seen(self, pod: Pod) -> None:
        key = pod_key(pod)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        ended = (pod.get("status") or {}).get("phase") in names.TERMINAL_PHASES
        known = self._running_uid.get(key)
        if known is not None and (known != uid or ended or not bound):
            self.pod_gone(key)
        if uid and bound and not ended:
            self._running[uid] = key
            self._running_uid[key] = uid
            group = group_victims.group_key(pod)
            if group is not None:
                self._running_groups[uid] = group

    def pod_gone(self, key: PodKey) -> None:
        """The pod ended or is gone: the holds it alone kept go."""
        uid = self._running_uid.pop(key, None)
        if uid is None:
            return
        self._running.pop(uid, None)
        self._running_groups.pop(uid, None)
        for kept, pods in list(self._kept.items()):
            if uid not in pods:
                continue
            if pods - {uid}:
                self._kept[kept] = pods - {uid}
            else:
                del self._kept[kept]
                self._drop_hold(kept)

    def kept_holds(self) -> dict[str, frozenset[str]]:
        """Holds kept after their claims went, and the uids of the pods keeping them."""
        return dict(self._kept)

    def claim_object(self, key: str) -> ResourceClaim | None:
        return self._claim_objects.get(key)

    def over_committed(self, node: str, devices: Sequence[str]) -> list[str]:
        """Of ``devices`` on ``node``, those that the allocated claims (as the watch shows
        them, whoever wrote them) take past a capacity the slice publishes."""
        pool = self._pools.get(node)
        if pool is None:
            return []
        totals: dict[str, dict[str, Fraction]] = {}
        read = (claim_ledger.hold_from_claim(obj) for obj in self._claim_objects.values())
        kept = (self._claim_ledger.holds.get(k) for k in self._kept)
        for hold in (*read, *kept):
            if hold is None or hold.node != node:
                continue
            for share in hold.shares:
                published = pool.devices.get(share.device)
                if share.device not in devices or published is None:
                    continue
                sums = totals.setdefault(share.device, {})
                for name, amount in (
                    (dra.MEMORY, share.memory_bytes),
                    (dra.CORES, share.cores),
                    (dra.SHARES, share.shares),
                ):
                    policy = published.capacity.get(name)
                    if policy is None:
                        continue
                    # An amount the allocation does not name counts as the whole capacity.
                    taken = policy.value if amount is None else amount
                    sums[name] = sums.get(name, Fraction(0)) + taken
        return [
            device
            for device, sums in sorted(totals.items())
            if any(total > pool.devices[device].capacity[n].value for n, total in sums.items())
        ]

    def holders_on(self, node: str) -> list[tuple[Hold, frozenset[str]]]:
        """Each hold on ``node`` with the uids of the pods that keep it: those its claim
        is reserved for (or, for a kept hold, the running pods keeping it). Only when
        every one of them leaves is the hold released, so preemption frees a claim shared
        by several pods only with all of them; a hold of a decision in flight, or of a
        claim reserved for nobody, has no holders and no eviction frees it."""
        out = []
        for hold in self._claim_ledger.on_node(node):
            if hold.decided is not Decided.NO:
                out.append((hold, frozenset[str]()))
            elif hold.key in self._kept:
                out.append((hold, self._kept[hold.key]))
            else:
                out.append((hold, claim_ledger.reserved_uids(self._claim_objects.get(hold.key))))
        return out

    def reserved_for(self, uids: set[str]) -> list[str]:
        """The claims whose ``reservedFor`` names one of the pods ``uids``."""
        return [
            key
            for key, obj in self._claim_objects.items()
            if claim_ledger.reserved_uids(obj) & uids
        ]

    def holds_claim(self, key: str) -> bool:
        """Whether the claim (or kept hold) ``key`` still holds shares."""
        return key in self._claim_ledger.holds

    def decided_by_other(self, key: str, pod: str) -> Hold | None:
        """The hold of claim ``key`` that another pod's decision is allocating (its
        writes not back yet), or None: a group claim's later member uses it as it is."""
        hold = self._claim_ledger.holds.get(key)
        if hold is None or hold.decided is Decided.NO or hold.pod in ("", pod):
            return None
        return hold

    def claim_holds(self) -> dict[str, str]:
        """Claims that hold shares, and their nodes (for tests and status)."""
        return {k: h.node for k, h in self._claim_ledger.holds.items()}

    def _put_hold(self, hold: Hold) -> None:
        previous = self._claim_ledger.put(hold)
        self._unquota(hold.key)
        if previous is not None and previous.node != hold.node:
            self._hooks.holds_changed(previous.node)
        sums = self._sums(hold)
        self._claim_sums[hold.key] = (hold.namespace, sums)
        self._hooks.quota_ledger().add_sums(hold.namespace, sums)
        self._hooks.holds_changed(hold.node)

    def _drop_hold(self, key: str) -> None:
        hold = self._claim_ledger.drop(key)
        if hold is None:
            return
        self._unquota(key)
        self._hooks.holds_changed(hold.node)

    def _unquota(self, key: str) -> None:
        counted = self._claim_sums.pop(key, None)
        if counted is not None:
            self._hooks.quota_ledger().remove_sums(*counted)

    def _sums(self, hold: Hold) -> dict[str, tuple[int, int]]:
        registered = self._hooks.registered_on(hold.node)
        return claim_ledger.hold_sums(hold, registered, self._migs.get(hold.node))

    def requota(self) -> None:
        """Count the claims again in a new quota ledger (the config changed)."""
        for namespace, sums in self._claim_sums.values():
            self._hooks.quota_ledger().add_sums(namespace, sums)

    def bookings_on(
        self, node: str, cards: Mapping[str, model.DeviceUsage]
    ) -> list[list[placement.Booking]]:
        return [claim_ledger.bookings(h, cards) for h in self._claim_ledger.on_node(node)]

    # --- the engine's own decisions ----------------------------------------------------
    def hold_decided(
        self, pod: str, node: str, decided: Mapping[str, tuple[str, Sequence[Any]]]
    ) -> None:
        """Hold what a decision allocates (claim key -> (namespace, picks)) until the
        claims come back allocated."""
        for key, (namespace, picks) in decided.items():
            shares = claim_ledger.decided_shares(node, picks)
            self._put_hold(Hold(key, namespace, node, shares, Decided.WRITING, pod))
        if decided:
            self._claim_ledger.decided_for[pod] = list(decided)

    def settle_decided(self, pod: str) -> None:
        """The decision's claims are written: the next copy of each is the truth (the
        copy known now, if it already shows the allocation)."""
        for key in self._claim_ledger.decided_for.pop(pod, ()):
            hold = self._claim_ledger.holds.get(key)
            if hold is None or hold.decided is not Decided.WRITING:
                continue
            obj = self._claim_objects.get(key)
            read = None if obj is None else claim_ledger.hold_from_claim(obj)
            if read is not None:
                self._put_hold(read)
            else:
                self._claim_ledger.put(
                    Hold(hold.key, hold.namespace, hold.node, hold.shares, Decided.WRITTEN)
                )

    def take_decided(self, pod: str) -> tuple[object, ...]:
        """``release_decided``, returning the holds it dropped (for ``restore_decided``)."""
        ledger = self._claim_ledger
        if pod not in ledger.decided_for:
            return ()  # no decision of its holds claims (every annotation pod)
        holds = (ledger.holds.get(k) for k in ledger.decided_for[pod])
        taken = tuple(
            h for h in holds if h is not None and h.decided is not Decided.NO and h.pod == pod
        )
        self.release_decided(pod)
        return tuple(h for h in taken if h.key not in ledger.holds)

    def restore_decided(self, pod: str, taken: Sequence[object]) -> None:
        """Put back the holds ``take_decided`` dropped (those no claim holds since)."""
        holds = [h for h in taken if isinstance(h, Hold) and h.key not in self._claim_ledger.holds]
        for hold in holds:
            self._put_hold(hold)
        if holds:
            self._claim_ledger.decided_for[pod] = [h.key for h in holds]

    def release_decided(self, pod: str) -> None:
        """The decision is given up: its holds go, unless the claim came back allocated
        meanwhile (then its status holds the shares)."""
        for key in self._claim_ledger.decided_for.pop(pod, ()):
            hold = self._claim_ledger.holds.get(key)
            if hold is not None and hold.decided is not Decided.NO and hold.pod == pod:
                obj = self._claim_objects.get(key)
                read = None if obj is None else claim_ledger.hold_from_claim(obj)
                if read is not None:
                    self._put_hold(read)
                else:
                    self._drop_hold(key)


def _slice_node(obj: ResourceSlice | None) -> str | None:
    if obj is None:
        return None
    spec = obj.get("spec") or {}
    if spec.get("driver") != dra.DRIVER or not spec.get("nodeName"):
        return None
    return str(spec["nodeName"])
