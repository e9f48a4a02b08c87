"""The one maker of the books' pod entries (``PodEntry``): a bound pod read into its entry
(what it shares, its allocation's devices, its MIG instances in the engine's terms:
``Books.set_pod``), and a decision's reservation or a preemptor's hold, of either dialect
(``reservation``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model
from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.books import allocation_gate, group_victims, init_release
from vgpu_operator.scheduling.books.allocation_book import Allocations
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.gate_book import GateBook
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.mig import mig, mig_records
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.timestamps import unix_time
from vgpu_operator.wire import Pod


def same_shares(old: PodEntry, new: PodEntry) -> bool:
    """Whether two entries of a pod book the same on the same node (what a node's
    cards, usage, score and summary are built from)."""
    return (
        old.node == new.node
        and old.bookings == new.bookings
        and old.requests == new.requests
        and old.devices.keys() == new.devices.keys()
    )


def share_source(pod: Pod, node: str | None, deleting: bool) -> tuple[Any, ...]:
    """Every part of a pod its entry is read from but the start time and labels: equal
    sources give equal shares, quota sums, priority and gate."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return (
        meta.get("uid"),
        node,
        deleting,
        meta.get("annotations"),
        spec.get("priority"),
        [c.get("resources") for c in spec.get("containers") or ()],
        [c.get("resources") for c in spec.get("initContainers") or ()],
        init_release.init_containers_done(pod),
    )


def with_spots(
    bookings: dict[str, list[placement.Booking]],
    spots: Mapping[str, Sequence[mig_records.Spot]],
) -> dict[str, list[placement.Booking]]:
    """A pod's bookings with its spots (MIG instances known by their slices) added to
    the booking of their card, or as a booking of their own (no memory, cores or slot:
    the device entries carry those)."""
    for vendor_word, vendor_spots in spots.items():
        held = bookings.setdefault(vendor_word, [])
        for spot in vendor_spots:
            place = (spot.start, spot.size)
            at = next((i for i, b in enumerate(held) if b.uuid == spot.card), None)
            if at is None:
                held.append(placement.Booking(spot.card, vendor_word, 0, 0, 0, (place,)))
            else:
                booking = held[at]
                held[at] = dataclasses.replace(booking, spots=(*booking.spots, place))
        if not held:
            del bookings[vendor_word]
    return bookings


def start_time(pod: Pod) -> float | None:
    return unix_time((pod.get("status") or {}).get("startTime"))


def on_mig_cards(node: NodeEntry | None, devices: model.PodDevices) -> bool:
    """Whether an allocation names a MIG card of the node (or a MIG instance)."""
    mig_cards = (
        set() if node is None else {d.id for d in node.registered if d.mode == model.MODE_MIG}
    )
    for single in devices.values():
        for container in single:
            for device in container:
                base, instance = codec.split_mig_uuid(device.uuid)
                if instance is not None or base in mig_cards:
                    return True
    return False


def read_mig(
    entries: Sequence[PodEntry], table_of: mig_records.TableOf, vendors: Vendors
) -> Iterator[
    tuple[PodEntry, dict[str, model.PodSingleDevice], dict[str, list[placement.Booking]]]
]:
    """The MIG instances of a node's pods (``entries``: those on MIG cards) in the
    engine's terms, each entry's devices and bookings: HAMi v2.10's JSON entries as
    instances of the card's table (one geometry per card where they fit one,
    ``mig_records.choose_geometries``) or as spots, and suffixes as the card's table
    reads them (``mig_records.resolve``)."""
    if not entries:
        return
    prefer = mig_records.choose_geometries((r for e in entries for r in e.mig_records), table_of)
    for entry in entries:
        devices = dict(entry.decoded)
        spots: dict[str, list[mig_records.Spot]] = {}
        for vendor_word, single in devices.items():
            if vendors.spec(vendor_word).supports_mig:
                devices[vendor_word], spots[vendor_word] = mig_records.resolve(
                    single, entry.mig_records, table_of, prefer
                )
        bookings = with_spots(placement.collapse(devices, entry.init_count, entry.init_done), spots)
        yield entry, devices, bookings


