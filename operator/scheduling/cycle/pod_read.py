"""The pod read once: one value per pod object version with all a decision reads of it.

A pending pod is retried with the same object until it changes (the runtime keeps the
last copy), so what the decision reads of it is read once per object and kept by the
books (``Books.keep_read``) while the pod waits: its key and priority, admission's answer
(whose container reads, each container and vendor's request read once, the Job is built
from), the Job every node is tried with, its shape (``shapes``) and, for a pod on the DRA
path, that it is one (its claims are read at each attempt: they change on their own).
A config or quota-limit change (the books' epoch) makes every read stale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra, vendor
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.cycle import shapes, verdicts
from vgpu_operator.scheduling.dialects.annotation import admission, placement
from vgpu_operator.scheduling.dialects.claims import claims, extended_claims
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.scheduling.quota import QuotaReads
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import Pod


@dataclass(slots=True)
class PodRead:
    """One pod object as admitted and parsed, valid while the object and the books'
    epoch (config and quota limits) are the same."""

    key: PodKey
    source: Pod
    epoch: int
    #: Admission's answer; None for a pod on the DRA path (admitted by the webhook's
    #: conversion, ``claim_admission``, not by this one).
    admitted: admission.AdmissionResult | None
    job: placement.Job | None
    error: str
    #: What the diagnosis judges nodes for: ``job``, or for a pod admission refuses the
    #: refused pod as parsed (None when it cannot be); and its shape (``shapes``).
    judged: placement.Job | None = None
    shape: str = ""
    priority: int = 0
    uses_claims: bool = False
    #: The verdict of its shape, held while the pod waits (the books keep them weakly).
    verdict: verdicts.Verdict | None = None
    #: A pod asking a mapped extended resource and naming no claims of its own is served
    #: on either path (``either_plugin``): its request as a device plugin's node takes it
    #: (HAMi's admission and Job on the whole pod), or why none can.
    either: bool = False
    device_plugin: placement.Job | None = None
    device_plugin_error: str = ""

    def fresh(self, pod: Pod, epoch: int, extended: Mapping[str, str]) -> bool:
        """Whether this read still stands for ``pod``: the same object and epoch, and on
        the same dialect (a DeviceClass naming an extended resource that comes or goes
        moves a pod asking it between the dialects: ``extended_claims``)."""
        if self.source is not pod or self.epoch != epoch:
            return False
        return self.uses_claims == (claims.uses_claims(pod) or extended_claims.asks(pod, extended))

    @property
    def refused(self) -> bool:
        """Admission refuses it (it waits, judged as refused, for its own change)."""
        return self.admitted is not None and self.admitted.handled and not self.admitted.allowed

    @property
    def subject(self) -> Pod:
        """The pod as the decision places it: as admission mutates it, if it does."""
        if self.admitted is not None and self.admitted.allowed:
            return self.admitted.pod
        return self.source


Admit = Callable[[Pod], admission.AdmissionResult]


class Reads(Protocol):
    """What reading a pod takes of the books (``view.BooksView`` has it)."""

    @property
    def config(self) -> DeviceConfig: ...
    @property
    def vendors(self) -> Vendors: ...
    @property
    def quota(self) -> QuotaReads: ...


def read_pod(
    key: PodKey,
    pod: Pod,
    epoch: int,
    admit: Admit,
    books: Reads,
    extended: Mapping[str, str] | None = None,
) -> PodRead:
    """Read ``pod`` (see the module docstring). ``extended``: the extended resources our
    DeviceClasses serve (``extended_claims``); a pod asking one is on the DRA path."""
    config, vendors, quota = books.config, books.vendors, books.quota
    if extended and extended_claims.asks(pod, extended):
        # The Job (CPU, memory, node checks) without the resources the claim serves.
        subject = extended_claims.without_extended(pod, extended, vendors)
        read = _read_claims_pod(key, subject, epoch, config, vendors, quota)
        read.source = pod
        if not claims.uses_claims(pod) and not _asks_other_than_hami(pod, extended, vendors):
            _read_device_plugin(read, pod, admit, books)
        return read
    if claims.uses_claims(pod):
        return _read_claims_pod(key, pod, epoch, config, vendors, quota)
    admitted = admit(pod)
    job: placement.Job | None = None
    judged: placement.Job | None = None
    error = ""
    if admitted.allowed or not admitted.handled:
        subject = admitted.pod if admitted.allowed else pod
        reads = admitted.reads if admitted.allowed else None
        try:
            job = placement.Job.from_pod(subject, config, vendors, quota, reads)
        except CodecError as exc:
            error = str(exc)
        judged = job
    else:
        subject = admitted.pod
        try:
            judged = placement.Job.from_pod(subject, config, vendors, quota, admitted.reads)
        except CodecError as exc:
            error = str(exc)
    return PodRead(
        key,
        pod,
        epoch,
        admitted,
        job,
        error,
        judged,
        shapes.shape_of(subject),
        preemption.priority_of(subject),
    )


def _read_claims_pod(
    key: PodKey,
    pod: Pod,
    epoch: int,
    config: DeviceConfig,
    vendors: Vendors,
    quota: QuotaReads,
) -> PodRead:
    job: placement.Job | None = None
    error = ""
    try:
        job = placement.Job.from_pod(pod, config, vendors, quota)
    except CodecError as exc:
        error = str(exc)
    return PodRead(
        key,
        pod,
        epoch,
        None,
        job,
        error,
        job,
        shapes.shape_of(pod),
        preemption.priority_of(pod),
        uses_claims=True,
    )


def _asks_other_than_hami(pod: Pod, extended: Mapping[str, str], vendors: Vendors) -> bool:
    """Whether the pod asks a mapped resource besides HAMi's NVIDIA count (an implicit
    ``deviceclass.resource.kubernetes.io/`` name): a device plugin serves none such, so
    the pod stays on the DRA path alone."""
    count = vendor.resource_names(vendors.config_for(dra.VENDOR)).count
    others = {name: c for name, c in extended.items() if name != count}
    return extended_claims.asks(pod, others)


def _read_device_plugin(read: PodRead, pod: Pod, admit: Admit, books: Reads) -> None:
    """The pod's mapped extended resource read as HAMi's request, for the nodes whose
    device plugin serves it (``either_plugin``). A resource HAMi's admission does not
    handle stays on the DRA path alone."""
    admitted = admit(pod)
    if not admitted.handled:
        return
    read.either = True
    if not admitted.allowed:
        read.device_plugin_error = admitted.message
        return
    try:
        read.device_plugin = placement.Job.from_pod(
            admitted.pod, books.config, books.vendors, books.quota, admitted.reads
        )
    except CodecError as exc:
        read.device_plugin_error = str(exc)
