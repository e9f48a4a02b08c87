"""Which cards a node offers, read from its inventory or its vendors' register
annotations (``Books._register``), and the GPU count it reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpu_operator.config import NodeOverride
from vgpu_operator.devices import codec, model, plausibility
from vgpu_operator.devices.quantity import as_int
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.books.entries import NodeEntry, change_node
from vgpu_operator.scheduling.vendors import Vendors


def offered(
    node: NodeEntry, specs: Sequence[VendorSpec], override: NodeOverride | None
) -> tuple[list[model.DeviceInfo], dict[str, Mapping[str, int]], str | None]:
    """The node's cards and pair scores from its inventory, else its register annotations
    (a vendor's whose annotation cannot be read offers none: the error says why), less
    the cards the config's node override filters out."""
    error: str | None = None
    devices: list[model.DeviceInfo] = []
    scores: dict[str, Mapping[str, int]] = {}
    if node.inventory is not None:
        devices = list(node.inventory)
        scores = dict(node.inventory_scores)
    else:
        annotations = node.facts.annotations
        for spec in specs:
            raw = annotations.get(spec.register_annotation)
            if not raw:
                continue
            try:
                registered = codec.decode_node_devices(
                    raw, spec.register_annotation, spec.common_word
                )
                problems = plausibility.card_problems(registered)
                if problems:
                    raise CodecError(spec.register_annotation, "; ".join(problems[:3]))
                devices.extend(registered)
                if spec.score_annotation and annotations.get(spec.score_annotation):
                    scores.update(
                        codec.decode_pair_scores(
                            annotations[spec.score_annotation], spec.score_annotation
                        )
                    )
            except CodecError as exc:
                devices = [d for d in devices if d.vendor != spec.common_word]
                error = str(exc)
    if override is not None:
        banned_ids = set(override.filter_devices.uuid)
        banned_idx = set(override.filter_devices.index)
        devices = [d for d in devices if d.id not in banned_ids and d.index not in banned_idx]
    return devices, scores, error


def observe_gpu_count(node: NodeEntry, vendors: Vendors) -> None:
    """Seed 000 §9: GPUs that vanish from a node's allocatable make it unhealthy (the
    count resources of the vendors that ask it, ``VendorSpec.watch_lost_devices``)."""
    count = 0
    for spec in vendors.specs():
        if not spec.watch_lost_devices:
            continue
        name = vendors.config_for(spec.common_word).resource_count_name
        allocatable = node.facts.allocatable.get(name)
        count += 0 if allocatable is None else as_int(allocatable) or 0
    if count == 0:
        change_node(node, gpus_lost=node.reported_gpus > 0 or node.gpus_lost)
    else:
        change_node(node, gpus_lost=False)
    change_node(node, reported_gpus=count)