def bound_entry(
    key: PodKey,
    pod: Pod,
    node: str,
    deleting: bool,
    previous: PodEntry | None,
    source: tuple[Any, ...],
    gate: GateBook,
    allocations: Allocations,
    vendors: Vendors,
    config: DeviceConfig,
) -> PodEntry:
    """The books' entry of a pod bound to ``node``: its allocation as believed
    (``allocation_book``), less what its device plugin refused, and its hold on the
    node's allocation gate (``gate_book``)."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if previous is not None and previous.uid and previous.uid != uid:
        gate.new_pod(key)
    annotations, devices = allocations.read(key, uid, pod, vendors, config)
    if gate.answered_failed(key, annotations, any(any(s) for s in devices.values())):
        devices = {}  # its device plugin refused it: kubelet will not start it so
    holds = any(any(single) for single in devices.values())
    allocating_since = gate.since(key, uid, previous, annotations, holds, deleting)
    # Instances on MIG cards are read against the cards' tables (records and suffixes to
    # the engine's names and spots, ``Books._read_mig_records``), also when the pod has
    # no record, for a card that publishes profiles needs one for each instance.
    records = mig_records.read(annotations) if holds else ()
    init_count = len((pod.get("spec") or {}).get("initContainers") or [])
    init_done = init_release.init_containers_done(pod)
    return PodEntry(
        key=key,
        namespace=key.split("/", 1)[0],
        node=node,
        requests=node_basics.pod_requests(pod),
        devices=devices,
        bookings=placement.collapse(devices, init_count, init_done),
        priority=preemption.priority_of(pod),
        started=start_time(pod),
        labels=dict((pod.get("metadata") or {}).get("labels") or {}),
        deleting=deleting,
        in_group=bool((pod.get("spec") or {}).get("schedulingGroup")),
        group=group_victims.group_key(pod),
        uid=uid,
        mig_records=records,
        decoded=devices,
        init_count=init_count,
        init_done=init_done,
        allocating_since=allocating_since,
        source=source,
    )


def reservation(
    key: PodKey,
    job: placement.Job,
    pod: Pod,
    node: str,
    devices: Mapping[str, model.PodSingleDevice],
    *,
    binding: bool = False,
    uid: str = "",
) -> PodEntry:
    """What a decision holds on ``node`` for a pod not bound yet (either dialect): its
    placement until its Binding, or a preemptor's shares until its victims are gone.
    ``devices``: the annotation dialect's (a claims pod holds through its claims, none of
    its own); ``binding``: its Binding follows now and says bind-phase allocating, so once
    bound the node's gate is shut, timed from the Binding's answer (``confirm``), not from
    this decision. ``uid``: the pod's, which its claims name (preemption reads it once the
    pod is bound, before the bound copy comes back)."""
    held = {v: single for v, single in devices.items() if any(single)}
    return PodEntry(
        key=key,
        namespace=job.namespace,
        node=node,
        requests=job.resources,
        devices=held,
        bookings=placement.collapse(held, job.init_count),
        reserved=True,
        priority=preemption.priority_of(pod),
        labels=dict((pod.get("metadata") or {}).get("labels") or {}),
        in_group=bool((pod.get("spec") or {}).get("schedulingGroup")),
        group=group_victims.group_key(pod),
        uid=uid,
        allocating_since=allocation_gate.UNTIMED if binding and held else None,
    )


def mig_reread(
    node: NodeEntry | None, pods: Mapping[PodKey, PodEntry], vendors: Vendors
) -> list[PodEntry]:
    """The entries of the node's pods on MIG cards, their MIG instances read again in
    the engine's terms against the node's cards as they are now (``read_mig``): new
    entries, for the books to put in place of the old."""
    if node is None:
        return []
    entries = [pods[k] for k in sorted(node.pods) if k in pods]
    entries = [e for e in entries if e.mig_records or on_mig_cards(node, e.decoded)]
    return [
        dataclasses.replace(entry, devices=devices, bookings=bookings)
        for entry, devices, bookings in read_mig(entries, mig_tables(node, vendors), vendors)
    ]


def mig_tables(node: NodeEntry | None, vendors: Vendors) -> mig_records.TableOf:
    """What names the instances of each MIG card of the node, by card UUID."""
    cards = {} if node is None else {d.id: d for d in node.registered}

    def table_of(uuid: str) -> mig.MigTable | None:
        card = cards.get(uuid)
        return None if card is None else vendors.mig_table(card)

    return table_of
