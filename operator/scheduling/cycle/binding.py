"""What a Binding carries for a decision on the annotation path: HAMi's annotations
(the node, the times, the bind phase, each vendor's devices to allocate and allocated,
and MIG instances as HAMi v2.10 records them)."""

from __future__ import annotations

from collections.abc import Mapping

from vgpu_operator import names
from vgpu_operator.devices import codec, mig_allocations, model
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.mig import mig_records


def hami_annotations(
    view: BooksView, node: str, outcome: placement.Outcome, now: float
) -> dict[str, str]:
    out = {
        names.ASSIGNED_NODE: node,
        names.ASSIGNED_TIME: codec.encode_vgpu_time(now),
        names.BIND_PHASE: codec.BindPhase.ALLOCATING.value,
        names.BIND_TIME: codec.encode_vgpu_time(now),
    }
    for vendor_word, single in wire_devices(view, node, outcome.devices).items():
        if not any(single):
            continue
        spec = view.vendors.spec(vendor_word)
        encoded = codec.encode_pod_single_device(single, spec.to_allocate_annotation)
        out[spec.to_allocate_annotation] = encoded
        out[spec.allocated_annotation] = encoded
        if spec.supports_mig:
            engine_form = outcome.devices[vendor_word]
            records = mig_records.records_for(engine_form, view.mig_tables_of(node))
            if records:
                out[names.MIG_ALLOCATIONS] = mig_allocations.encode(records)
    return out


def wire_devices(
    view: BooksView, node: str, devices: Mapping[str, model.PodSingleDevice]
) -> dict[str, model.PodSingleDevice]:
    """The allocation as the annotations name it (``mig_records.to_wire``): the books
    keep the engine's names of MIG instances, the Binding carries HAMi's."""
    table_of = view.mig_tables_of(node)
    return {
        v: mig_records.to_wire(single, table_of) if view.vendors.spec(v).supports_mig else single
        for v, single in devices.items()
    }
