"""Namespace device quotas: ResourceQuota limits, the usage of placed pods, and the check.

Semantics are seed 002's (hami-semantics.md §10 notes where v2.10 differs):

* only ``spec.hard`` keys ``limits.<managed resource>`` count, where the managed
  resources are each vendor's memory and core resource names; ``requests.*``, bare names
  and other resources are ignored;
* a limit of 0 means *unlimited* (v2.10 instead lets an explicit 0 block everything);
* usage is the sum of ``memory_mib``/``cores`` of every device entry of every placed pod,
  added on placement and removed (clamped at 0) on release;
* the memory limit is multiplied by the vendor's ``memoryFactor`` when that is above 1,
  because usage is booked in scaled MiB while the quota is written in the user's units.

Kubernetes enforces every ResourceQuota of a namespace, so when several set the same
resource the tightest non-zero limit applies (HAMi keeps one limit per namespace and the
last quota written wins). Each quota's limits are kept apart so that deleting one
restores the others.

The ledger is a plain value without locks: the engine calls it from one thread, and
``copy()`` gives it a cheap trial copy to place a pod on and throw away.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from vgpu_operator import errors
from vgpu_operator.devices import codec, model
from vgpu_operator.wire import ResourceQuota

#: Per vendor common word: (memory MiB, cores) a pod holds.
VendorSums = Mapping[str, tuple[int, int]]


def _sums(pod_devices: model.PodDevices) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for vendor, single in pod_devices.items():
        memory = sum(d.memory_mib for container in single for d in container)
        cores = sum(d.cores for container in single for d in container)
        out[vendor] = (memory, cores)
    return out


LIMITS_PREFIX: Final = "limits."


class QuotaReads(Protocol):
    """What a reader of the books sees of the ledger: its limits and usage, and a copy
    to write into (a trial's room). Only the books change the live ledger."""

    @property
    def managed_resources(self) -> frozenset[str]: ...
    def copy(self) -> QuotaLedger: ...
    def has_limits(self, namespace: str) -> bool: ...
    def limit(self, namespace: str, resource: str) -> int: ...
    def effective(self, namespace: str) -> dict[str, int]: ...
    def limited_namespaces(self) -> list[str]: ...
    def used(self, namespace: str, resource: str) -> int: ...
    def fits(
        self, namespace: str, vendor: str, memory_mib: int, cores: int, memory_factor: int
    ) -> bool: ...
    def namespaces(self) -> list[str]: ...
    def usage(self, namespace: str) -> dict[str, tuple[int, int]]: ...


class QuotaLedger:
    """Per-namespace device quota limits and usage for the managed resource names.

    ``memory_resources`` and ``core_resources`` map a vendor's common word to its
    resource names, e.g. ``{"NVIDIA": "nvidia.com/gpumem"}`` and
    ``{"NVIDIA": "nvidia.com/gpucores"}``.
    """

    __slots__ = ("_core_resources", "_limits", "_managed", "_memory_resources", "_used")

    def __init__(
        self, memory_resources: Mapping[str, str], core_resources: Mapping[str, str]
    ) -> None:
        self._memory_resources = dict(memory_resources)
        self._core_resources = dict(core_resources)
        self._managed = frozenset(self._memory_resources.values()) | frozenset(
            self._core_resources.values()
        )
        # namespace -> quota name -> resource name -> limit (0 = unlimited)
        self._limits: dict[str, dict[str, dict[str, int]]] = {}
        # namespace -> resource name -> amount booked by placed pods
        self._used: dict[str, dict[str, int]] = {}

    @property
    def managed_resources(self) -> frozenset[str]:
        """The resource names whose ``limits.`` entries this ledger reads."""
        return self._managed

    def copy(self) -> QuotaLedger:
        """An independent copy: changes to either do not show in the other."""
        twin = QuotaLedger.__new__(QuotaLedger)
        twin._memory_resources = self._memory_resources
        twin._core_resources = self._core_resources
        twin._managed = self._managed
        twin._limits = {
            ns: {name: dict(limits) for name, limits in quotas.items()}
            for ns, quotas in self._limits.items()
        }
        twin._used = {ns: dict(used) for ns, used in self._used.items()}
        return twin

    # --- quotas ------------------------------------------------------------------------

    def set_quota(self, rq: ResourceQuota) -> None:
        """Add or replace one ResourceQuota (a Kubernetes object as a JSON-like dict).

        Raises ``CodecError`` naming the offending path (``metadata.namespace``,
        ``spec.hard.limits.nvidia.com/gpumem``...) when the object is malformed or a
        managed limit is not a whole non-negative quantity; the ledger is then unchanged.
        """
        namespace, name = _quota_identity(rq)
        spec = rq.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise errors.CodecError("spec", f"expected a mapping, got {spec!r}")
        hard = spec.get("hard") or {}
        if not isinstance(hard, Mapping):
            raise errors.CodecError("spec.hard", f"expected a mapping, got {hard!r}")
        limits: dict[str, int] = {}
        for key, raw in hard.items():
            if not isinstance(key, str) or not key.startswith(LIMITS_PREFIX):
                continue
            resource = key.removeprefix(LIMITS_PREFIX)
            if resource not in self._managed:
                continue
            path = f"spec.hard.{key}"
            limit = codec.parse_integer_quantity(raw, path)
            if limit < 0:
                raise errors.CodecError(path, f"negative limit {limit}")
            limits[resource] = limit
        quotas = self._limits.setdefault(namespace, {})
        if limits:
            quotas[name] = limits
        else:
            quotas.pop(name, None)
            self._forget_empty(namespace)

    def remove_quota(self, namespace: str, name: str) -> None:
        """Forget one ResourceQuota; the namespace's usage is kept."""
        quotas = self._limits.get(namespace)
        if quotas is not None:
            quotas.pop(name, None)
            self._forget_empty(namespace)

    def has_limits(self, namespace: str) -> bool:
        """Whether any quota of the namespace sets a non-zero limit (else nothing is
        ever refused by quota there, and Fit need not ask per card)."""
        return any(
            amount > 0
            for limits in self._limits.get(namespace, {}).values()
            for amount in limits.values()
        )

    def limit(self, namespace: str, resource: str) -> int:
        """The effective limit: the smallest non-zero one over the namespace's quotas,
        or 0 (unlimited) when none sets a non-zero limit."""
        set_limits = [
            limits[resource]
            for limits in self._limits.get(namespace, {}).values()
            if limits.get(resource, 0) > 0
        ]
        return min(set_limits, default=0)

    def effective(self, namespace: str) -> dict[str, int]:
        """The namespace's effective non-zero limit per managed resource."""
        limits = (self.limit(namespace, resource) for resource in self._managed)
        return {r: n for r, n in zip(self._managed, limits, strict=True) if n}

    def limited_namespaces(self) -> list[str]:
        """Namespaces with a quota that names a managed resource."""
        return list(self._limits)

    # --- usage -------------------------------------------------------------------------

    def add_usage(self, namespace: str, pod_devices: model.PodDevices) -> None:
        """Book a placed pod's devices (callers pass collapsed per-card usage)."""
        self.add_sums(namespace, _sums(pod_devices))

    def remove_usage(self, namespace: str, pod_devices: model.PodDevices) -> None:
        """Release a pod's devices; usage never goes below 0."""
        self.remove_sums(namespace, _sums(pod_devices))

    def add_sums(self, namespace: str, sums: VendorSums) -> None:
        """Book what a placed pod holds, per vendor (memory MiB, cores), as the books
        keep it: no per-container detail is needed to count a quota."""
        for resource, amount in self._count(sums).items():
            if amount == 0:
                continue
            used = self._used.setdefault(namespace, {})
            used[resource] = used.get(resource, 0) + amount

    def remove_sums(self, namespace: str, sums: VendorSums) -> None:
        """Release what ``add_sums`` booked; usage never goes below 0."""
        used = self._used.get(namespace)
        if used is None:
            return
        for resource, amount in self._count(sums).items():
            remaining = used.get(resource, 0) - amount
            if remaining > 0:
                used[resource] = remaining
            else:
                used.pop(resource, None)
        self._forget_empty(namespace)

    def used(self, namespace: str, resource: str) -> int:
        """What placed pods of the namespace hold of one resource."""
        return self._used.get(namespace, {}).get(resource, 0)

    def _count(self, sums: VendorSums) -> dict[str, int]:
        totals: dict[str, int] = {}
        for vendor, (memory, cores) in sums.items():
            memory_resource = self._memory_resources.get(vendor)
            core_resource = self._core_resources.get(vendor)
            if memory_resource is not None:
                totals[memory_resource] = totals.get(memory_resource, 0) + memory
            if core_resource is not None:
                totals[core_resource] = totals.get(core_resource, 0) + cores
        return totals

    # --- the check ---------------------------------------------------------------------

    def fits(
        self, namespace: str, vendor: str, memory_mib: int, cores: int, memory_factor: int
    ) -> bool:
        """Whether ``memory_mib`` more memory and ``cores`` more cores of ``vendor`` stay
        within the namespace's quota (HAMi's ``FitQuota``).

        ``memory_mib`` is in scaled MiB, as bookings are; the memory limit is multiplied
        by ``memory_factor`` when that is above 1. A limit of 0 never blocks.
        """
        memory_resource = self._memory_resources.get(vendor)
        if memory_resource is not None:
            limit = self.limit(namespace, memory_resource)
            if memory_factor > 1:
                limit *= memory_factor
            if limit != 0 and self.used(namespace, memory_resource) + memory_mib > limit:
                return False
        core_resource = self._core_resources.get(vendor)
        if core_resource is not None:
            limit = self.limit(namespace, core_resource)
            if limit != 0 and self.used(namespace, core_resource) + cores > limit:
                return False
        return True

    # --- reporting ---------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        """Namespaces with a quota or with usage, sorted."""
        return sorted(self._limits.keys() | self._used.keys())

    def usage(self, namespace: str) -> dict[str, tuple[int, int]]:
        """Resource name -> (used, effective limit; 0 = unlimited) for every managed
        resource that the namespace uses or limits. Limits are in the user's units."""
        resources: set[str] = set(self._used.get(namespace, {}))
        for limits in self._limits.get(namespace, {}).values():
            resources.update(limits)
        return {r: (self.used(namespace, r), self.limit(namespace, r)) for r in sorted(resources)}

    def _forget_empty(self, namespace: str) -> None:
        # Keeps namespaces() and the copies small once a namespace has nothing left.
        if namespace in self._limits and not self._limits[namespace]:
            del self._limits[namespace]
        if namespace in self._used and not self._used[namespace]:
            del self._used[namespace]


def _quota_identity(rq: ResourceQuota) -> tuple[str, str]:
    metadata = rq.get("metadata")
    if not isinstance(metadata, Mapping):
        raise errors.CodecError("metadata", f"expected a mapping, got {metadata!r}")
    identity: list[str] = []
    for key in ("namespace", "name"):
        text = metadata.get(key)
        if not isinstance(text, str) or text == "":
            raise errors.CodecError(f"metadata.{key}", f"expected a name, got {text!r}")
        identity.append(text)
    return identity[0], identity[1]


__all__ = ["LIMITS_PREFIX", "QuotaLedger"]
